"""The training objective: token cross-entropy, the doubly stochastic attention term, attention supervision, importance distillation.

Legend: B batch, T target steps, L memory length, V target vocabulary.

Only torch (and the vocabulary's special ids) is needed here: importing the model must not import
the dataset readers, nltk or PIL, so the supervision's *gold* attention is read elsewhere
(:mod:`attnkit.supervision`) and reaches the loss on the batch.

The doubly stochastic term, in one sentence (the config comment, DESIGN and docs/captioning.md say the
same): ``train.attention_regularization`` is Xu et al. (2015)'s lambda, each caption's loss is
-log p(y|x) + lambda * sum_l (1 - sum_t alpha_tl)^2 (l over real memory positions, t over the
caption's target steps), and a batch's loss is the sum of its captions' losses divided by its
target tokens, so lambda = 0 leaves the usual per-token cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnkit.config import TrainConfig
from attnkit.data.batching import Batch
from attnkit.distillation import distillation_targets, distilled_rows, select_sources
from attnkit.vocab import Vocabulary


@dataclass(frozen=True)
class LossOutput:
    """A batch's loss as sums and their counts, so several ranks can normalise by the global batch's counts."""

    per_token_sum: Tensor  # scalar: summed (smoothed) token cross-entropy + lambda * summed doubly stochastic term
    tokens: Tensor  # detached scalar: predicted target tokens in the batch
    per_example_sum: Tensor  # scalar: summed per-example attention supervision and importance distillation (weights included; 0 without)
    examples: Tensor  # detached scalar: examples in the batch
    nll_sum: Tensor | None  # detached scalar: summed unsmoothed token negative log-likelihood of the references, for perplexity (None: no references read)
    statistics: dict[str, Tensor] = field(default_factory=dict)  # detached scalars summed over the examples, logged per example of the batches that give them (train_statistics)
    # Statistics stay tensors so the trainer can add them up without a device sync every batch.

    def loss(self, tokens: Tensor | None = None, examples: Tensor | None = None) -> Tensor:
        """The scalar to minimise over this batch, or over a larger batch it is part of when given that
        batch's ``tokens`` and ``examples``: the per-token part divided by tokens, the per-example part by examples."""
        tokens = self.tokens if tokens is None else tokens
        examples = self.examples if examples is None else examples
        return self.per_token_sum / tokens.clamp(min=1) + self.per_example_sum / examples.clamp(min=1)


@dataclass(frozen=True)
class Seq2SeqObjective:
    """Cross-entropy with optional label smoothing, the doubly stochastic attention term, attention
    supervision and scheduled sampling. Called as ``objective(model, batch)`` with any model whose
    ``forward(batch, teacher_forcing, need_attention)`` returns logits (B, T, V), attention (B, T, L) when asked and
    the memory mask (B, L)."""

    label_smoothing: float = 0.0
    attention_regularization: float = 0.0  # Xu et al.'s lambda (see the module docstring)
    teacher_forcing: float = 1.0
    pad_index: int = Vocabulary.pad_index
    bos_index: int = Vocabulary.bos_index  # with pad_index, never a target: label smoothing gives it no mass
    attention_supervision: float = 0.0  # weight of KL(gold || attention) on the batches' gold attention (attnkit.supervision)
    importance_distillation: float = 0.0  # weight of KL(importance || attention) on a share of each batch's captions (attnkit.distillation)
    distillation_share: float = 0.1

    @classmethod
    def from_config(cls, train: TrainConfig, pad_index: int, bos_index: int = Vocabulary.bos_index) -> "Seq2SeqObjective":
        return cls(
            train.label_smoothing, train.attention_regularization, train.teacher_forcing, pad_index, bos_index, train.attention_supervision,
            train.importance_distillation, train.distillation_share,
        )  # fmt: skip

    @property
    def needs_attention(self) -> bool:
        """Whether a term reads the attention (a Transformer computes none otherwise)."""
        return self.attention_regularization > 0 or self.attention_supervision > 0 or self.importance_distillation > 0

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        output = model(batch, teacher_forcing=self.teacher_forcing, need_attention=self.needs_attention)
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
            # The two columns are taken one by one: indexing with a list would copy it to the device every batch.
            never = sorted({self.pad_index, self.bos_index})
            allowed = log_probs.shape[-1] - len(never)
            excluded = sum(log_probs.select(-1, index) for index in never)  # (B, T)
            smoothed = -(log_probs.sum(-1) - excluded) / allowed  # (B, T)
            token_loss = (1.0 - self.label_smoothing) * nll + self.label_smoothing * smoothed
        per_token_sum = (token_loss * is_token).sum()
        if self.attention_regularization > 0:
            per_token_sum = per_token_sum + self.attention_regularization * doubly_stochastic_penalty(output.attention, output.mask, is_token).sum()
        per_example_sum = token_loss.new_zeros(())
        if self.attention_supervision > 0 and batch.attention_gold is not None:
            gold = batch.attention_gold.dense(output.attention)  # (B, T, L)
            per_example_sum = self.attention_supervision * supervision_loss(output.attention, gold).sum()
        if self.importance_distillation > 0:
            rows = distilled_rows(targets.shape[0], self.distillation_share, targets.device)  # (B',)
            wanted = distillation_targets(model, select_sources(batch.source, rows), batch.target[rows], is_token[rows])  # (B', T, L), detached
            # Scaled to the whole batch, so the weight means the same per caption at any share.
            distilled = supervision_loss(output.attention[rows], wanted).sum() * (targets.shape[0] / rows.shape[0])
            per_example_sum = per_example_sum + self.importance_distillation * distilled
        examples = torch.full((), targets.shape[0], device=targets.device)  # filled on the device: no host-to-device copy
        return LossOutput(per_token_sum, tokens, per_example_sum, examples, (nll.detach() * is_token).sum())


def doubly_stochastic_penalty(attention: Tensor, memory_mask: Tensor, target_mask: Tensor) -> Tensor:
    """Per example, Xu et al.'s doubly stochastic term sum_l (1 - sum_t alpha_tl)^2 (B,).

    ``attention`` (B, T, L); ``memory_mask`` (B, L) keeps the real memory positions; ``target_mask``
    (B, T) the real target steps. It asks every position to receive about one unit of attention over
    the whole output (Show-Attend-Tell). When a caption has fewer steps than there are cells (T < L),
    no attention reaches that: the term is then smallest when every cell gets the same T / L, so it
    pushes the attention to spread evenly.
    """
    coverage = (attention.float() * target_mask.unsqueeze(-1)).sum(1)  # (B, L)
    return ((1.0 - coverage).pow(2) * memory_mask).sum(1)  # (B,)


def supervision_loss(attention: Tensor, gold: Tensor) -> Tensor:
    """Per example, KL(gold || attention) summed over the steps that have gold (B,).

    ``attention`` and ``gold`` are (B, T, L); a row of ``gold`` is a distribution or all zeros (no
    gold: adds nothing). Zero exactly when every gold row equals its attention row.
    """
    attention = attention.float()
    # gold * (log gold - log attention); xlogy makes 0 * log 0 = 0, the clamp keeps an attention
    # weight that underflowed to 0 from giving an infinite loss.
    divergence = torch.xlogy(gold, gold) - gold * attention.clamp_min(1e-12).log()  # (B, T, L)
    return divergence.sum((1, 2))
