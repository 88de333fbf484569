"""Attention figures, written to files.

Each figure is a ``matplotlib.figure.Figure`` on its own Agg canvas: no screen is needed, and
pyplot's backend (a notebook's, say) is neither read nor changed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.patches
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from attnkit.files import atomic_path


# Words, sentences and titles are the data's: a "$" in one ("$5", "$^$") must be drawn as typed, not parsed as
# matplotlib's mathtext (which drew "$x$" as math and raised on "$^$"). Each function that draws text runs in it.
_plain_text = matplotlib.rc_context({"text.parse_math": False})


LABEL_CHARACTERS = 30  # a source word's label is cut here: the words are the user's text, and one of megabytes
# would be laid out glyph by glyph (minutes), and make the figure as tall as the word is long


def _labels(words: Sequence[str]) -> list[str]:
    """Source words as tick labels, each at most ``LABEL_CHARACTERS`` long (a longer one ends in an ellipsis)."""
    return [word if len(word) <= LABEL_CHARACTERS else word[: LABEL_CHARACTERS - 1] + "\u2026" for word in words]


def _new_figure(**options) -> Figure:
    """A figure (``options`` as for ``Figure``) drawn on its own Agg canvas, outside pyplot."""
    figure = Figure(**options)
    FigureCanvasAgg(figure)  # attaches itself as figure.canvas
    return figure


@_plain_text
def plot_attention_matrix(attention: Tensor, source_words: Sequence[str], target_words: Sequence[str], path: str | Path, title: str = "") -> Path:
    """Heatmap of attention (T, S): one row per output word, one column per source word."""
    weights = attention.float().cpu().numpy()
    rows, columns = weights.shape
    if rows != len(target_words) or columns != len(source_words):
        raise ValueError(f"attention is {rows}x{columns} but there are {len(target_words)} target and {len(source_words)} source words")
    figure = _new_figure(figsize=(1.0 + 0.45 * columns, 1.0 + 0.4 * rows))
    axes = figure.subplots()
    image = axes.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), labels=_labels(source_words), rotation=60, ha="right")
    axes.set_yticks(range(rows), labels=list(target_words))
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    return save_figure(figure, path)


def attention_maps(attention: Tensor, grid: tuple[int, int], size: tuple[int, int]) -> Tensor:
    """Attention over grid cells (T, h*w), row-major, upsampled to an image's (height, width): (T, height, width)."""
    import torch.nn.functional as F

    height, width = grid
    maps = attention.float().cpu().view(-1, 1, height, width)  # (T, 1, h, w)
    return F.interpolate(maps, size=size, mode="bilinear", align_corners=False)[:, 0]  # (T, H, W)


FIGURE_DPI = 110
DISPLAY_PIXELS = 320  # the long side of a photo as a figure or report shows it (a panel is about 2 inches at 110 dpi)


def display_image(image, longest: int = DISPLAY_PIXELS):
    """``image`` (PIL) no larger than ``longest`` pixels on its long side, for drawing: a photo of many megapixels
    blended with one map per word at full size costs seconds and gigabytes per word, and shows nothing more."""
    from PIL import Image

    width, height = image.size
    if max(width, height) <= longest:
        return image
    scale = longest / max(width, height)
    return image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BICUBIC, reducing_gap=2.0)


@_plain_text
def plot_image_attention(image, words: Sequence[str], attention: Tensor, grid: tuple[int, int], path: str | Path, title: str = "", columns: int = 5) -> Path:
    """The image, then one panel per generated word with its attention map upsampled and overlaid.

    ``image`` is a PIL image (shown as given, at display size: :func:`display_image`); ``attention`` is
    (T, h*w) with T == len(words), ``grid`` the (h, w) of the encoder's layout.
    """
    import numpy as np

    if attention.shape[0] != len(words) or attention.shape[1] != grid[0] * grid[1]:
        raise ValueError(f"attention is {tuple(attention.shape)} but there are {len(words)} words and a {grid[0]}x{grid[1]} grid")
    pixels = np.asarray(display_image(image))
    maps = attention_maps(attention, grid, pixels.shape[:2]).numpy()
    panels = 1 + len(words)
    rows = (panels + columns - 1) // columns
    figure = _new_figure(figsize=(2.2 * columns, 2.3 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index >= panels:
            continue
        axis.imshow(pixels)
        if index == 0:
            axis.set_title("input", fontsize=9)
            continue
        weights = maps[index - 1]
        axis.imshow(weights / max(float(weights.max()), 1e-8), cmap="jet", alpha=0.45, vmin=0.0, vmax=1.0)
        axis.set_title(words[index - 1], fontsize=10)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path)


def save_figure(figure, path: str | Path) -> Path:
    """Write a figure atomically (a half-written PNG never replaces a good one)."""
    with atomic_path(path) as temporary:
        # PNG at zlib level 3: a third of the default's encoding time for a tenth more bytes (photo panels compress poorly)
        faster = {"pil_kwargs": {"compress_level": 3}} if Path(path).suffix.lower() == ".png" else {}
        figure.savefig(temporary, dpi=FIGURE_DPI, **faster)
    return Path(path)


def overlays(image, attention: Tensor, grid: tuple[int, int], alpha: float = 0.5, longest: int = DISPLAY_PIXELS) -> list:
    """PIL images at display size (:func:`display_image`; ``longest`` pixels on the long side), one per row of
    ``attention`` (T, L): ``image`` with that row's map over its (h, w) grid upsampled and blended in."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(display_image(image, longest).convert("RGB"), dtype=np.float32) / 255.0  # (H, W, 3)
    blended = []
    for heat in attention_maps(attention, grid, pixels.shape[:2]).numpy():  # (H, W) per step
        colours = matplotlib.colormaps["jet"](heat / max(float(heat.max()), 1e-8))[..., :3]  # (H, W, 3)
        blended.append(Image.fromarray(((1 - alpha) * pixels * 255 + alpha * colours * 255).clip(0, 255).astype(np.uint8)))
    return blended


@_plain_text
def plot_cross_modal(
    image, comparison, path: str | Path, title: str = "", columns: int = 6, source_lengths: Sequence[int] | None = None, own: int | None = None
) -> Path:
    """Per target word its attention over the image (the panels, in reading order), and below them every word's
    attention over the source words as one matrix (a row per target word, a column per source word).

    ``comparison`` is an :class:`attnkit.comparison.Comparison`. For a mosaic comparison, ``source_lengths``
    (each joined sentence's tokens) draws the sentence borders and ``own`` frames the described input's
    sentence and splits the image panels into their quadrants."""
    words, sources = comparison.target_words, _labels(comparison.source_words)
    blocks = (len(words) + columns - 1) // columns
    panel = 1.9  # inches per image panel
    matrix_height = 0.8 + 0.2 * len(words) + 0.075 * max(len(source) for source in sources)  # rows, then the rotated labels
    figure = _new_figure(figsize=(max(panel * columns, 1.5 + 0.2 * len(sources)), (panel + 0.3) * blocks + matrix_height + 0.4), layout="constrained")
    grid = figure.add_gridspec(blocks + 1, columns, height_ratios=[panel + 0.3] * blocks + [matrix_height])
    pictures = overlays(image, comparison.image_attention, comparison.grid)
    for t in range(blocks * columns):
        picture = figure.add_subplot(grid[t // columns, t % columns])
        picture.axis("off")
        if t < len(words):
            picture.imshow(pictures[t])
            picture.set_title(words[t], fontsize=11)
            if own is not None:  # the mosaic's quadrants
                width, height = pictures[t].size
                picture.axvline(width / 2, color="white", linewidth=0.8)
                picture.axhline(height / 2, color="white", linewidth=0.8)
    matrix = figure.add_subplot(grid[blocks, :])
    weights = comparison.text_attention.float().cpu().numpy()  # (T, S)
    matrix.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    matrix.set_xticks(range(len(sources)), labels=sources, rotation=90, fontsize=8)
    matrix.set_yticks(range(len(words)), labels=words, fontsize=8)
    matrix.tick_params(length=0)
    matrix.set_ylabel("target word", fontsize=9)
    matrix.set_title("attention over the source words (each row sums to 1)", fontsize=10)
    if source_lengths is not None:
        borders = [sum(source_lengths[: k + 1]) - 0.5 for k in range(len(source_lengths) - 1)]
        for border in borders:
            matrix.axvline(border, color="grey", linewidth=0.8)
        if own is not None:
            start = sum(source_lengths[:own]) - 0.5
            matrix.add_patch(matplotlib.patches.Rectangle((start, -0.5), source_lengths[own], len(words), fill=False, edgecolor="tab:red", linewidth=1.5))
    if title:
        figure.suptitle(title, fontsize=11)
    return save_figure(figure, path)


def _strip(pictures: list, count: int, gap: int = 8):
    """``count`` panels side by side as one RGB array (H, count * W + gaps, 3), white where a picture is missing:
    one image per row of a figure draws many times faster than one axes per panel."""
    import numpy as np

    width, height = pictures[0].size
    strip = np.full((height, count * width + (count - 1) * gap, 3), 255, dtype=np.uint8)
    for k, picture in enumerate(pictures[:count]):
        strip[:, k * (width + gap) : k * (width + gap) + width] = np.asarray(picture.convert("RGB"))
    return strip, [k * (width + gap) + width / 2 for k in range(count)]


def distinct_views(views: Sequence[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
    """``views`` (label, map) with a map that several share (the same tensor: e.g. one position hidden from attention,
    which is importance through attention) kept once, at its first place, under their labels joined by " = "."""
    kept: list[tuple[str, Tensor]] = []
    for label, rows in views:
        same = next((k for k, (_, seen) in enumerate(kept) if seen is rows), None)
        if same is None:
            kept.append((label, rows))
        else:
            kept[same] = (f"{kept[same][0]} = {label}", rows)
    return kept


@_plain_text
def plot_importance(image, comparison, path: str | Path, title: str = "", columns: int = 6) -> Path:
    """Each target word's attention beside its importance maps (:mod:`attnkit.importance`), in both modalities.

    Over the image: per block of ``columns`` words, a row of attention overlays, then a row per importance estimator
    the comparison holds (the positive part, normalised per word, so the most important cell is red). Over the source
    words: matrices side by side, attention and each estimator, a row per target word. Two estimators that give the
    same map (one position hidden from attention is importance through attention) share one row or matrix. ``comparison`` is an
    :class:`attnkit.comparison.Comparison` holding importance maps (``compare(importance=True)``)."""
    from attnkit.importance import importance_distribution

    maps = comparison.importance()
    words, sources = comparison.target_words, _labels(comparison.source_words)
    image_views, text_views = (
        distinct_views([("attention", attention)] + [(comparison.importance_label(form, modality), maps[modality][form]) for form in comparison.estimators()])
        for modality, attention in (("image", comparison.image_attention), ("text", comparison.text_attention))
    )  # (label, rows) per modality, a map that two estimators share drawn once; each drawn as a distribution (attention is one)
    blocks = (len(words) + columns - 1) // columns
    panel = 1.6  # inches per image panel
    pictures = [overlays(image, importance_distribution(rows), comparison.grid, longest=round(panel * FIGURE_DPI)) for _, rows in image_views]
    width, height = pictures[0][0].size
    strip_height = panel * height / width + 0.3  # inches: the panels, then the words above them
    matrix_height = 0.8 + 0.2 * len(words) + 0.075 * max(len(source) for source in sources)
    rows_per_block = len(image_views)
    figure = _new_figure(
        figsize=(max(panel * columns + 1.2, 3 * (1.5 + 0.2 * len(sources))), strip_height * blocks * rows_per_block + matrix_height + 0.5), layout="constrained"
    )
    grid = figure.add_gridspec(blocks * rows_per_block + 1, 1, height_ratios=[strip_height] * (blocks * rows_per_block) + [matrix_height])
    for block in range(blocks):
        first = block * columns
        for v, (label, _) in enumerate(image_views):
            strip, centres = _strip(pictures[v][first : first + columns], columns)  # (H, W', 3)
            row = figure.add_subplot(grid[block * rows_per_block + v, 0])
            row.imshow(strip)
            row.set_frame_on(False)
            row.set_yticks([])
            row.set_ylabel(textwrap.fill(label, 26), fontsize=8)
            shown = words[first : first + columns] if v == 0 else []
            row.set_xticks(centres[: len(shown)], labels=shown, fontsize=10)
            row.xaxis.tick_top()
            row.tick_params(length=0)
    matrices = grid[blocks * rows_per_block, 0].subgridspec(1, len(text_views))
    for v, (label, text_rows) in enumerate(text_views):
        matrix = figure.add_subplot(matrices[0, v])
        matrix.imshow(importance_distribution(text_rows).cpu().numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        matrix.set_xticks(range(len(sources)), labels=sources, rotation=90, fontsize=7)
        matrix.set_yticks(range(len(words)), labels=words if v == 0 else [], fontsize=7)
        matrix.tick_params(length=0)
        matrix.set_title(textwrap.fill(f"source words: {label}", 36), fontsize=9)  # the labels that say where positions were hidden are long
    if title:
        figure.suptitle(title, fontsize=11)
    return save_figure(figure, path)


@_plain_text
def plot_distributions(
    series: dict[str, dict[str, Sequence[float]]], path: str | Path, title: str = "", value_range: tuple[float, float] | None = (0.0, 1.0)
) -> Path:
    """One histogram panel per statistic, one coloured histogram per group (e.g. per modality).

    ``series``: statistic name -> {group name -> values}; ``value_range``: the bins' span (None: each panel's values').
    A value beyond the span is counted in the bin at its end, and the axis says how many were (matplotlib's own
    ``range`` leaves them out of the figure without a word).
    """
    import numpy as np

    figure = _new_figure(figsize=(4.2 * len(series), 3.2))
    axes = figure.subplots(1, len(series), squeeze=False)
    for axis, (statistic, groups) in zip(axes[0], series.items()):
        beyond = 0
        for group, values in groups.items():
            values = np.asarray(list(values), dtype=float)
            if value_range is not None:
                beyond += int(((values < value_range[0]) | (values > value_range[1])).sum())
                values = np.clip(values, *value_range)  # NaN stays NaN
            axis.hist(values, bins=20, range=value_range, alpha=0.55, label=group)
        axis.set_xlabel(statistic + (f" ({beyond} beyond the axis, in its end bins)" if beyond else ""))
        axis.set_ylabel("target words")
        axis.legend(fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path)


@_plain_text
def plot_head_tables(
    tables: dict[str, tuple[Sequence[Sequence[float]], str]],
    path: str | Path,
    title: str = "",
    columns: Sequence[str] | None = None,
    per_row: int | None = None,
    value_range: tuple[float, float] | None = None,
) -> Path:
    """One layer x head heatmap per score, each cell annotated: ``tables`` maps a panel's title to
    (rows of per-head values, colour map), e.g. the pointing hit rate of every image head (higher is
    better: "Greens") and the AER of every text head (lower is better: "Reds_r"). ``columns``: the
    columns' labels (default: the heads, numbered from 1). ``per_row``: panels per row of the figure
    (default: all in one row). ``value_range``: one colour scale for every panel (default: each its own)."""
    per_row = per_row or len(tables)
    grid_rows = -(-len(tables) // per_row)
    heads = max(len(rows[0]) for rows, _ in tables.values())
    figure = _new_figure(figsize=(0.9 + 2.6 * per_row + 0.5 * heads, 2.6 * grid_rows))
    axes = figure.subplots(grid_rows, per_row, squeeze=False).ravel()
    for axis in axes[len(tables):]:
        axis.set_visible(False)
    low, high = value_range or (None, None)
    for axis, (name, (rows, colours)) in zip(axes, tables.items()):
        values = [[float("nan") if v is None else v for v in row] for row in rows]
        shown = axis.imshow(values, cmap=colours, aspect="auto", vmin=low, vmax=high)
        for layer, row in enumerate(values):
            for head, value in enumerate(row):
                red, green, blue, _ = shown.cmap(shown.norm(value))
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # white digits on dark cells
                axis.text(head, layer, f"{value:.3g}", ha="center", va="center", fontsize=8, color="white" if dark else "black")
        axis.set_xticks(range(len(values[0])), labels=list(columns) if columns else [str(h + 1) for h in range(len(values[0]))])
        axis.set_yticks(range(len(values)), labels=[str(n + 1) for n in range(len(values))])
        axis.set_xlabel("head")
        axis.set_ylabel("layer")
        axis.set_title(name, fontsize=9)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path)
