"""Figures: the image-attention overlay has one panel per word plus the input."""

import pytest
import torch
from PIL import Image

from attnkit.viz import attention_maps, plot_image_attention


def test_overlay_has_one_panel_per_word_and_the_input(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    original = plt.subplots

    def spy(*args, **kwargs):
        figure, axes = original(*args, **kwargs)
        figures.append(axes)
        return figure, axes

    monkeypatch.setattr(plt, "subplots", spy)
    attention = torch.softmax(torch.randn(7, 12), -1)  # 7 words over a 3x4 grid
    words = ["a", "dog", "runs", "on", "the", "grass", "<eos>"]
    path = plot_image_attention(Image.new("RGB", (64, 48), (90, 120, 30)), words, attention, (3, 4), tmp_path / "overlay.png")
    assert path.stat().st_size > 1000
    drawn = [axis for axis in figures[0].flat if axis.images]
    assert len(drawn) == 1 + len(words)
    assert [axis.get_title() for axis in drawn[1:]] == words


def test_attention_maps_keep_the_row_major_grid_orientation():
    attention = torch.zeros(1, 6)
    attention[0, 2] = 1.0  # row 0, column 2 of a 2x3 grid: top right
    maps = attention_maps(attention, (2, 3), (20, 30))
    assert maps.shape == (1, 20, 30)
    assert maps[0, :10, 20:].mean() > maps[0, 10:, :10].mean()


def test_overlay_rejects_a_grid_that_does_not_match():
    with pytest.raises(ValueError, match="grid"):
        plot_image_attention(Image.new("RGB", (8, 8)), ["a"], torch.ones(1, 5) / 5, (2, 2), "unused.png")
