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
from dataclasses import dataclass, replace

import torch
from nltk.translate.metrics import alignment_error_rate
from torch import Tensor

from attnkit.data.images import MOSAIC_PHOTOS  # the mosaic's layout: 2 x 2, row-major
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


def overlap_share(cells: Tensor, box: Sequence[float]) -> Tensor:
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
    misses_on_other_objects: int = 0  # of the misses, peak cell on another object's box (the rest: on background)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.words if self.words else float("nan")

    @property
    def mean_mass(self) -> float:
        return self.mass / self.words if self.words else float("nan")

    def __add__(self, other: "ImageGrounding") -> "ImageGrounding":
        return ImageGrounding(self.words + other.words, self.hits + other.hits, self.mass + other.mass, self.misses_on_other_objects + other.misses_on_other_objects)


def image_grounding(
    attention: Tensor, referents: Sequence[int | None], boxes: Sequence[Sequence[float]], grid: tuple[int, int], image_size: tuple[int, int]
) -> ImageGrounding:
    """Pointing game and in-box mass over the words that name an object: ``attention`` (T, L) row t is word t.

    A word hits when its step's peak cell overlaps the box of the object it names (the pointing game at
    the grid's resolution); its in-box mass is each cell's weight times the share of the cell the box covers.
    A miss is counted apart when its peak cell overlaps another object's box (``boxes`` holds every object's).
    """
    cells = cell_boxes(grid, image_size)  # (L, 4), once for every word
    shares = [overlap_share(cells, box) for box in boxes]  # per object (L,)
    words = hits = on_others = 0
    mass = 0.0
    for step, referent in enumerate(referents):
        if referent is None or step >= attention.shape[0]:
            continue
        weights = attention[step].float()  # (L,)
        peak = maxima(weights)  # (L,) bool: one cell, or every cell of a tie (:func:`maxima`)
        hit = bool((shares[referent][peak] > 0).all())
        words += 1
        hits += hit
        on_others += not hit and any(bool((share[peak] > 0).all()) for other, share in enumerate(shares) if other != referent)
        mass += float((weights * shares[referent]).sum())
    return ImageGrounding(words, hits, mass, on_others)


# -- localisation: several inputs side by side as one memory ------------------------------------------------
# Four photos in a 2 x 2 mosaic, or four sentences joined as one source: a word forced for one input should
# attend to that input's part of the memory. The same score for both modalities, from a region weight per
# memory position (the share of a cell inside a quadrant, or 1 on a sentence's words and 0 elsewhere).
def quadrant_weights(grid: tuple[int, int], quadrant: int) -> Tensor:
    """The share of each grid cell inside ``quadrant`` (0-3, row-major) of a 2 x 2 mosaic (L,).

    On an odd grid the middle row and column straddle two quadrants and count half in each."""
    if not 0 <= quadrant < MOSAIC_PHOTOS:
        raise ValueError(f"a 2 x 2 mosaic has quadrants 0-3, got {quadrant}")
    row, column = divmod(quadrant, 2)
    return overlap_share(cell_boxes(grid, (2, 2)), (column, row, column + 1, row + 1))  # the mosaic as a 2 x 2 unit square


def span_weights(lengths: Sequence[int], index: int) -> Tensor:
    """1 on the positions of the ``index``-th of several sources joined end to end, 0 elsewhere (L = sum(lengths),)."""
    if not 0 <= index < len(lengths):
        raise ValueError(f"{len(lengths)} joined sources have no source {index}")
    weights = torch.zeros(sum(lengths))
    start = sum(lengths[:index])
    weights[start : start + lengths[index]] = 1.0
    return weights


def maxima(rows: Tensor) -> Tensor:
    """(..., L) -> (..., L) bool: the positions where each row reaches its maximum. Where that is more than one, a
    row's peak is all of them: it hits a region only if every one lies in it. So a flat row (importance that lost
    nothing anywhere is drawn evenly) points at no object, where its argmax, the first position, could have hit one."""
    return rows == rows.amax(-1, keepdim=True)


def has_peak(rows: Tensor) -> Tensor:
    """(..., L) -> (...,) bool: the maximum is reached at one position only (what a word can be linked to)."""
    return maxima(rows).sum(-1) == 1


def localisation(attention: Tensor, region: Tensor) -> tuple[Tensor, Tensor]:
    """Each step's attention mass on its input's region, and whether its peak lies mostly in it: ((T,), (T,) bool).

    ``attention`` (T, L); ``region`` (L,) the share of each position inside the region. Uniform attention
    scores the region's share of the memory (a quarter for one of four inputs of equal size)."""
    weights = attention.float()  # (T, L)
    mass = weights @ region.to(weights)  # (T,)
    hits = (mostly_inside(region) | ~maxima(weights)).all(-1)  # (T,) every position at the maximum inside
    return mass, hits


def mostly_inside(region: Tensor) -> Tensor:
    """(L,) shares -> (L,) bool: the positions a peak may lie on to hit the region, those more than half inside it.

    A cell straddling two quadrants of an odd grid (7 x 7's middle row and column) is half in each, and so no hit
    for either. Its share is computed in float32 as 0.4999998 or 0.5000002, by where it lies, so the bound allows
    for that: a bare ``> 0.5`` gave the quadrants 9, 12, 12 and 15 of 49 cells, and attention blind to the photo
    scored 24 % pointing where the rule allows it 18 %."""
    return region.double() > 0.5 + SHARE_TOLERANCE


SHARE_TOLERANCE = 1e-5  # above float32's rounding of a quadrant's shares (0, 1/4, 1/2 or 1), far below the gaps between them


# -- text: alignment error rate --------------------------------------------------------------------------
def attention_alignment(attention: Tensor, target_words: int | None = None) -> set[tuple[int, int]]:
    """Links (source position, target position): each target word to its peak source word (none where the row's
    maximum is tied: a flat row says nothing about which word it rests on).

    ``target_words`` limits the rows (e.g. leaving out the <eos> step).
    """
    rows = attention[: target_words if target_words is not None else attention.shape[0]].float()
    return {(int(source), target) for target, (source, peaked) in enumerate(zip(rows.argmax(-1), has_peak(rows))) if peaked}  # a tie links nowhere


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
    attention: Tensor, sure: Iterable[tuple[int, int]], possible: Iterable[tuple[int, int]], target_words: int, sentence: int = 0,
    scored: Iterable[int] | None = None,
) -> TextGrounding:  # fmt: skip
    """Score the attention (T, S) of one sentence against gold (source, target) links.

    ``target_words`` rows are scored (the <eos> step is not a word); ``sentence``
    keeps the links of different sentences apart when groundings are added up.
    ``scored``: only these target positions are linked (the words of one kind, scored against that kind's gold
    links: the groundings of every kind added up are the whole sentence's).
    """
    hypothesis = attention_alignment(attention, target_words)
    if scored is not None:
        kept = set(scored)
        hypothesis = {(source, target) for source, target in hypothesis if target in kept}
    sure_links = set(sure)
    possible_links = set(possible) | sure_links
    linked = {target for _, target in possible_links if target < target_words}
    on_aligned = sum((source, target) in possible_links for source, target in hypothesis if target in linked)

    def tagged(links: Iterable[tuple[int, int]]) -> frozenset[Link]:
        return frozenset((sentence, source, target) for source, target in links)

    return TextGrounding(tagged(hypothesis), tagged(sure_links), tagged(possible_links), len(linked), on_aligned)


# -- which step's attention belongs to a word -------------------------------------------------------------------
EMITTING, READING = "emitting", "reading"
EXTRACTIONS = (EMITTING, READING)


def word_attention(steps: Tensor, words: int, reading_offset: int, extraction: str) -> Tensor:
    """The attention belonging to each of a sentence's ``words`` target words under ``extraction``. (words, L)

    Under forced decoding step t reads input y_t (y_0 = <bos>, y_t = w_{t-1}) and emits w_t, so the
    *emitting* extraction reads word w_j's attention from step j. The *reading* extraction (Shift-Att,
    Chen et al. 2020) takes it from the first step whose attention query has read w_j: ``reading_offset``
    steps later, a property of the decoder (``decoder.reading_offset``; each RNN style and the
    Transformer say why theirs is what it is).

    ``steps`` (S, L): every forced-decoding step of the sentence, including the one that reads <eos>
    (:func:`forced_attention` with ``read_eos=True``: S = words + 2).
    """
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown extraction '{extraction}'; choose one of {', '.join(EXTRACTIONS)}")
    offset = 0 if extraction == EMITTING else reading_offset
    if steps.shape[0] < offset + words:
        raise ValueError(f"{steps.shape[0]} steps hold no '{extraction}' attention for {words} words (force the target with read_eos=True)")
    return steps[offset : offset + words]  # (words, L)


# -- forced decoding ------------------------------------------------------------------------------------------
@torch.no_grad()
def forced_attention(decoder, encoded: EncoderOutput, targets: Tensor, read_eos: bool = False) -> list[Tensor]:
    """Teacher-force each row of ``targets`` (B, T) (<bos> w1 ... <eos> <pad> ...) through the decoder and
    return, per example, the attention (T_i, L_i) of its steps w1 ... <eos> over its real positions.

    ``read_eos``: one step more, whose input is <eos> (T_i + 1 rows): the step at which a ``bahdanau``
    decoder's query has read the last word (``decoder.reading_offset``). The same target sentence
    forced through an image encoder and a text encoder gives attention for the same words in both modalities.
    """
    output, steps = _forced_pass(decoder, encoded, targets, read_eos)
    return _per_example(output.attention, steps, encoded.mask)


@torch.no_grad()
def forced_attention_by_head(decoder, encoded: EncoderOutput, targets: Tensor, read_eos: bool = False) -> tuple[list[Tensor], list[Tensor]]:
    """:func:`forced_attention` and, from the same pass, every layer's and head's attention (T_i, N, h, L_i)
    per example (a single-head decoder's is its one attention, N = h = 1)."""
    output, steps = _forced_pass(decoder, encoded, targets, read_eos)
    every = output.heads if output.heads is not None else output.attention[:, None, None]  # (B, N, h, T, L)
    return _per_example(output.attention, steps, encoded.mask), _per_example(every.permute(0, 3, 1, 2, 4), steps, encoded.mask)


def _forced_pass(decoder, encoded: EncoderOutput, targets: Tensor, read_eos: bool):
    """The teacher-forced pass over ``targets`` and each example's number of steps (B,) (<bos> w1 ... (<eos>): one step each)."""
    output = decoder(encoded, targets if read_eos else targets[:, :-1])  # attention (B, T, L)
    return output, (targets != Vocabulary.pad_index).sum(1) - (0 if read_eos else 1)


def _per_example(attention: Tensor, steps: Tensor, mask: Tensor) -> list[Tensor]:
    """(B, T, ..., L) -> per example its steps over its real positions, (T_i, ..., L_i) on the CPU."""
    return [attention[i, : int(steps[i])][..., mask[i]].float().cpu() for i in range(attention.shape[0])]


def _one_source(encoded: EncoderOutput, what: str) -> None:
    if encoded.batch_size != 1:
        raise ValueError(f"{what} takes one source at a time")


# -- faithfulness: erasure and importance ------------------------------------------------------------------------
@dataclass(frozen=True)
class ForcedRun:
    """One source's plain forced run, step by step, kept so that each step can be run again with memory positions
    hidden from its attention: the state before each step, the step's attention and its log-probabilities."""

    decoder: object
    inputs: Tensor  # (T,) <bos> w1 ... w_{T-1}
    gold: Tensor  # (T,) w1 ... <eos>
    states: list  # the decoder state before each step
    attention: Tensor  # (T, L)
    gold_log_p: Tensor  # (T,) log p of each step's gold token
    best: Tensor  # (T,) each step's argmax token
    real: Tensor  # (L,) bool

    @classmethod
    @torch.no_grad()
    def of(cls, decoder, encoded: EncoderOutput, target: Tensor, what: str) -> "ForcedRun":
        _one_source(encoded, what)
        target = target.to(encoded.memory.device)
        inputs, gold = target[:-1], target[1:]  # (T,), (T,)
        state, states, attention, log_probs = decoder.init_state(encoded), [], [], []
        for t in range(inputs.shape[0]):
            states.append(state)
            out = decoder.step(inputs[t : t + 1], state)
            attention.append(out.attention[0])
            log_probs.append(out.logits[0].float().log_softmax(-1))
            state = out.state
        base = torch.stack(log_probs)  # (T, V)
        return cls(decoder, inputs, gold, states, torch.stack(attention), base.gather(1, gold.unsqueeze(1)).squeeze(1), base.argmax(-1), encoded.mask[0])

    @property
    def steps(self) -> int:
        return self.inputs.shape[0]

    @property
    def positions(self) -> int:
        return int(self.real.sum())

    @property
    def device(self) -> torch.device:
        return self.inputs.device

    @torch.no_grad()
    def remove(self, removed: Tensor) -> tuple[Tensor, Tensor]:
        """Run each step t again once per removal ``removed[t, r]`` ((T, R, L) bool, True = hidden from that step's
        attention; the others renormalise), every removal of a step in one batch, from the step's stored state, so
        nothing after step t is touched. Returns the gold token's log-probability lost (T, R) and whether the
        argmax token changed (T, R) float."""
        per_step = removed.shape[1]
        copies = torch.zeros(per_step, dtype=torch.long, device=self.device)  # (R,) row 0 and source 0, R times
        lost, flips = [], []
        for t, before in enumerate(self.states):
            intervened = replace(before.select_beams(copies, copies), mask=self.real.unsqueeze(0) & ~removed[t])  # (R, L)
            log_p = self.decoder.step(self.inputs[t].expand(per_step), intervened).logits.float().log_softmax(-1)  # (R, V)
            lost.append(self.gold_log_p[t] - log_p[:, self.gold[t]])
            flips.append((log_p.argmax(-1) != self.best[t]).float())
        return torch.stack(lost), torch.stack(flips)  # (T, R), (T, R)


@dataclass(frozen=True)
class Erasure:
    """What removing memory positions from one step's attention does to the token that step emits. One entry per
    forced step (target words, then <eos>); NaN where a sentence has fewer than two real positions."""

    peak_drop: Tensor  # (T,) log p(token) lost when the attention peak is removed (the others renormalise)
    random_drop: Tensor  # (T,) the same for a random real position, mean over the draws
    lowest_drop: Tensor  # (T,) the same for the lowest-weight real position
    peak_flip: Tensor  # (T,) 1.0 when removing the peak changes the argmax word, else 0.0
    random_flip: Tensor  # (T,) share of the random draws that change it
    lowest_flip: Tensor  # (T,)
    flip_share: Tensor  # (T,) fewest top-weighted positions whose removal changes the argmax, / real positions (NaN: none does)

    def steps(self, index: Tensor | slice) -> "Erasure":
        """The entries of some steps only (e.g. the words, not <eos>; the words of one kind)."""
        return Erasure(**{name: getattr(self, name)[index] for name in Erasure.__dataclass_fields__})

    def __len__(self) -> int:
        return self.peak_drop.shape[0]


@torch.no_grad()
def erasure(decoder, encoded: EncoderOutput, target: Tensor, draws: int = 5, generator: torch.Generator | None = None) -> Erasure:
    """Erase memory positions from each step's attention under forced decoding, one step at a time.

    ``encoded`` holds one source; ``target`` (T + 1,) is <bos> w1 ... <eos>. The states of a plain forced run
    are kept, and each step t is run again from its state with positions masked out (through the state's
    ``mask``: the attention over the others renormalises), every removal of that step in one batch; nothing
    after step t is touched. That is an intervention on step t alone in any decoder family: in a decoder of
    several layers, a step's layer-1 output feeds later steps through their self-attention, so intervening
    on all steps in one parallel pass would let one step's removal reach another's.
    Removals per step: the peak, the lowest-weight real position, ``draws`` random real positions, and the
    top 1, 2, ... weighted positions (for ``flip_share``). Nothing here asks which modality made the memory.
    """
    forced = ForcedRun.of(decoder, encoded, target, "erasure")
    steps, real, positions, device = forced.steps, forced.real, forced.positions, forced.device
    nan = torch.full((steps,), float("nan"))
    if positions < 2:
        return Erasure(nan, nan, nan, nan, nan, nan, nan)

    # The removals of every step: (T, R, L) True = removed. R = peak, lowest, draws randoms, top-1 ... top-(P-1).
    weights = forced.attention.float().masked_fill(~real, float("-inf"))  # (T, L)
    order = weights.argsort(dim=-1, descending=True, stable=True)[:, :positions]  # (T, P) real positions by weight, ties by index
    ranks = torch.arange(positions - 1, device=device)  # (P-1,)
    top = torch.zeros(steps, positions - 1, real.shape[0], dtype=torch.bool, device=device)  # (T, P-1, L)
    top.scatter_(2, order[:, None, : positions - 1].expand(-1, positions - 1, -1), (ranks[None, :, None] >= ranks[None, None, :]).expand(steps, -1, -1))
    real_index = real.nonzero().squeeze(1)  # (P,)
    picks = real_index[torch.randint(positions, (steps, draws), generator=generator).to(device)]  # (T, draws)
    single = torch.stack([order[:, 0], order[:, -1]], 1)  # (T, 2) peak, lowest
    singles = torch.nn.functional.one_hot(torch.cat([single, picks], 1), real.shape[0]).bool()  # (T, 2 + draws, L)
    drop, flip = forced.remove(torch.cat([singles, top], 1))  # (T, R) each

    top_flips = flip[:, 2 + draws :]  # (T, P-1): removing the top k+1
    first_flip = torch.where(top_flips.any(1), top_flips.argmax(1).float() + 1, torch.full((steps,), float("nan"), device=device))  # (T,)
    return Erasure(
        peak_drop=drop[:, 0].cpu(),
        random_drop=drop[:, 2 : 2 + draws].mean(1).cpu(),
        lowest_drop=drop[:, 1].cpu(),
        peak_flip=flip[:, 0].cpu(),
        random_flip=flip[:, 2 : 2 + draws].mean(1).cpu(),
        lowest_flip=flip[:, 1].cpu(),
        flip_share=(first_flip / positions).cpu(),
    )


def _nan_mean(values: Tensor) -> float:
    """The mean of the values that are not NaN, rounded to 4 places (NaN when there are none)."""
    values = values[~values.isnan()]
    return round(float(values.mean()), 4) if values.numel() else float("nan")


def erasure_means(parts: Sequence[Erasure]) -> dict[str, float]:
    """Means over every step of ``parts`` (several sentences pooled); a flip share only over the steps where
    some removal flips the word (``never_flips``: the share of steps where none does)."""
    fields = {name: torch.cat([getattr(part, name) for part in parts]) for name in Erasure.__dataclass_fields__} if parts else {}
    if not fields or fields["peak_drop"].numel() == 0:
        return {"steps": 0}
    scored = ~fields["peak_drop"].isnan()  # steps of sentences with at least two positions
    summary = {name: _nan_mean(values[scored]) for name, values in fields.items() if name != "flip_share"}
    summary["flip_share"] = _nan_mean(fields["flip_share"][scored])
    summary["never_flips"] = round(float(fields["flip_share"][scored].isnan().float().mean()), 4) if scored.any() else float("nan")
    summary["steps"] = int(scored.sum())
    return summary


# -- importance through attention: what each word's log-probability rests on, position by position -------------
# The other estimators (from the input, windows, random masks, gradients, norm-weighted attention) and the
# distribution every figure draws are in attnkit.importance; this one reruns each step from its stored state.
@torch.no_grad()
def attention_importance(decoder, encoded: EncoderOutput, target: Tensor) -> Tensor:
    """Each real position hidden from each step's attention, one at a time: log p(gold) lost, (T, L).

    ``encoded`` holds one source; ``target`` (T + 1,) is <bos> w1 ... <eos>. One batch of P removals per step,
    from the step's state in the plain forced run (see :func:`erasure`). A source of one real position has
    nothing to renormalise over: its row is NaN."""
    forced = ForcedRun.of(decoder, encoded, target, "attention_importance")
    importance = torch.full((forced.steps, forced.real.shape[0]), float("nan"))
    if forced.positions < 2:
        return importance
    real_index = forced.real.nonzero().squeeze(1)  # (P,)
    removed = torch.nn.functional.one_hot(real_index, forced.real.shape[0]).bool()  # (P, L): removal r hides position r
    lost, _ = forced.remove(removed.unsqueeze(0).expand(forced.steps, -1, -1))  # (T, P)
    importance[:, real_index.cpu()] = lost.cpu()
    return importance


def json_number(value: Tensor | float) -> float | None:
    """A figure for a JSON file: rounded to 4 places, NaN and infinities as null (strict JSON has neither)."""
    value = float(value)
    return round(value, 4) if math.isfinite(value) else None


# -- agreement between attention and importance -------------------------------------------------------------------
@dataclass(frozen=True)
class Agreement:
    """How well each step's attention agrees with its importance over the real positions, beside the same scores
    of the step's attention shuffled over its positions (what agreement by chance looks like). One entry per step;
    NaN where a source has fewer than two real positions or the importance row is missing."""

    rank_correlation: Tensor  # (T,) Spearman's rho over positions; 0 when either row is constant (no ranking to agree on)
    peak_match: Tensor  # (T,) 1.0 when the attention peak is the importance peak (each a single position; else 0.0)
    top_mass: Tensor  # (T,) attention mass on the most important positions (the top ``top_share``, at least one,
    #                   of those that matter); NaN where no position matters (no positive importance)
    shuffled_rank_correlation: Tensor  # (T,) the same three for shuffled attention, mean over the draws
    shuffled_peak_match: Tensor  # (T,)
    shuffled_top_mass: Tensor  # (T,)

    def steps(self, index: Tensor | slice) -> "Agreement":
        """The entries of some steps only (e.g. the words of one group)."""
        return Agreement(**{name: getattr(self, name)[index] for name in Agreement.__dataclass_fields__})

    def __len__(self) -> int:
        return self.rank_correlation.shape[0]


def ranks(values: Tensor) -> Tensor:
    """Ranks along the last dimension (0 = smallest), ties given their mean rank, as Spearman's rho needs. (..., L)"""
    order = values.argsort(dim=-1, stable=True)
    plain = torch.empty_like(values)
    plain.scatter_(-1, order, torch.arange(values.shape[-1], dtype=values.dtype, device=values.device).expand_as(values).contiguous())
    # equal values: the mean of their plain ranks
    same = values.unsqueeze(-1) == values.unsqueeze(-2)  # (..., L, L)
    return (same.to(values.dtype) @ plain.unsqueeze(-1)).squeeze(-1) / same.sum(-1).to(values.dtype)


def rank_correlation(a: Tensor, b: Tensor) -> Tensor:
    """Spearman's rho of each row pair of (..., L); 0 where a row is constant (it ranks nothing)."""
    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    spread = (ra.square().sum(-1) * rb.square().sum(-1)).sqrt()
    rho = (ra * rb).sum(-1) / spread.clamp_min(1e-12)
    return torch.where(spread > 0, rho, torch.zeros_like(rho)).float()


def agreement(attention: Tensor, importance: Tensor, top_share: float = 0.1, draws: int = 20, generator: torch.Generator | None = None) -> Agreement:
    """Agreement of attention (T, L) with importance (T, L) over the positions where importance is known
    (not NaN; the real positions), per step; each score also for the step's attention shuffled over those
    positions (``draws`` permutations).

    Importance is scored by its positive part, as the figures draw it: a position whose removal *raises* the
    word's log-probability is not one the word rests on. Taken raw, those gains would rank against attention by
    construction: hiding a position from attention renormalises the rest, so removing any position but the one
    the word uses moves weight onto that one and helps the word, the more the more weight it held."""
    steps = attention.shape[0]
    known = ~importance.isnan().all(0)  # (L,) the real positions
    positions = int(known.sum())
    nan = torch.full((steps,), float("nan"))
    if positions < 2:
        return Agreement(nan, nan, nan, nan, nan, nan)
    weights, scores = attention[:, known].float(), importance[:, known].float().clamp(min=0.0)  # (T, P)
    top = max(1, round(top_share * positions))
    most_important = torch.nn.functional.one_hot(scores.argsort(dim=-1, descending=True, stable=True)[:, :top], positions).sum(1).bool()  # (T, P)
    most_important &= scores > 0  # positions that matter only, when fewer than the top share do

    ranked = scores.amax(-1) > scores.amin(-1)  # (T,) some position matters more than another

    def scored(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # rows (..., T, P)
        peaks = (rows.argmax(-1) == scores.argmax(-1)) & has_peak(rows) & has_peak(scores)
        mass = (rows * most_important).sum(-1)
        return rank_correlation(rows, scores.expand_as(rows)), peaks.float(), torch.where(ranked, mass, torch.full_like(mass, float("nan")))

    permutations = torch.stack([torch.randperm(positions, generator=generator) for _ in range(draws * steps)]).view(draws, steps, positions).to(weights.device)
    shuffled = weights.unsqueeze(0).expand(draws, -1, -1).gather(2, permutations)  # (draws, T, P)
    plain, chance = scored(weights), scored(shuffled)
    return Agreement(*plain, *(values.mean(0) for values in chance))


def agreement_means(parts: Sequence[Agreement]) -> dict[str, float]:
    """Each score's mean over the steps of ``parts`` that have it (several sentences pooled), and how many steps are scored."""
    if not parts:
        return {"steps": 0}
    fields = {name: torch.cat([getattr(part, name) for part in parts]) for name in Agreement.__dataclass_fields__}
    summary = {name: _nan_mean(values) for name, values in fields.items()}
    summary["steps"] = int((~fields["rank_correlation"].isnan()).sum())
    return summary


# -- what each self-attention head looks at (Clark et al. 2019, "What does BERT look at?") ----------------
HEAD_STATISTICS = ("entropy", "normalised_entropy", "peak", "effective_positions", "previous", "next", "self", "punctuation")


def is_punctuation(token: str) -> bool:
    """Whether a word or subword piece is punctuation: something is left once sentencepiece's word-start mark
    "\u2581" is taken away, and none of it is a letter or a digit (``str.isalnum``). So "." "," "\u2026" "-" "$" "+"
    and "\u2581," are punctuation; "\u2581" alone, "'s", "l'", "ça" and "2" are not. The one rule of the package:
    the word groups of the comparisons (:func:`attnkit.comparison.word_groups.word_group`) and the punctuation
    share of :class:`HeadStatistics` both read it (``bench/punctuation_rules.py`` counts where it differs from the
    two rules it replaced)."""
    text = token.replace("\u2581", "")
    return bool(text) and not any(character.isalnum() for character in text)


class HeadStatistics:
    """Per layer and head of a self-attention stack, over every real word of the batches added: the mean
    entropy (nats; normalised by log of the sentence length, over sentences of two words or more), peak
    weight and effective positions of a word's attention, and the mean share of it on the previous word,
    the next word, the word itself and punctuation (where the sentence has such a word)."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}  # statistic -> (layers, heads) sums
        self.counts: dict[str, Tensor] = {}  # statistic -> (layers, heads) words counted

    def add(self, maps: Sequence[Tensor], lengths: Tensor, punctuation: Tensor) -> None:
        """``maps``: one (B, h, S, S) per layer (rows: the words attending); ``lengths`` (B,); ``punctuation`` (B, S) bool."""
        lengths = lengths.cpu()
        punctuation = punctuation.cpu()
        positions = torch.arange(punctuation.shape[1])
        real = positions < lengths.unsqueeze(1)  # (B, S)
        has_previous = real & (positions >= 1)  # (B, S): rows with a word before them
        has_next = real & (positions + 1 < lengths.unsqueeze(1))  # (B, S)
        long_enough = real & (lengths >= 2).unsqueeze(1)  # (B, S)
        has_punctuation = real & (punctuation & real).any(1, keepdim=True)  # (B, S)
        log_length = lengths.clamp_min(2).float().log().view(-1, 1, 1)  # (B, 1, 1)
        per_layer: dict[str, list[Tensor]] = {name: [] for name in HEAD_STATISTICS}
        masks = {"previous": has_previous, "next": has_next, "normalised_entropy": long_enough, "punctuation": has_punctuation}
        for weights in maps:
            weights = weights.float().cpu()  # (B, h, S, S)
            rows_entropy = entropy(weights)  # (B, h, S)
            values = {
                "entropy": rows_entropy,
                "normalised_entropy": rows_entropy / log_length,
                "peak": peak_weight(weights),
                "effective_positions": rows_entropy.exp(),  # effective_positions(), its entropy already at hand
                "previous": _pad_diagonal(weights.diagonal(offset=-1, dim1=-2, dim2=-1), front=True),  # row i on word i - 1
                "next": _pad_diagonal(weights.diagonal(offset=1, dim1=-2, dim2=-1), front=False),  # row i on word i + 1
                "self": weights.diagonal(dim1=-2, dim2=-1),
                "punctuation": (weights * punctuation.view(punctuation.shape[0], 1, 1, -1)).sum(-1),
            }  # each (B, h, S)
            for name, value in values.items():
                counted = masks.get(name, real).unsqueeze(1).float()  # (B, 1, S)
                per_layer[name].append(torch.stack([(value * counted).sum((0, 2)), counted.sum((0, 2)).expand(value.shape[1])]))  # (2, h)
        for name, layers in per_layer.items():
            stacked = torch.stack(layers)  # (layers, 2, h)
            self.sums[name] = self.sums.get(name, 0) + stacked[:, 0]
            self.counts[name] = self.counts.get(name, 0) + stacked[:, 1]

    def means(self) -> dict[str, list[list[float | None]]]:
        """statistic -> rows of layers, each a list of heads (None where nothing was counted)."""
        return {
            name: [[round(float(s / c), 4) if c > 0 else None for s, c in zip(sum_row, count_row)] for sum_row, count_row in zip(self.sums[name], self.counts[name])]
            for name in self.sums
        }


def _pad_diagonal(diagonal: Tensor, front: bool) -> Tensor:
    """A (B, h, S - 1) off-diagonal back to (B, h, S) with a zero at the ``front`` (the first row has no previous
    word) or at the end (the last has no next)."""
    return torch.nn.functional.pad(diagonal, (1, 0) if front else (0, 1))
