"""Image reading: every mode becomes RGB; every bad file is one ImageError naming it."""

import numpy as np
import pytest
from PIL import Image

from attnkit.data import images
from attnkit.data.images import ImageError, load_image, open_rgb

NORMALIZATION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Image.new("L", (30, 20), 128),
        lambda: Image.new("RGBA", (30, 20), (255, 0, 0, 0)),
        lambda: Image.new("P", (30, 20), 3),
        lambda: Image.new("CMYK", (30, 20), (0, 0, 0, 0)),
        lambda: Image.fromarray(np.full((20, 30), 65535, dtype=np.uint16)),
        lambda: Image.new("1", (30, 20), 1),
    ],
    ids=["gray", "rgba", "palette", "cmyk", "16-bit", "bilevel"],
)
def test_every_mode_becomes_a_normalised_rgb_tensor(tmp_path, make):
    image = make()
    path = tmp_path / ("x.png" if image.mode != "CMYK" else "x.jpg")
    image.save(path)
    assert open_rgb(path).mode == "RGB"
    tensor = load_image(path, 16, NORMALIZATION)
    assert tensor.shape == (3, 16, 16) and -1.0 <= tensor.min() and tensor.max() <= 1.0


def test_sixteen_bit_white_stays_white_and_mid_gray_is_scaled(tmp_path):
    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(tmp_path / "mid.png")
    assert abs(np.asarray(open_rgb(tmp_path / "mid.png"))[0, 0, 0] - 127) <= 1


def test_bad_files_are_one_message_each(tmp_path, monkeypatch):
    Image.new("RGB", (64, 64), (10, 200, 30)).save(tmp_path / "good.jpg")
    data = (tmp_path / "good.jpg").read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "text.jpg").write_text("not an image at all")
    (tmp_path / "folder.jpg").mkdir()
    Image.new("L", (300, 300)).save(tmp_path / "huge.png")
    monkeypatch.setattr(images, "MAX_PIXELS", 300 * 300 - 1)
    expected = {
        "missing.jpg": "file not found",
        "folder.jpg": "is a directory",
        "empty.jpg": "empty file",
        "text.jpg": "not an image file",
        "truncated.jpg": "truncated",
        "huge.png": "over the limit",
    }
    for name, message in expected.items():
        with pytest.raises(ImageError, match=message) as caught:
            open_rgb(tmp_path / name)
        assert name in str(caught.value)
    assert open_rgb(tmp_path / "good.jpg").size == (64, 64)


# -- the 2 x 2 mosaic of the localisation test (issue 19) ---------------------------------------------------
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


@pytest.mark.parametrize("size", [8, 9])
def test_each_photo_fills_its_own_quadrant(size):
    photos = [Image.new("RGB", (30 + 10 * i, 20), colour) for i, colour in enumerate(COLOURS)]  # any sizes
    sheet = np.asarray(images.mosaic(photos, size))  # (size, size, 3)
    assert sheet.shape == (size, size, 3)
    half = size // 2
    quadrants = [sheet[:half, :half], sheet[:half, half:], sheet[half:, :half], sheet[half:, half:]]
    for quadrant, colour in zip(quadrants, COLOURS):
        assert (quadrant == colour).all()


def test_a_mosaic_needs_four_readable_photos(tmp_path):
    good = tmp_path / "good.png"
    Image.new("L", (10, 10), 128).save(good)  # grayscale is fine
    assert images.open_mosaic([good] * 4, 8).size == (8, 8)
    with pytest.raises(images.UserError, match="needs 4 photos, got 3"):
        images.open_mosaic([good] * 3, 8)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(ImageError, match="broken.jpg: not an image"):
        images.open_mosaic([good, good, broken, good], 8)


def test_a_large_sixteen_bit_photo_is_scaled_in_one_small_copy(tmp_path):
    """floor(v * 255 / 65535) for every 16-bit value, with one working copy of 4 bytes a pixel: a 7900 x 7900 PNG of
    139 kB had cost the page 1.5 GB in three float64 copies."""
    import tracemalloc

    from attnkit.data.images import _to_rgb

    ramp = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    assert np.array_equal(np.asarray(_to_rgb(Image.fromarray(ramp)))[..., 0], (ramp.astype(np.int64) * 255 // 65535).astype(np.uint8))
    big = Image.fromarray(np.full((2000, 2000), 40000, dtype=np.uint16))
    tracemalloc.start()
    try:
        _to_rgb(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2000 * 2000 * 1.6, peak  # the int32 copy and the 8-bit image; float64 would be 24 bytes a pixel


def test_a_photo_is_read_upright_as_its_exif_orientation_says(tmp_path):
    """A phone stores a photo sideways with an EXIF orientation tag; read as stored, a scene's left came out as its
    top, and its caption said 'left of' for what a viewer sees on the right."""
    pixels = np.zeros((40, 80, 3), np.uint8)
    pixels[:, :40] = 255  # the left half white
    stored = Image.fromarray(pixels)
    exif = stored.getexif()
    exif[images.EXIF_ORIENTATION] = 6  # "turn 90 degrees clockwise to view"
    stored.save(tmp_path / "turned.png", exif=exif)
    stored.save(tmp_path / "plain.png")
    upright = np.asarray(open_rgb(tmp_path / "turned.png"))
    assert upright.shape == (80, 40, 3) and upright[:40].min() == 255 and upright[40:].max() == 0  # the white half on top
    assert np.array_equal(np.asarray(open_rgb(tmp_path / "plain.png")), pixels)


def test_a_postscript_file_is_refused_before_pillow_would_hand_it_to_ghostscript():
    """Pillow opens an EPS file by running Ghostscript on it (no time limit): uploads and photo files are read in the
    photo formats only."""
    import io

    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n{} loop\n"
    with Image.open(io.BytesIO(eps)) as opened:  # what Image.open alone makes of it
        assert opened.format == "EPS"
    with pytest.raises(ImageError, match="upload.eps: not an image file in a format read here"):
        images.rgb_from_bytes(eps, "upload.eps")
