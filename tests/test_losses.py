"""The training objective: the doubly stochastic term as Xu et al. define it, and a light import."""

import math
import subprocess
import sys

import pytest
import torch

from attnkit.data.batching import Batch, pad_sequences
from attnkit.interfaces import DecoderOutput
from attnkit.losses import Seq2SeqObjective, doubly_stochastic_penalty

# One caption of two words + <eos> (3 steps) and a second, shorter one (2 steps, the third padded),
# over 4 memory positions of which the first caption's last is padding.
ATTENTION = torch.tensor(
    [
        [[0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0]],
        [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]],  # the last row is a padded step
    ]
)  # (B=2, T=3, L=4)
MEMORY_MASK = torch.tensor([[True, True, True, False], [True, True, True, True]])
TARGETS = pad_sequences([[2, 4, 5, 3], [2, 4, 3]]).ids  # <bos> w w <eos> | <bos> w <eos> <pad>


def test_the_doubly_stochastic_term_is_xu_et_al_s_sum_over_positions_per_caption():
    # Caption 1: coverage (0.5, 1.0, 1.5) over its 3 real positions -> 0.25 + 0 + 0.25 = 0.5.
    # Caption 2: coverage (1, 0, 0, 1) (its padded step does not count) -> 0 + 1 + 1 + 0 = 2.
    penalty = doubly_stochastic_penalty(ATTENTION, MEMORY_MASK, TARGETS[:, 1:] != 0)
    torch.testing.assert_close(penalty, torch.tensor([0.5, 2.0]))


def test_the_objective_is_the_per_caption_loss_summed_over_the_batch_per_target_token():
    logits = torch.randn(2, 3, 6)

    class Fixed(torch.nn.Module):
        def forward(self, batch, teacher_forcing, need_attention=True):
            return DecoderOutput(logits, ATTENTION, MEMORY_MASK)

    batch = Batch(None, TARGETS, torch.arange(2))
    without, weighted = Seq2SeqObjective()(Fixed(), batch), Seq2SeqObjective(attention_regularization=0.3)(Fixed(), batch)
    tokens = 3 + 2
    assert int(weighted.tokens) == tokens
    # sum over captions of (-log p(y|x) + lambda * sum_l (1 - sum_t alpha_tl)^2), divided by the batch's target tokens
    torch.testing.assert_close(weighted.loss(), without.loss() + 0.3 * (0.5 + 2.0) / tokens)
    torch.testing.assert_close(weighted.nll_sum, without.nll_sum)  # perplexity stays the cross-entropy's


def test_the_penalty_is_smallest_when_a_short_caption_spreads_evenly_over_more_cells():
    """With fewer steps than cells (T < L) no cell can reach one unit: the even spread T / L is the minimum."""
    steps, cells = 3, 9
    even = torch.full((1, steps, cells), 1.0 / cells)
    peaked = torch.zeros(1, steps, cells)
    peaked[0, :, 0] = 1.0
    everything = (torch.ones(1, cells, dtype=torch.bool), torch.ones(1, steps, dtype=torch.bool))
    assert doubly_stochastic_penalty(even, *everything).item() == pytest.approx(cells * (1 - steps / cells) ** 2)
    assert doubly_stochastic_penalty(even, *everything) < doubly_stochastic_penalty(peaked, *everything)
    assert math.isclose(doubly_stochastic_penalty(peaked, *everything).item(), (1 - steps) ** 2 + (cells - 1))


def test_importing_the_model_loads_neither_nltk_nor_pil_nor_the_dataset_readers():
    heavy = ("nltk", "PIL", "attnkit.analysis", "attnkit.data.scenes", "attnkit.supervision", "matplotlib", "torchvision")
    code = f"import sys, attnkit.model, attnkit.losses; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
