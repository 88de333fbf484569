"""Importance distillation: a captioner's attention pulled towards what each word rests on (issue 45, item 4).

Legend: B captions, T target steps, P grid cells, R windows.

``train.importance_distillation`` (a weight; 0, the default, is off) adds to the training loss, for every target
step of a share of each batch's captions (``train.distillation_share``, spread over the batch), KL(importance || attention): the step's
importance over the grid as the captioner's chosen estimator measures it (:data:`attnkit.importance.CHOSEN`:
windows of 1 x 1 and 2 x 2 cells, each hidden from that step's attention alone, the others renormalised), its
positive part as a distribution, detached: a fixed target at each step, as attention supervision's gold is
(:func:`attnkit.losses.supervision_loss` serves both). POS-SCAN (Zhou et al. 2020) distils an outside alignment
into attention at a weight of 0.1 in the same way; here the alignment comes from the model itself, measured with
the estimator checked on generated scenes.

Cost: each distilled caption runs every step again once per window (85 windows on a 7 x 7 grid), batched over the
windows and captions of a step, without gradients, from the states of one plain forced pass; the share keeps it
to a part of each batch. Only torch is imported here (the loss is part of the model's import); the same estimator
for one caption at a time, through Captum, is :func:`attnkit.importance.importance_maps` (a test holds the two
equal).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import fields, replace

import torch
from torch import Tensor, nn

from attnkit.interfaces import EncoderOutput, Grid, Source
from attnkit.precision import without_autocast

DISTILLED_WINDOWS = (1, 2)  # the window sizes chosen on scenes (bench/importance_scenes.py); attnkit.importance.DEFAULT_WINDOWS is this


def window_within(shape: Sequence[int], size: int, from_attention: bool) -> tuple[int, ...]:
    """The window of side ``size`` over positions laid out as ``shape`` ((rows, columns) of a grid, (S,) of a
    sentence), cut to fit: no side longer than the input's, and, when positions are hidden from the attention, not
    the whole input (its last side one shorter), so something is left to attend to."""
    window = [max(1, min(size, side)) for side in shape]
    if from_attention and list(window) == list(shape):
        window[-1] = max(1, window[-1] - 1)
    return tuple(window)


def window_removals(grid: tuple[int, int], sizes: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Every k x k window of a (rows, columns) grid at stride 1, for each k of ``sizes`` (cut to the grid and short
    of the whole of it: :func:`window_within`): the cells each hides (R, P) bool, and the weights (R, P) that turn
    the windows' losses into each cell's importance as Captum's ``Occlusion`` (:func:`attnkit.importance.window_importance`)
    does: per size, the mean over the windows that cover the cell; the sizes summed."""
    rows, columns = grid
    hidden, weights = [], []
    for size in sizes:
        height, width = window_within(grid, size, from_attention=True)
        windows = torch.zeros(rows - height + 1, columns - width + 1, rows, columns, dtype=torch.bool)
        for top in range(rows - height + 1):
            for left in range(columns - width + 1):
                windows[top, left, top : top + height, left : left + width] = True
        windows = windows.flatten(0, 1).flatten(1)  # (R_k, P)
        hidden.append(windows)
        weights.append(windows.float() / windows.sum(0).clamp_min(1))  # a cell's share of each window covering it
    return torch.cat(hidden), torch.cat(weights)


@functools.lru_cache(maxsize=64)
def window_removals_on(grid: tuple[int, int], sizes: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """:func:`window_removals` on ``device``, copied there once per grid: a copy from the host's memory in every
    training step would wait for the GPU each time. Shared: not to be written to."""
    return tuple(part.to(device) for part in window_removals(grid, sizes))


@torch.no_grad()
def windows_hidden_from_attention(decoder: nn.Module, encoded: EncoderOutput, target: Tensor, sizes: Sequence[int] = DISTILLED_WINDOWS, rows_at_once: int = 1024) -> Tensor:
    """The ``windows`` importance estimator hidden from each step's attention, for a batch of photos over one grid:
    (B, T, P), the log-probability of each step's gold token lost when a window is hidden, made per cell by
    :func:`window_removals`' weights. ``target`` (B, T + 1): <bos> w1 ... <eos>, padded (padded steps get values
    too: mask them). Each step t runs again from its state in the plain forced pass, so only step t sees the window
    gone; every window of up to ``rows_at_once`` rows' worth of photos runs in one batch."""
    if not isinstance(encoded.layout, Grid):
        raise ValueError("importance over windows of cells needs a grid memory (an image encoder's)")
    grid = (encoded.layout.height, encoded.layout.width)
    hidden, weights = window_removals_on(grid, tuple(sizes), encoded.memory.device)  # (R, P)
    windows = hidden.shape[0]
    inputs, gold = target[:, :-1], target[:, 1:]  # (B, T)
    photos, steps = inputs.shape
    per_chunk = max(1, rows_at_once // windows)  # photos whose windows run at once
    lost = torch.zeros(photos, steps, windows, device=encoded.memory.device)  # (B, T, R)
    state = decoder.init_state(encoded)
    for t in range(steps):
        out = decoder.step(inputs[:, t], state)
        plain = out.logits.float().log_softmax(-1).gather(1, gold[:, t : t + 1]).squeeze(1)  # (B,)
        for start in range(0, photos, per_chunk):
            stop = min(photos, start + per_chunk)
            sources = torch.arange(start, stop, device=inputs.device).repeat_interleave(windows)  # (b*R,) each photo once per window
            shown = encoded.mask.index_select(0, sources) & ~hidden.repeat(stop - start, 1)  # (b*R, P)
            intervened = replace(state.select_beams(sources, sources), mask=shown)
            log_p = decoder.step(inputs[sources, t], intervened).logits.float().log_softmax(-1)  # (b*R, V)
            lost[start:stop, t] = (plain[sources] - log_p.gather(1, gold[sources, t].unsqueeze(1)).squeeze(1)).view(stop - start, windows)
        state = out.state
    return lost @ weights  # (B, T, P)


@functools.lru_cache(maxsize=1024)
def distilled_rows(batch_size: int, share: float, device: torch.device = torch.device("cpu")) -> Tensor:
    """Which of a batch's captions are distilled: ceil(share * B) of them (at least one), spread evenly over the batch
    (a batch's captions may be ordered by length: every length gets its turn). (B',) indices on ``device``, made on
    the host and copied once per batch size (a copy every step would wait for the GPU). Shared: not to be written to."""
    count = max(1, min(batch_size, math.ceil(share * batch_size)))
    return torch.linspace(0, batch_size - 1, count).round().long().to(device)


def select_sources(source: Source, rows: Tensor) -> Source:
    """Some of a batch's sources: every tensor field of ``source`` at ``rows``."""
    return replace(source, **{f.name: getattr(source, f.name)[rows.to(getattr(source, f.name).device)] for f in fields(source) if isinstance(getattr(source, f.name), Tensor)})


def distillation_targets(model: nn.Module, source: Source, target: Tensor, is_token: Tensor) -> Tensor:
    """Each target step's importance over the cells as a distribution (B', T, P), detached: its positive part
    normalised; a step that lost nothing anywhere (or a padded step) is all zeros, so it adds nothing to the loss.
    The model runs in eval mode (no dropout: the importance of the model as it decodes) and in fp32 whatever the
    training's autocast (differences of log-probabilities are what bf16 rounds worst: under bf16 the peak cell moved
    on 18 % of a tiny model's steps), as ``attnkit compare``'s forced passes do; its mode is restored."""
    module = getattr(model, "module", model)  # under DistributedDataParallel, the wrapped model: this pass needs no gradient sync
    training = module.training
    module.eval()
    try:
        with torch.no_grad(), without_autocast():
            encoded = module.encode(source)
            importance = windows_hidden_from_attention(module.decoder, encoded, target)  # (B', T, P)
    finally:
        module.train(training)
    lost = importance.float().clamp_min(0.0) * is_token.unsqueeze(-1)  # (B', T, P)
    return lost / lost.sum(-1, keepdim=True).clamp_min(1e-12)
