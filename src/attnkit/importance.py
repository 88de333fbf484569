"""Importance estimators: what each word's log-probability rests on, position by position, in both modalities.

Legend: T forced steps (the target words, then <eos>), P real memory positions of one source (grid cells,
row-major, or source words), M perturbations, N decoder layers, h heads, D memory size.

Attention says where a step looks; importance says what its output used. Every estimator returns a (T, P) map:
for each forced step and each position, how much the step's gold token rests on that position (positive: the
token needs it), and :func:`importance_distribution` makes a distribution of it that is drawn and scored exactly
as attention is (pointing game, in-box mass, alignment).

One code path for both modalities. The modality gives a :class:`HideableSource`: the positions as its input lays
them out (a grid's rows x columns, a sentence's words) and an encoder that takes a *keep* mask and hides the input
under every position the mask drops (a photo's cell greyed in pixels, a word made ``<unk>``), then encodes again
through the whole encoder (:meth:`attnkit.captioning.Captioner.hideable`, :meth:`attnkit.translation.Translator.hideable`).
The perturbation estimators call one function of a *presence map* (1 kept, 0 hidden per position), which hides
the dropped positions where ``hide_at`` says (:data:`HIDING`: at the input, in the memory, or from each step's
attention) and returns every step's log p(gold). Nothing below asks which modality made the source.

=================  ===================================================================  ==========================
estimator          a position's importance                                              computed by
=================  ===================================================================  ==========================
``attention``      hidden from each step's attention alone (the others renormalise)     by hand (needs the
                                                                                        decoder's state per step)
``input``          hidden alone (where: ``hide_at``), the forced pass run again         Captum ``FeatureAblation``
``windows``        windows of k x k cells (k words; k in ``window_sizes``) hidden; per  Captum ``Occlusion``
                   size the mean loss of the windows covering the position, summed
``random_masks``   RISE (Petsiuk et al. 2018): ``masks`` random masks, each position    by hand (not in Captum)
                   hidden with probability ``mask_share``; mean loss when it is
                   hidden less the mean loss when it is kept
``gradients``      integrated gradients of log p(gold) with respect to its memory       Captum
                   vector, from the memory of the wholly hidden input, summed over D    ``IntegratedGradients``
``norm_weighted``  attention times the norm of the position's value vector as the       by hand (reads the
                   step adds it (Kobayashi et al. 2020): a *view* of attention          decoder's weights)
=================  ===================================================================  ==========================

Why more than one position at a time: an object covers several cells, and hiding one of them costs a word that
names the object little, since its neighbours still show it (the redundancy that left single-cell occlusion
pointing at the named object less often than attention does, BENCHMARKS.md "Scenes"). Windows hide whole objects;
random masks hide many positions at once and credit each with the loss its absence goes with.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.analysis import ForcedRun, attention_importance, forced_attention_by_head
from attnkit.distillation import DISTILLED_WINDOWS, window_within
from attnkit.errors import UserError
from attnkit.interfaces import EncoderOutput

ATTENTION_PATH, INPUT_OCCLUSION, WINDOWS, RANDOM_MASKS, GRADIENTS, NORM_WEIGHTED = "attention", "input", "windows", "random_masks", "gradients", "norm_weighted"
ESTIMATORS = (ATTENTION_PATH, INPUT_OCCLUSION, WINDOWS, RANDOM_MASKS, GRADIENTS, NORM_WEIGHTED)
IMPORTANCE_LABELS = {  # figures, reports (importance_label adds where a perturbation estimator hid positions)
    ATTENTION_PATH: "importance through attention",
    INPUT_OCCLUSION: "importance, one position hidden",
    WINDOWS: "importance, windows of positions hidden",
    RANDOM_MASKS: "importance, random masks",
    GRADIENTS: "integrated gradients",
    NORM_WEIGHTED: "norm-weighted attention",
}
PERTURBING = (INPUT_OCCLUSION, WINDOWS, RANDOM_MASKS)  # the estimators that hide positions where hide_at says
# What compare computes unless told otherwise: the estimator chosen on validation scenes for each modality
# (CHOSEN; docs/comparison.md, "The instrument checked on scenes", has their figures) and importance through
# attention, the form every earlier figure read beside importance from the input.
DEFAULT_ESTIMATORS = (ATTENTION_PATH, INPUT_OCCLUSION, WINDOWS)
DEFAULT_WINDOWS = DISTILLED_WINDOWS  # one definition: the sizes chosen on scenes, also what training distils
# The estimators that read the output of an intervention (what the word lost); norm_weighted reweights attention.
ESTIMATES_OF_IMPORTANCE = (ATTENTION_PATH, INPUT_OCCLUSION, WINDOWS, RANDOM_MASKS, GRADIENTS)


# Where the perturbation estimators hide a position: at the *input* (a cell's pixels greyed, a word made <unk>, then
# encoded again through the whole encoder, so a backbone's neighbouring cells see the change too); in the *memory*
# (the position's memory vector replaced by the one it has when the whole input is hidden, nothing else recomputed:
# the decoder's initial state keeps the whole input), which keeps a cell's change to the cell; or from each step's
# *attention* (taken out of that step's attention alone, the others renormalised, as the ``attention`` estimator
# hides one position).
HIDING = ("input", "memory", "attention")
MODALITIES = ("image", "text")  # what a HideableSource comes from: where it is hidden may differ (hide_at)
# Where each modality's positions are hidden unless told otherwise, as chosen on validation scenes: a grid's cells
# from each step's attention (windows of 1-2 cells point at the named object in 93-94 % of the words hidden from
# attention, 83-93 % in the memory, 76-81 % at the input, where the backbone carries a cell's grey to its
# neighbours), a sentence's words at the input (a word made <unk>: the lowest AER over content words, 0.009 / 0.0).
DEFAULT_HIDING = {"image": "attention", "text": "input"}
HIDING_LABELS = {"input": "at the input", "memory": "in the memory", "attention": "from attention"}
POSITION_NAMES = {"image": "cells", "text": "words"}
# The estimator each modality's importance is read from, chosen on validation scenes (bench/importance_scenes.py).
CHOSEN = {"image": WINDOWS, "text": INPUT_OCCLUSION}


@dataclass(frozen=True)
class ImportanceSettings:
    """The estimators to run and their settings; checked when made, before any work."""

    estimators: tuple[str, ...] = DEFAULT_ESTIMATORS
    window_sizes: tuple[int, ...] = DEFAULT_WINDOWS  # windows: side in cells (a k x k window) or length in words
    masks: int = 256  # random_masks: how many
    mask_share: float = 0.5  # random_masks: the share of positions each mask hides
    gradient_steps: int = 32  # gradients: points on the path from the hidden memory to the real one
    # input, windows, random_masks: where a position is hidden (HIDING), one place for both modalities or per modality
    # ({"image": ..., "text": ...}; a modality not named keeps DEFAULT_HIDING's); read back as a full mapping
    hide_at: str | Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_HIDING))
    batch_size: int = 25  # perturbed inputs encoded and decoded at once (25 photos through a backbone: the page's memory bound)
    seed: int = 0  # random_masks: the same seed draws the same masks

    def __post_init__(self) -> None:
        unknown = [name for name in self.estimators if name not in ESTIMATORS]
        if unknown or not self.estimators:
            raise UserError(f"unknown importance estimator {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(ESTIMATORS)}")
        if len(set(self.estimators)) != len(self.estimators):
            raise UserError(f"an importance estimator is named twice: {', '.join(self.estimators)}")
        if not self.window_sizes or any(not isinstance(size, int) or size < 1 for size in self.window_sizes):
            raise UserError(f"window sizes must be whole numbers of 1 or more, got {', '.join(map(str, self.window_sizes)) or 'none'}")
        if not isinstance(self.masks, int) or self.masks < 1:
            raise UserError(f"the number of random masks must be 1 or more, got {self.masks}")
        if not 0.0 < self.mask_share < 1.0:
            raise UserError(f"the share of positions a random mask hides must lie strictly between 0 and 1, got {self.mask_share}")
        places = dict.fromkeys(MODALITIES, self.hide_at) if isinstance(self.hide_at, str) else {**DEFAULT_HIDING, **self.hide_at}
        unknown_modalities = [name for name in places if name not in MODALITIES]
        if unknown_modalities:
            raise UserError(f"unknown modality {', '.join(map(repr, unknown_modalities))} to hide positions of; name {' or '.join(MODALITIES)}")
        for place in places.values():
            if place not in HIDING:
                raise UserError(f"unknown place to hide a position '{place}'; choose one of {', '.join(HIDING)}")
        object.__setattr__(self, "hide_at", places)  # frozen: normalised once, here
        for name in ("gradient_steps", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', ' ')} must be 1 or more, got {getattr(self, name)}")

    def as_arguments(self) -> list[str]:
        """These settings as ``attnkit compare``'s options (:func:`add_importance_arguments`), to hand to a subprocess."""
        return [
            "--importance", ",".join(self.estimators), "--windows", ",".join(map(str, self.window_sizes)), "--masks", str(self.masks),
            "--mask-share", str(self.mask_share), "--hide-at", ",".join(f"{modality}={place}" for modality, place in self.hide_at.items()),
        ]  # fmt: skip

    def place(self, modality: str) -> str:
        """Where the perturbation estimators hide a position of ``modality`` (:data:`HIDING`)."""
        return self.hide_at[modality]

    def check_grid(self, grid: tuple[int, int]) -> None:
        """Refuse windows larger than an image grid (rows, columns) before any work. (A sentence shorter than a
        window is hidden whole by it: its length is not known until it is read.)"""
        if WINDOWS in self.estimators and max(self.window_sizes) > min(grid):
            raise UserError(f"a window of {max(self.window_sizes)} x {max(self.window_sizes)} cells does not fit the {grid[0]} x {grid[1]} grid: give smaller --windows")


@dataclass(frozen=True)
class HideableSource:
    """One source whose positions can be hidden at the input: ``shape`` lays the P positions out as the input does
    ((rows, columns) of a grid, (S,) of a sentence); ``encode_keeping`` takes keep masks (B, *shape) bool (False:
    hide that position's input) and returns the encoder's output for each (B rows) through the whole encoder;
    ``modality`` (:data:`MODALITIES`) says which of the settings' places to hide it at (``hide_at``)."""

    shape: tuple[int, ...]
    encode_keeping: Callable[[Tensor], EncoderOutput]
    modality: str


def at_memory(source: HideableSource, device: torch.device) -> HideableSource:
    """``source`` hidden in the memory rather than at the input (see :data:`HIDING`): its memory with every position
    kept and with every position hidden, encoded once each; a keep mask takes each position's vector from the one
    or the other. The same positions and layout as ``source``."""
    every = torch.ones(1, *source.shape, dtype=torch.bool, device=device)
    whole, hidden = source.encode_keeping(every), source.encode_keeping(~every)

    def encode_keeping(keep: Tensor) -> EncoderOutput:
        rows = keep.shape[0]
        kept = torch.zeros(rows, whole.mask.shape[1], dtype=torch.bool, device=device)  # (B, L): padding, if any, never kept
        kept[:, whole.mask[0]] = keep.reshape(rows, -1)
        memory = torch.where(kept.unsqueeze(-1), whole.memory, hidden.memory)  # (B, L, D)
        return EncoderOutput(memory, whole.mask.expand(rows, -1), whole.init_state.expand(rows, -1), whole.layout)

    return HideableSource(source.shape, encode_keeping, source.modality)


def gold_log_probs(decoder, encoded: EncoderOutput, target: Tensor) -> Tensor:
    """log p of each gold token under teacher forcing, for every row of ``encoded`` (B, T); ``target`` (T + 1,) is
    <bos> w1 ... <eos>."""
    target = target.to(encoded.memory.device)
    inputs, gold = target[:-1], target[1:]  # (T,), (T,)
    rows = encoded.batch_size
    logits = decoder(encoded, inputs.expand(rows, -1), need_attention=False).logits.float()  # (B, T, V)
    return logits.log_softmax(-1).gather(2, gold.view(1, -1, 1).expand(rows, -1, 1)).squeeze(2)  # (B, T)


class KeptPositions:
    """log p(gold) (B, T) as a function of a presence map (B, *shape) (1 kept, 0 hidden) over one source's positions:
    the forward function every perturbation estimator calls (Captum's ablations set a hidden position's presence to
    the baseline 0). Here the hidden positions are hidden by ``source`` (at the input, or in the memory:
    :func:`at_memory`) and the whole forced pass runs again."""

    def __init__(self, decoder, source: HideableSource, target: Tensor, batch_size: int):
        self.decoder, self.source, self.target, self.batch_size = decoder, source, target, batch_size
        self.shape = source.shape

    @torch.no_grad()
    def __call__(self, presence: Tensor) -> Tensor:
        keep = presence > 0.5  # (B, *shape)
        parts = [gold_log_probs(self.decoder, self.source.encode_keeping(keep[start : start + self.batch_size]), self.target) for start in range(0, keep.shape[0], self.batch_size)]
        return torch.cat(parts)  # (B, T)


class HiddenFromAttention:
    """The same function with the hidden positions taken out of each step's attention instead (the others
    renormalise): each step rerun from its state in the plain forced run, so step t's loss is the intervention on
    step t alone, as the ``attention`` estimator does it one position at a time (:func:`attnkit.analysis.erasure`
    says why). A presence map that hides every position leaves the attention nothing to read: refused."""

    def __init__(self, decoder, encoded: EncoderOutput, target: Tensor, shape: tuple[int, ...], batch_size: int):
        self.forced = ForcedRun.of(decoder, encoded, target, "importance hidden from attention")
        self.real_index = encoded.mask[0].nonzero().squeeze(1)  # (P,)
        self.shape, self.batch_size = shape, batch_size

    @torch.no_grad()
    def __call__(self, presence: Tensor) -> Tensor:
        keep = (presence > 0.5).reshape(presence.shape[0], -1)  # (B, P)
        if not keep.any(1).all():
            raise ValueError("a presence map hides every position from the attention: there is nothing left to attend to")
        parts = []
        for start in range(0, keep.shape[0], self.batch_size):
            chunk = keep[start : start + self.batch_size]  # (R, P)
            removed = torch.zeros(chunk.shape[0], self.forced.real.shape[0], dtype=torch.bool, device=chunk.device)  # (R, L)
            removed[:, self.real_index] = ~chunk
            lost, _ = self.forced.remove(removed.unsqueeze(0).expand(self.forced.steps, -1, -1))  # (T, R)
            parts.append(self.forced.gold_log_p.unsqueeze(0) - lost.t())  # (R, T)
        return torch.cat(parts)


PresenceModel = KeptPositions | HiddenFromAttention


def _presence(forward: PresenceModel, device: torch.device) -> Tensor:
    return torch.ones(1, *forward.shape, device=device)  # (1, *shape): every position kept


def _positions(shape: tuple[int, ...]) -> int:
    return int(torch.tensor(shape).prod())


def input_importance(forward: PresenceModel, settings: ImportanceSettings, device: torch.device) -> Tensor:
    """Each position hidden alone: log p(gold) lost, (T, P). Captum's ``FeatureAblation`` with each position its own
    feature and a presence of 0 as the baseline."""
    from captum.attr import FeatureAblation  # Captum's import takes seconds: only where it is used

    presence = _presence(forward, device)
    features = torch.arange(_positions(forward.shape), device=device).view(1, *forward.shape)
    found = FeatureAblation(forward).attribute(presence, baselines=0.0, feature_mask=features, perturbations_per_eval=settings.batch_size)
    return found.reshape(found.shape[0], -1).float().cpu()  # (T, P)


def window_importance(forward: PresenceModel, settings: ImportanceSettings, device: torch.device) -> Tensor:
    """Sliding windows over the positions (k x k cells of a grid, k consecutive words), stride one, for each size k
    of ``settings.window_sizes``: each size's map is the mean log p(gold) lost over the windows that cover the
    position (Captum's ``Occlusion``), and the sizes' maps are summed. A window larger than the input is cut to it
    (hidden from the attention: short of the whole input, so something is left to attend to; :func:`window_within`). (T, P)"""
    from captum.attr import Occlusion

    presence = _presence(forward, device)
    total = None
    for size in settings.window_sizes:
        window = window_within(forward.shape, size, from_attention=isinstance(forward, HiddenFromAttention))
        found = Occlusion(forward).attribute(
            presence, sliding_window_shapes=window, strides=(1,) * len(window), baselines=0.0, perturbations_per_eval=settings.batch_size
        )  # (T, *shape)
        total = found if total is None else total + found
    return total.reshape(total.shape[0], -1).float().cpu()  # (T, P)


def random_masks(positions: int, masks: int, share: float, generator: torch.Generator) -> Tensor:
    """``masks`` keep masks (M, P) bool, each position hidden with probability ``share``, independently of the others
    (as RISE draws them): so whether one position is hidden says nothing of another, and the difference of the mean
    losses with a position hidden and kept is what its own absence costs (for losses that add up, without bias)."""
    keep = torch.rand(masks, positions, generator=generator) >= share
    nothing_kept = ~keep.any(1)  # (M,) rare but for the shortest sources: keep one position, drawn from the same generator
    keep[nothing_kept, torch.randint(positions, (int(nothing_kept.sum()),), generator=generator)] = True
    return keep


def random_mask_importance(forward: PresenceModel, settings: ImportanceSettings, device: torch.device) -> Tensor:
    """RISE at the memory's resolution: ``settings.masks`` random masks (:func:`random_masks`), each position hidden
    with probability ``settings.mask_share``; a position's importance is the mean log p(gold) lost over the masks
    that hide it less the mean over the masks that keep it (the mean over all masks is common to every position,
    and would only lift the whole map). Seeded by ``settings.seed``: the same masks every time. (T, P)"""
    presence = _presence(forward, device)
    keep = random_masks(_positions(forward.shape), settings.masks, settings.mask_share, torch.Generator().manual_seed(settings.seed))  # (M, P)
    full = forward(presence)  # (1, T)
    lost = (full - forward(keep.view(-1, *forward.shape).float().to(device))).float().cpu()  # (M, T)
    hidden = (~keep).float()  # (M, P)
    hidden_mean = hidden.t() @ lost / hidden.sum(0).clamp_min(1).unsqueeze(1)  # (P, T)
    kept_mean = keep.float().t() @ lost / keep.float().sum(0).clamp_min(1).unsqueeze(1)  # (P, T)
    seen_both = (hidden.sum(0) > 0) & (keep.sum(0) > 0)  # (P,) a position never hidden (or never kept) has no estimate
    return torch.where(seen_both.unsqueeze(1), hidden_mean - kept_mean, torch.zeros_like(hidden_mean)).t()  # (T, P)


def gradient_importance(decoder, encoded: EncoderOutput, source: HideableSource, target: Tensor, settings: ImportanceSettings) -> Tensor:
    """Integrated gradients (Sundararajan et al. 2017, Captum's ``IntegratedGradients``) of each step's log p(gold)
    with respect to the memory, from the memory of the input with every position hidden to ``encoded`` (one source),
    summed over each position's D features: (T, P). The T steps are T rows of one call (each row's own target)."""
    from captum.attr import IntegratedGradients

    steps = target.shape[0] - 1
    hidden = source.encode_keeping(torch.zeros(1, *source.shape, dtype=torch.bool, device=encoded.memory.device))
    real = encoded.mask[0]  # (L,)

    def log_probs(memory: Tensor) -> Tensor:  # (B, L, D) -> (B, T)
        rows = memory.shape[0]
        with_memory = EncoderOutput(memory, encoded.mask.expand(rows, -1), encoded.init_state.expand(rows, -1), encoded.layout)
        return gold_log_probs(decoder, with_memory, target)

    memory = encoded.memory.detach().float().expand(steps, -1, -1).contiguous()  # (T, L, D): row t answers for step t
    baseline = hidden.memory.detach().float().expand(steps, -1, -1).contiguous()
    with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):  # cuDNN's RNN has no backward in eval mode
        found = IntegratedGradients(log_probs).attribute(
            memory, baselines=baseline, target=list(range(steps)), n_steps=settings.gradient_steps, internal_batch_size=settings.batch_size
        )  # (T, L, D)
    return found.sum(-1)[:, real].detach().float().cpu()  # (T, P)


def norm_weighted_attention(attention: Tensor, values: Tensor, layer: int, head: int) -> Tensor:
    """Attention weighted by the norm of what each position adds to the step's output (Kobayashi et al. 2020,
    "Attention is not only a weight"), as a distribution per step.

    ``attention`` (T, N, h, P): every layer's and head's attention; ``values`` (N, h, P, M): each position's value
    vector as head h of layer n adds it to the output (:meth:`value_vectors` of the decoder). One head (``head``
    >= 0): alpha_h(p) ||f_h(p)||; a layer's heads together (``head`` -1, the mean of heads): ||sum_h alpha_h(p)
    f_h(p)||. (T, P), rows summing to 1."""
    weights, vectors = attention[:, layer].float(), values[layer].float()  # (T, h, P), (h, P, M)
    if head >= 0:
        scores = weights[:, head] * vectors[head].norm(dim=-1)  # (T, P)
    else:
        scores = torch.einsum("thp,hpm->tpm", weights, vectors).norm(dim=-1)  # (T, P)
    return scores / scores.sum(-1, keepdim=True).clamp_min(1e-12)


def real_values(decoder, encoded: EncoderOutput) -> Tensor:
    """The value vectors of one source's real positions, every layer and head (N, h, P, M), on the CPU."""
    return decoder.value_vectors(encoded)[0][..., encoded.mask[0], :].float().cpu()


def declared_head(decoder) -> tuple[int, int]:
    """The (layer, head) a decoder declares as its attention (head -1: the mean of the layer's heads); an RNN's is its one."""
    return getattr(decoder, "attention_layer", 0), getattr(decoder, "attention_head", -1)


def presence_model(decoder, encoded: EncoderOutput, source: HideableSource, target: Tensor, settings: ImportanceSettings) -> PresenceModel:
    """The forward function of the perturbation estimators for where ``settings`` hide the source's modality (:data:`HIDING`)."""
    place = settings.place(source.modality)
    if place == "attention":
        return HiddenFromAttention(decoder, encoded, target, source.shape, settings.batch_size)
    hideable = at_memory(source, encoded.memory.device) if place == "memory" else source
    return KeptPositions(decoder, hideable, target, settings.batch_size)


def importance_maps(decoder, encoded: EncoderOutput, source: HideableSource, target: Tensor, settings: ImportanceSettings) -> dict[str, Tensor]:
    """Every estimator of ``settings`` for one source, {estimator: (T, P)} in the order asked, each row a forced
    step (target words, then <eos>) as forced attention gives them. ``encoded``: the source as the comparison
    attends over it (through attention, norm-weighted); ``source``: the same input, hideable."""
    real = encoded.mask[0].cpu()
    device = encoded.memory.device
    target = target.to(device)
    perturbing = dict(zip(PERTURBING, (input_importance, window_importance, random_mask_importance)))
    forward = presence_model(decoder, encoded, source, target, settings) if perturbing.keys() & set(settings.estimators) else None
    maps = {}
    for name in settings.estimators:
        if name == ATTENTION_PATH:
            maps[name] = attention_importance(decoder, encoded, target)[:, real]
        elif name == INPUT_OCCLUSION and isinstance(forward, HiddenFromAttention) and ATTENTION_PATH in maps:
            maps[name] = maps[ATTENTION_PATH]  # one position hidden from attention is the attention estimator: not run twice
        elif name in perturbing and isinstance(forward, HiddenFromAttention) and int(real.sum()) < 2:
            # One position: hiding it from the attention leaves nothing to attend to, so nothing is measured (NaN, as
            # the attention estimator gives there; null in the JSON), where it was a traceback.
            maps[name] = torch.full((forward.forced.steps, int(real.sum())), float("nan"))
        elif name in perturbing:
            maps[name] = perturbing[name](forward, settings, device)
        elif name == GRADIENTS:  # from the memory the hidden versions are compared with (a feature cache's differs a little)
            plain = source.encode_keeping(torch.ones(1, *source.shape, dtype=torch.bool, device=device))
            maps[name] = gradient_importance(decoder, plain, source, target, settings)
        else:  # NORM_WEIGHTED
            _, heads = forced_attention_by_head(decoder, encoded, target.unsqueeze(0))
            maps[name] = norm_weighted_attention(heads[0], real_values(decoder, encoded), *declared_head(decoder))
    return maps


def importance_label(form: str, places: Mapping[str, str] | None = None) -> str:
    """An estimator's name in figures and reports. A perturbation estimator's says where it hid positions: ``places``
    (modality -> place, as ``ImportanceSettings.hide_at``; give one modality's for that modality's panel) when they
    are known, e.g. "importance, one position hidden from attention"."""
    label = IMPORTANCE_LABELS[form]
    if form not in PERTURBING or not places:
        return label
    if len(set(places.values())) == 1:
        return f"{label} {HIDING_LABELS[next(iter(places.values()))]}"
    return f"{label} ({', '.join(f'{POSITION_NAMES[modality]} {HIDING_LABELS[place]}' for modality, place in places.items())})"


def importance_distribution(importance: Tensor) -> Tensor:
    """Importance (T, L) as a distribution over positions per step, to draw it and score it as attention is
    scored (pointing game, in-box mass, alignment): the positive part (log-probability the token lost)
    normalised to sum to 1; a step that lost nothing anywhere is uniform over its known (not NaN) positions."""
    known = ~importance.isnan()  # (T, L) NaN: no importance there (padding, or a source of one position)
    lost = importance.float().nan_to_num(0.0).clamp_min(0.0)  # (T, L)
    total = lost.sum(-1, keepdim=True)  # (T, 1)
    uniform = known.float() / known.sum(-1, keepdim=True).clamp_min(1)  # over the known positions
    return torch.where(total > 0, lost / total.clamp_min(1e-12), uniform)


def as_settings(importance: "bool | ImportanceSettings") -> ImportanceSettings | None:
    """What an ``importance`` argument asks for: True the default settings, settings themselves, False none (None)."""
    return ImportanceSettings() if importance is True else importance or None


def add_importance_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that make :class:`ImportanceSettings` (``attnkit compare``, ``bench/importance_cost.py``):
    :func:`settings_from_arguments` reads them back."""
    defaults = ImportanceSettings()
    parser.add_argument(
        "--importance", type=parse_estimators, default=defaults.estimators, metavar="NAMES",
        help=f"the importance estimators, separated by commas, from {', '.join(ESTIMATORS)} (default {','.join(defaults.estimators)}; "
        "docs/comparison.md says what each measures, what it costs and how each scores on scenes)",
    )  # fmt: skip
    parser.add_argument("--windows", type=parse_sizes, default=defaults.window_sizes, metavar="SIZES", help="windows: their sides in cells (lengths in words), e.g. 1,2,3")
    parser.add_argument("--masks", type=int, default=defaults.masks, help=f"random_masks: how many (default {defaults.masks})")
    parser.add_argument("--mask-share", type=float, default=defaults.mask_share, help=f"random_masks: the share of positions each hides (default {defaults.mask_share})")
    default_places = ",".join(f"{modality}={place}" for modality, place in defaults.hide_at.items())
    parser.add_argument(
        "--hide-at", type=parse_hiding, default=defaults.hide_at, metavar="PLACE",
        help=f"input, windows, random_masks: hide a position at the {' | '.join(HIDING)} (pixels greyed or a word made <unk>, encoded again; its memory "
        "vector replaced by that of the wholly hidden input; taken out of each step's attention), one place for both modalities or per modality, "
        f"e.g. image=memory,text=input (default {default_places}: chosen on validation scenes)",
    )  # fmt: skip


def settings_from_arguments(args: argparse.Namespace) -> ImportanceSettings:
    """The settings :func:`add_importance_arguments`' options give (a bad one is one message, before any work)."""
    return ImportanceSettings(args.importance, args.windows, args.masks, args.mask_share, hide_at=args.hide_at)


def parse_estimators(text: str) -> tuple[str, ...]:
    """``--importance windows,random_masks`` -> ("windows", "random_masks") (checked by :class:`ImportanceSettings`)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_hiding(text: str) -> str | dict[str, str]:
    """``--hide-at memory`` -> "memory" (both modalities); ``--hide-at image=memory,text=input`` -> {"image": "memory",
    "text": "input"} (checked by :class:`ImportanceSettings`)."""
    if "=" not in text:
        return text.strip()
    places = {}
    for part in filter(str.strip, text.split(",")):
        modality, equals, place = part.partition("=")
        if not equals:
            raise UserError(f"--hide-at: give one place, or MODALITY=PLACE pairs separated by commas (e.g. image=memory,text=input), got {text!r}")
        places[modality.strip()] = place.strip()
    return places


def parse_sizes(text: str) -> tuple[int, ...]:
    """``--windows 1,2,3`` -> (1, 2, 3); a part that is not a whole number is one message."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"window sizes are whole numbers separated by commas (e.g. 1,2,3), got {text!r}") from None
