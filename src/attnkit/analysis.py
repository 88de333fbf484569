"""Attention statistics and grounding scores, the same functions for every modality.

Legend: T target steps, L memory positions (source words or grid cells), H x W grid.

An attention matrix here is (T, L): one row per output step over the *real*
memory positions, as every search result and :func:`forced_attention` return it.
Nothing below asks where the memory came from, except the two grounding scores,
which need the ground truth of their modality:

* images: the **pointing game** (does the step's peak cell touch the box of the
  object the word names) and the attention **mass in the box** (each cell's weight
  times the share of the cell inside the box);
* text: the **alignment error rate** of the attention's alignment (each target word
  linked to its peak source word) against gold sure / possible links (nltk's
  ``alignment_error_rate``), and the share of words whose peak lands on a source word
  they may align with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from nltk.translate.metrics import alignment_error_rate
from torch import Tensor

from attnkit.interfaces import EncoderOutput
from attnkit.vocab import Vocabulary


# -- statistics of any attention -----------------------------------------------------------------------
def entropy(attention: Tensor) -> Tensor:
    """Entropy in nats of each row of (T, L) -> (T,); log(L) for uniform rows, 0 for one-hot rows."""
    weights = attention.float()
    return -(weights * weights.clamp_min(1e-12).log()).sum(-1)


def peak_weight(attention: Tensor) -> Tensor:
    """The largest weight of each row (T,)."""
    return attention.float().max(-1).values


def effective_positions(attention: Tensor) -> Tensor:
    """exp(entropy) per row (T,): how many positions a row spreads over (L when uniform, 1 when one-hot)."""
    return entropy(attention).exp()


def coverage(attention: Tensor) -> Tensor:
    """Column sums over the steps (L,): how much attention each position received in all."""
    return attention.float().sum(0)


@dataclass(frozen=True)
class AttentionSummary:
    """Statistics of one attention matrix, per step and averaged."""

    entropy: list[float]  # per step, nats
    normalised_entropy: list[float]  # per step, entropy / log(L): 1 = uniform (0 when L == 1)
    peak: list[float]  # per step
    effective_positions: list[float]  # per step
    coverage: list[float]  # per memory position
    positions: int  # L

    def mean(self) -> dict[str, float]:
        def average(values: list[float]) -> float:
            return round(sum(values) / len(values), 4) if values else float("nan")

        covered = torch.tensor(self.coverage)
        return {
            "entropy": average(self.entropy),
            "normalised_entropy": average(self.normalised_entropy),
            "peak": average(self.peak),
            "effective_positions": average(self.effective_positions),
            "coverage_max": round(float(covered.max()), 4) if self.coverage else float("nan"),
            "coverage_std": round(float(covered.std(unbiased=False)), 4) if self.coverage else float("nan"),
            "positions": self.positions,
        }


def summarise(attention: Tensor) -> AttentionSummary:
    steps, positions = attention.shape
    rows = entropy(attention)
    scale = math.log(positions) if positions > 1 else 1.0
    return AttentionSummary(
        entropy=_rounded(rows),
        normalised_entropy=_rounded(rows / scale) if positions > 1 else [0.0] * steps,
        peak=_rounded(peak_weight(attention)),
        effective_positions=_rounded(effective_positions(attention)),
        coverage=_rounded(coverage(attention)),
        positions=positions,
    )


def _rounded(values: Tensor) -> list[float]:
    return [round(float(v), 4) for v in values]


# -- images: pointing game and mass in the box ---------------------------------------------------------------
def cell_boxes(grid: tuple[int, int], image_size: tuple[int, int]) -> Tensor:
    """The pixel rectangle (x0, y0, x1, y1) of every grid cell, row-major (L, 4), for an image of (width, height)."""
    rows, columns = grid
    width, height = image_size
    ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    cell_w, cell_h = width / columns, height / rows
    return torch.stack([xs * cell_w, ys * cell_h, (xs + 1) * cell_w, (ys + 1) * cell_h], -1).reshape(-1, 4).float()


def _overlap_share(cells: Tensor, box: Sequence[float]) -> Tensor:
    """Share of each cell's area inside ``box`` (L,)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    width = (cells[:, 2].clamp(max=x1) - cells[:, 0].clamp(min=x0)).clamp(min=0)
    height = (cells[:, 3].clamp(max=y1) - cells[:, 1].clamp(min=y0)).clamp(min=0)
    area = (cells[:, 2] - cells[:, 0]) * (cells[:, 3] - cells[:, 1])
    return width * height / area


@dataclass(frozen=True)
class ImageGrounding:
    """Pointing-game counts of one or more sentences; ``+`` pools them. ``ImageGrounding()`` has scored nothing."""

    words: int = 0  # referring words scored
    hits: int = 0  # of them, peak cell on the object
    mass: float = 0.0  # summed attention mass inside the objects' boxes

    @property
    def hit_rate(self) -> float:
        return self.hits / self.words if self.words else float("nan")

    @property
    def mean_mass(self) -> float:
        return self.mass / self.words if self.words else float("nan")

    def __add__(self, other: "ImageGrounding") -> "ImageGrounding":
        return ImageGrounding(self.words + other.words, self.hits + other.hits, self.mass + other.mass)


def image_grounding(
    attention: Tensor, referents: Sequence[int | None], boxes: Sequence[Sequence[float]], grid: tuple[int, int], image_size: tuple[int, int]
) -> ImageGrounding:
    """Pointing game and in-box mass over the words that name an object: ``attention`` (T, L) row t is word t.

    A word hits when its step's peak cell overlaps the box of the object it names (the pointing game at
    the grid's resolution); its in-box mass is each cell's weight times the share of the cell the box covers.
    """
    cells = cell_boxes(grid, image_size)  # (L, 4), once for every word
    words = hits = 0
    mass = 0.0
    for step, referent in enumerate(referents):
        if referent is None or step >= attention.shape[0]:
            continue
        share = _overlap_share(cells, boxes[referent])  # (L,)
        weights = attention[step].float()  # (L,)
        words += 1
        hits += bool(share[int(weights.argmax())] > 0)
        mass += float((weights * share).sum())
    return ImageGrounding(words, hits, mass)


# -- text: alignment error rate --------------------------------------------------------------------------
def attention_alignment(attention: Tensor, target_words: int | None = None) -> set[tuple[int, int]]:
    """Links (source position, target position): each target word to its peak source word.

    ``target_words`` limits the rows (e.g. leaving out the <eos> step).
    """
    rows = attention[: target_words if target_words is not None else attention.shape[0]]
    return {(int(source), target) for target, source in enumerate(rows.float().argmax(-1))}


Link = tuple[int, int, int]  # (sentence, source position, target position)


@dataclass(frozen=True)
class TextGrounding:
    """Hypothesis and gold links of one or more sentences; ``+`` pools sentences into a corpus figure."""

    hypothesis: frozenset[Link] = frozenset()  # A: each target word linked to its peak source word
    sure: frozenset[Link] = frozenset()  # S
    possible: frozenset[Link] = frozenset()  # P (contains S)
    words: int = 0  # target words with a possible link
    peaks_on_aligned: int = 0  # of them, peak on a source word they may align with

    @property
    def aer(self) -> float:
        """1 - (|A & S| + |A & P|) / (|A| + |S|) (Och and Ney 2003), by nltk, over every pooled link."""
        if not self.hypothesis and not self.sure:
            return float("nan")
        return alignment_error_rate(self.sure, self.hypothesis, self.possible)

    @property
    def peak_on_aligned_rate(self) -> float:
        return self.peaks_on_aligned / self.words if self.words else float("nan")

    def __add__(self, other: "TextGrounding") -> "TextGrounding":
        return TextGrounding(
            self.hypothesis | other.hypothesis,
            self.sure | other.sure,
            self.possible | other.possible,
            self.words + other.words,
            self.peaks_on_aligned + other.peaks_on_aligned,
        )


def text_grounding(
    attention: Tensor, sure: Iterable[tuple[int, int]], possible: Iterable[tuple[int, int]], target_words: int, sentence: int = 0
) -> TextGrounding:
    """Score the attention (T, S) of one sentence against gold (source, target) links.

    ``target_words`` rows are scored (the <eos> step is not a word); ``sentence``
    keeps the links of different sentences apart when groundings are added up.
    """
    hypothesis = attention_alignment(attention, target_words)
    sure_links = set(sure)
    possible_links = set(possible) | sure_links
    linked = {target for _, target in possible_links if target < target_words}
    on_aligned = sum((source, target) in possible_links for source, target in hypothesis if target in linked)

    def tagged(links: Iterable[tuple[int, int]]) -> frozenset[Link]:
        return frozenset((sentence, source, target) for source, target in links)

    return TextGrounding(tagged(hypothesis), tagged(sure_links), tagged(possible_links), len(linked), on_aligned)


# -- forced decoding ------------------------------------------------------------------------------------------
@torch.no_grad()
def forced_attention(decoder, encoded: EncoderOutput, targets: Tensor) -> list[Tensor]:
    """Teacher-force each row of ``targets`` (B, T) (<bos> w1 ... <eos> <pad> ...) through the decoder and
    return, per example, the attention (T_i, L_i) of its steps w1 ... <eos> over its real positions.

    The same target sentence forced through an image encoder and a text encoder gives
    attention for the same words in both modalities.
    """
    output = decoder(encoded, targets[:, :-1])  # attention (B, T, L)
    steps = (targets[:, 1:] != Vocabulary.pad_index).sum(1)  # (B,) real target tokens, <eos> included
    return [output.attention[i, : int(steps[i])][:, encoded.mask[i]].float().cpu() for i in range(targets.shape[0])]
