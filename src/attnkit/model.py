"""Encoders + the shared decoder, the model builders of every task, and the training objective.

Legend: B batch, T target steps, L memory length, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from attnkit.config import ExperimentConfig, TrainConfig
from attnkit.data.batching import Batch, PaddedTokens
from attnkit.decoder import AttentionDecoder, DecoderOutput
from attnkit.encoders.image import GridFeatures, ImageEncoder, Pixels
from attnkit.encoders.text import TextEncoder
from attnkit.errors import UserError
from attnkit.interfaces import Encoder, EncoderOutput
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


def source_kind(source) -> str:
    """"text" for token ids, "image" for pixels or cached grid features: which encoder reads a source."""
    if isinstance(source, PaddedTokens):
        return "text"
    if isinstance(source, (Pixels, GridFeatures)):
        return "image"
    raise TypeError(f"no encoder reads sources of type {type(source).__name__}")


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

    def encode(self, source) -> EncoderOutput:
        return self.encoder_for(source_kind(source))(source)


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
    loss: Tensor  # scalar to minimise: mean (smoothed) token cross-entropy + attention regulariser
    nll_sum: Tensor  # detached scalar: summed unsmoothed token negative log-likelihood, for perplexity
    tokens: Tensor  # detached scalar: predicted target tokens in the batch
    # Statistics stay tensors so the trainer can add them up without a device sync every batch.


@dataclass(frozen=True)
class Seq2SeqObjective:
    """Cross-entropy with optional label smoothing, the doubly stochastic attention term and scheduled sampling."""

    label_smoothing: float = 0.0
    attention_regularization: float = 0.0  # lambda in lambda * sum_l (1 - sum_t alpha_tl)^2 (Xu et al. 2015)
    teacher_forcing: float = 1.0
    pad_index: int = 0

    @classmethod
    def from_config(cls, train: TrainConfig, pad_index: int) -> "Seq2SeqObjective":
        return cls(train.label_smoothing, train.attention_regularization, train.teacher_forcing, pad_index)

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        output: DecoderOutput = model(batch, teacher_forcing=self.teacher_forcing)
        gold = batch.target[:, 1:]  # (B, T)
        is_token = gold != self.pad_index  # (B, T)
        tokens = is_token.sum()
        # One log-softmax serves the loss and the perplexity (the output layer dominates training time).
        log_probs = output.logits.float().log_softmax(-1)  # (B, T, V)
        nll = -log_probs.gather(-1, gold.unsqueeze(-1)).squeeze(-1)  # (B, T)
        token_loss = nll
        if self.label_smoothing > 0:  # as F.cross_entropy: (1 - eps) * nll + eps * mean over the vocabulary of -log p
            token_loss = (1.0 - self.label_smoothing) * nll - self.label_smoothing * log_probs.mean(-1)
        loss = (token_loss * is_token).sum() / tokens.clamp(min=1)
        if self.attention_regularization > 0:
            loss = loss + self.attention_regularization * doubly_stochastic_penalty(output, is_token)
        return LossOutput(loss, (nll.detach() * is_token).sum(), tokens)


def doubly_stochastic_penalty(output: DecoderOutput, target_mask: Tensor) -> Tensor:
    """Mean over the batch of the per-position mean of (1 - sum_t alpha_tl)^2 over real memory positions.

    Encourages every position to receive about one unit of attention over the whole
    output (Show-Attend-Tell); ``target_mask`` (B, T) drops padded target steps.
    """
    coverage = (output.attention.float() * target_mask.unsqueeze(-1)).sum(1)  # (B, L)
    squared = (1.0 - coverage).pow(2) * output.mask  # (B, L)
    return (squared.sum(1) / output.mask.sum(1)).mean()
