"""Figures: the image-attention overlay has one panel per word plus the input; pyplot's backend is left alone."""

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from PIL import Image

from attnkit import viz
from attnkit.viz import attention_maps, display_image, distinct_views, overlays, plot_attention_matrix, plot_image_attention


def test_overlay_has_one_panel_per_word_and_the_input(tmp_path, monkeypatch):
    figures = []
    original = viz.save_figure

    def spy(figure, path):
        figures.append(figure)
        return original(figure, path)

    monkeypatch.setattr(viz, "save_figure", spy)
    attention = torch.softmax(torch.randn(7, 12), -1)  # 7 words over a 3x4 grid
    words = ["a", "dog", "runs", "on", "the", "grass", "<eos>"]
    path = plot_image_attention(Image.new("RGB", (64, 48), (90, 120, 30)), words, attention, (3, 4), tmp_path / "overlay.png")
    assert path.stat().st_size > 1000
    drawn = [axis for axis in figures[0].axes if axis.images]  # the panels, row-major
    assert len(drawn) == 1 + len(words)
    assert [axis.get_title() for axis in drawn[1:]] == words


def test_a_large_photo_is_drawn_quickly_at_display_size(tmp_path, monkeypatch):
    figures = []
    original = viz.save_figure
    monkeypatch.setattr(viz, "save_figure", lambda figure, path: figures.append(figure) or original(figure, path))
    photo = Image.new("RGB", (3000, 2000), (90, 120, 30))  # 6 Mpx: drawn at full size, 12 words took seconds and gigabytes
    attention = torch.softmax(torch.randn(12, 49), -1)
    began = time.perf_counter()
    plot_image_attention(photo, [f"w{k}" for k in range(12)], attention, (7, 7), tmp_path / "overlay.png")
    assert time.perf_counter() - began < 4  # 9 s here before, 0.5 s now
    shapes = {axis_image.get_array().shape[:2] for axis in figures[0].axes for axis_image in axis.images}
    assert shapes == {(213, 320)}  # the photo and every map at display size, the aspect kept
    pictures = overlays(photo, attention[:2], (7, 7))  # the cross-modal figure's and the report's panels
    assert [picture.size for picture in pictures] == [(320, 213)] * 2
    small = Image.new("RGB", (64, 48))
    assert display_image(small) is small  # a photo already small enough is drawn as it is


def test_attention_maps_keep_the_row_major_grid_orientation():
    attention = torch.zeros(1, 6)
    attention[0, 2] = 1.0  # row 0, column 2 of a 2x3 grid: top right
    maps = attention_maps(attention, (2, 3), (20, 30))
    assert maps.shape == (1, 20, 30)
    assert maps[0, :10, 20:].mean() > maps[0, 10:, :10].mean()


def test_overlay_rejects_a_grid_that_does_not_match():
    with pytest.raises(ValueError, match="grid"):
        plot_image_attention(Image.new("RGB", (8, 8)), ["a"], torch.ones(1, 5) / 5, (2, 2), "unused.png")


@pytest.mark.slow  # a fresh interpreter imports torch: a few seconds
def test_a_map_two_estimators_share_is_drawn_once_under_both_names():
    attention, shared = torch.rand(3, 4), torch.rand(3, 4)  # one position hidden from attention IS importance through attention
    views = distinct_views([("attention", attention), ("through attention", shared), ("hidden from attention", shared), ("windows", shared.clone())])
    assert [label for label, _ in views] == ["attention", "through attention = hidden from attention", "windows"]  # equal values, another map: kept
    assert views[1][1] is shared


def test_importing_and_saving_figures_leaves_the_pyplot_backend_alone(tmp_path):
    # In a fresh interpreter: the backend is process-wide, and a notebook user's choice must survive.
    script = textwrap.dedent(
        """
        import sys

        import matplotlib

        matplotlib.use("svg")
        import matplotlib.pyplot  # a user who has pyplot open, on a backend of their choosing
        import torch

        from attnkit.viz import plot_attention_matrix

        path = plot_attention_matrix(torch.eye(2), ["a", "b"], ["x", "y"], sys.argv[1])
        print(matplotlib.get_backend(), len(matplotlib.pyplot.get_fignums()), path.stat().st_size)
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "matrix.png")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    backend, pyplot_figures, size = done.stdout.split()
    assert backend.lower() == "svg" and pyplot_figures == "0" and int(size) > 0  # nothing left open in pyplot either
    assert (tmp_path / "matrix.png").read_bytes().startswith(b"\x89PNG")  # still a PNG, drawn by Agg


def test_a_dollar_in_the_words_is_drawn_as_typed_not_as_mathtext(tmp_path, monkeypatch):
    """"$^$" raised matplotlib's mathtext ParseSyntaxException (a traceback from attnkit translate --attention-png,
    a 500 from the page), and "$x$" was drawn as math."""
    import matplotlib

    figures = []
    original = viz.save_figure
    monkeypatch.setattr(viz, "save_figure", lambda figure, path: figures.append(figure) or original(figure, path))
    words = ["$^$", "costs", "$5"]
    viz.plot_attention_matrix(torch.softmax(torch.randn(3, 2), -1), ["je", "$x$"], words, tmp_path / "matrix.png", title="$5 or $10")
    plot_image_attention(Image.new("RGB", (32, 32)), words, torch.softmax(torch.randn(3, 4), -1), (2, 2), tmp_path / "overlay.png", title="$^$")
    texts = [text for figure in figures for text in figure.findobj(matplotlib.text.Text) if "$" in text.get_text()]
    assert texts and not any(text.get_parse_math() for text in texts)
    assert matplotlib.rcParams["text.parse_math"]  # the user's setting is left as it was


def test_a_histogram_counts_values_beyond_its_range_in_its_end_bins_and_says_so(tmp_path, monkeypatch):
    """matplotlib's hist(range=...) leaves values outside it out: erasure.png lost 13 of 676 peak drops below -0.5
    (removing the peak helped those words), the figure's tail, without a word."""
    figures = []
    original = viz.save_figure
    monkeypatch.setattr(viz, "save_figure", lambda figure, path: figures.append(figure) or original(figure, path))
    viz.plot_distributions({"drop": {"peak": [-3.0, -0.2, 0.1, 0.4, 2.0]}}, tmp_path / "d.png", value_range=(-0.5, 1.0))
    axis = figures[0].axes[0]
    counts = [patch.get_height() for patch in axis.patches]
    assert sum(counts) == 5 and counts[0] == 1 and counts[-1] == 1
    assert "2 beyond the axis" in axis.get_xlabel()
    viz.plot_distributions({"peak": {"image": [0.2, 0.9]}}, tmp_path / "e.png")
    assert figures[1].axes[0].get_xlabel() == "peak"


@pytest.mark.filterwarnings("ignore:Tight layout not applied")  # two columns leave a 30-character label no room: the point is the time
def test_a_long_source_word_is_drawn_as_a_short_label(tmp_path):
    """Source words are the user's text: a word of a million characters is laid out as 30, not glyph by glyph."""
    from attnkit.viz import LABEL_CHARACTERS, _labels

    assert _labels(["un", "x" * LABEL_CHARACTERS, "y" * 1_000_000]) == ["un", "x" * LABEL_CHARACTERS, "y" * (LABEL_CHARACTERS - 1) + "\u2026"]
    started = time.perf_counter()
    plot_attention_matrix(torch.full((2, 2), 0.5), ["un", "y" * 1_000_000], ["a", "<eos>"], tmp_path / "long.png")
    assert time.perf_counter() - started < 20 and (tmp_path / "long.png").stat().st_size < 200_000
