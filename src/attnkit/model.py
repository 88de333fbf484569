"""Encoders + the shared decoder, the model builders of every task, and the training objective.

Legend: B batch, T target steps, L memory length, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.config import ExperimentConfig, TrainConfig
from attnkit.data.batching import Batch
from attnkit.decoder import AttentionDecoder, DecoderOutput
from attnkit.encoders.image import ImageEncoder
from attnkit.encoders.text import TextEncoder
from attnkit.errors import UserError
from attnkit.interfaces import Encoder, EncoderOutput, Source
from attnkit.supervision import supervision_loss
from attnkit.vocab import Vocabulary

MULTITASK = "multitask"  # the task name of a joint model; it captions and translates


class EncoderDecoder(nn.Module):
    """Any encoder that honours the contract in :mod:`attnkit.interfaces`, and the attention decoder."""

    def __init__(self, encoder: Encoder, decoder: AttentionDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def encoder_for(self, kind: str) -> Encoder:
        """The encoder that reads sources of ``kind`` ("text" or "image")."""
        return self.encoder

    def encode(self, source) -> EncoderOutput:
        return self.encoder(source)

    def forward(self, batch: Batch, teacher_forcing: float = 1.0) -> DecoderOutput:
        """Teacher-forced pass: logits for target[:, 1:] given target[:, :-1]."""
        return self.decoder(self.encode(batch.source), batch.target[:, :-1], teacher_forcing)


class MultiTaskModel(EncoderDecoder):
    """Several encoders, one decoder: target embeddings, attention and output layer are shared.

    The source's kind picks the encoder; from the encoder output on, a caption and a
    translation go through the very same modules.
    """

    def __init__(self, encoders: Mapping[str, nn.Module], decoder: AttentionDecoder):
        nn.Module.__init__(self)  # no single ``encoder``: the base class's init would need one
        self.encoders = nn.ModuleDict(encoders)
        self.decoder = decoder

    def encoder_for(self, kind: str) -> Encoder:
        if kind not in self.encoders:
            raise UserError(f"this model has no {kind} encoder (it has {', '.join(self.encoders)})")
        return self.encoders[kind]

    def encode(self, source: Source) -> EncoderOutput:
        return self.encoder_for(source.kind)(source)


def _decoder_for(config: ExperimentConfig, encoder: Encoder, target_vocab: Vocabulary) -> AttentionDecoder:
    return AttentionDecoder(
        config.decoder, len(target_vocab), memory_size=encoder.output_size, init_size=encoder.init_size, pad_index=target_vocab.pad_index
    )


def build_translation_model(config: ExperimentConfig, source_vocab: Vocabulary, target_vocab: Vocabulary) -> EncoderDecoder:
    encoder = TextEncoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
    return EncoderDecoder(encoder, _decoder_for(config, encoder, target_vocab))


def build_captioning_model(config: ExperimentConfig, vocab: Vocabulary, load_weights: bool = True) -> EncoderDecoder:
    """``load_weights=False`` when a checkpoint's state dict follows (it holds the backbone too)."""
    encoder = ImageEncoder(config.image_encoder, load_weights=load_weights)
    return EncoderDecoder(encoder, _decoder_for(config, encoder, vocab))


def build_multitask_model(config: ExperimentConfig, source_vocab: Vocabulary, target_vocab: Vocabulary, load_weights: bool = True) -> MultiTaskModel:
    """An image encoder and a text encoder over one decoder; both must hand it memories of one size."""
    text = TextEncoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
    image = ImageEncoder(config.image_encoder, load_weights=load_weights)
    if (image.output_size, image.init_size) != (text.output_size, text.init_size):
        raise UserError(
            f"a shared decoder needs one memory size: image_encoder.memory_size is {image.output_size} but the text "
            f"encoder gives {text.output_size} (text_encoder.hidden_size x 2 when bidirectional); make them equal"
        )
    return MultiTaskModel({"image": image, "text": text}, _decoder_for(config, text, target_vocab))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_parameters(model: nn.Module) -> str:
    """"model: N parameters (M trainable)", for the training log."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = count_parameters(model)
    return f"model: {total:,} parameters" + (f" ({trainable:,} trainable)" if trainable != total else "")


def build_model(task: str, config: ExperimentConfig, vocabularies: Mapping[str, Sequence[str]], load_weights: bool = True) -> EncoderDecoder:
    """The model of a checkpoint's ``task`` (its vocabularies as saved); ``load_weights=False`` when weights follow."""
    target = Vocabulary(vocabularies["target"])
    if task == "captioning":
        return build_captioning_model(config, target, load_weights)
    source = Vocabulary(vocabularies["source"])
    if task == "translation":
        return build_translation_model(config, source, target)
    if task == MULTITASK:
        return build_multitask_model(config, source, target, load_weights)
    raise UserError(f"unknown task '{task}'")


@dataclass(frozen=True)
class LossOutput:
    """A batch's loss as sums and their counts, so several ranks can normalise by the global batch's counts."""

    token_loss_sum: Tensor  # scalar: summed (smoothed) token cross-entropy
    tokens: Tensor  # detached scalar: predicted target tokens in the batch
    penalty_sum: Tensor  # scalar: summed per-example attention regulariser (lambda included; 0 without)
    examples: Tensor  # detached scalar: examples in the batch
    nll_sum: Tensor  # detached scalar: summed unsmoothed token negative log-likelihood, for perplexity
    # Statistics stay tensors so the trainer can add them up without a device sync every batch.

    def loss(self, tokens: Tensor | None = None, examples: Tensor | None = None) -> Tensor:
        """The scalar to minimise: mean token loss + mean regulariser, over this batch, or over a larger
        batch it is part of when given that batch's ``tokens`` and ``examples``."""
        tokens = self.tokens if tokens is None else tokens
        examples = self.examples if examples is None else examples
        return self.token_loss_sum / tokens.clamp(min=1) + self.penalty_sum / examples.clamp(min=1)


@dataclass(frozen=True)
class Seq2SeqObjective:
    """Cross-entropy with optional label smoothing, the doubly stochastic attention term, attention
    supervision and scheduled sampling."""

    label_smoothing: float = 0.0
    attention_regularization: float = 0.0  # lambda in lambda * sum_l (1 - sum_t alpha_tl)^2 (Xu et al. 2015)
    teacher_forcing: float = 1.0
    pad_index: int = Vocabulary.pad_index
    bos_index: int = Vocabulary.bos_index  # with pad_index, never a target: label smoothing gives it no mass
    attention_supervision: float = 0.0  # weight of KL(gold || attention) on the batches' gold attention (attnkit.supervision)

    @classmethod
    def from_config(cls, train: TrainConfig, pad_index: int, bos_index: int = Vocabulary.bos_index) -> "Seq2SeqObjective":
        return cls(train.label_smoothing, train.attention_regularization, train.teacher_forcing, pad_index, bos_index, train.attention_supervision)

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        output: DecoderOutput = model(batch, teacher_forcing=self.teacher_forcing)
        targets = batch.target[:, 1:]  # (B, T)
        is_token = targets != self.pad_index  # (B, T)
        tokens = is_token.sum()
        # One log-softmax serves the loss and the perplexity (the output layer dominates training time).
        log_probs = output.logits.float().log_softmax(-1)  # (B, T, V)
        nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
        token_loss = nll
        if self.label_smoothing > 0:
            # (1 - eps) * nll + eps * mean of -log p over the words a target can be: all but <pad> and <bos>.
            # Summing all and taking the two back out spares a second (B, T, V) tensor.
            never = sorted({self.pad_index, self.bos_index})
            allowed = log_probs.shape[-1] - len(never)
            smoothed = -(log_probs.sum(-1) - log_probs[..., never].sum(-1)) / allowed  # (B, T)
            token_loss = (1.0 - self.label_smoothing) * nll + self.label_smoothing * smoothed
        penalty_sum = token_loss.new_zeros(())
        if self.attention_regularization > 0:
            penalty_sum = self.attention_regularization * doubly_stochastic_penalty(output, is_token).sum()
        if self.attention_supervision > 0 and batch.attention_gold is not None:
            gold = batch.attention_gold.dense(output.attention)  # (B, T, L)
            penalty_sum = penalty_sum + self.attention_supervision * supervision_loss(output.attention, gold).sum()
        examples = torch.tensor(targets.shape[0], device=targets.device)
        return LossOutput((token_loss * is_token).sum(), tokens, penalty_sum, examples, (nll.detach() * is_token).sum())


def doubly_stochastic_penalty(output: DecoderOutput, target_mask: Tensor) -> Tensor:
    """Per example, the mean over real memory positions of (1 - sum_t alpha_tl)^2. (B,)

    Encourages every position to receive about one unit of attention over the whole
    output (Show-Attend-Tell); ``target_mask`` (B, T) drops padded target steps.
    """
    coverage = (output.attention.float() * target_mask.unsqueeze(-1)).sum(1)  # (B, L)
    squared = (1.0 - coverage).pow(2) * output.mask  # (B, L)
    return squared.sum(1) / output.mask.sum(1)  # (B,)
