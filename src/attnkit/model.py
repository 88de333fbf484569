"""Encoder + shared decoder, and the training objective.

Legend: B batch, T target steps, L memory length, V target vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from attnkit.config import ExperimentConfig
from attnkit.data.batching import Batch
from attnkit.decoder import AttentionDecoder, DecoderOutput
from attnkit.encoders.text import TextEncoder
from attnkit.interfaces import Encoder, EncoderOutput
from attnkit.vocab import Vocabulary


class EncoderDecoder(nn.Module):
    """Any encoder that honours the contract in :mod:`attnkit.interfaces`, and the attention decoder."""

    def __init__(self, encoder: Encoder, decoder: AttentionDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, source) -> EncoderOutput:
        return self.encoder(source)

    def forward(self, batch: Batch, teacher_forcing: float = 1.0) -> DecoderOutput:
        """Teacher-forced pass: logits for target[:, 1:] given target[:, :-1]."""
        return self.decoder(self.encode(batch.source), batch.target[:, :-1], teacher_forcing)


def build_translation_model(config: ExperimentConfig, source_vocab: Vocabulary, target_vocab: Vocabulary) -> EncoderDecoder:
    encoder = TextEncoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
    decoder = AttentionDecoder(
        config.decoder, len(target_vocab), memory_size=encoder.output_size, init_size=encoder.init_size, pad_index=target_vocab.pad_index
    )
    return EncoderDecoder(encoder, decoder)


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
