"""Attention figures (matplotlib, Agg backend: no screen needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch import Tensor  # noqa: E402

from attnkit.files import atomic_path  # noqa: E402


def plot_attention_matrix(attention: Tensor, source_words: Sequence[str], target_words: Sequence[str], path: str | Path, title: str = "") -> Path:
    """Heatmap of attention (T, S): one row per output word, one column per source word."""
    weights = attention.float().cpu().numpy()
    rows, columns = weights.shape
    if rows != len(target_words) or columns != len(source_words):
        raise ValueError(f"attention is {rows}x{columns} but there are {len(target_words)} target and {len(source_words)} source words")
    figure, axes = plt.subplots(figsize=(1.0 + 0.45 * columns, 1.0 + 0.4 * rows))
    image = axes.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), labels=list(source_words), rotation=60, ha="right")
    axes.set_yticks(range(rows), labels=list(target_words))
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    return save_figure(figure, path)


def save_figure(figure, path: str | Path) -> Path:
    """Write a figure atomically (a half-written PNG never replaces a good one)."""
    try:
        with atomic_path(path) as temporary:
            figure.savefig(temporary, dpi=110)
    finally:
        plt.close(figure)
    return Path(path)
