"""Reading images for the image encoder: any size and mode in, a normalised RGB tensor out.

Every way an image file can be bad (missing, a directory, not an image,
truncated, empty, absurdly large) becomes an :class:`ImageError` with one
message naming the file, so a script can report it and go on with the others.
"""

from __future__ import annotations

import io
import random
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError
from torch import Tensor

from attnkit.errors import UserError

# Refuse decoding more pixels than this (PIL's default bomb limit is ~89 M; a caption photo needs far less).
MAX_PIXELS = 64_000_000
EXIF_ORIENTATION = 0x0112  # the EXIF tag that says how a stored photo is turned (1: as stored)


class ImageError(UserError):
    """One image could not be used; the message names it and says why."""


def open_rgb(path: str | Path) -> Image.Image:
    """The image at ``path`` as 8-bit RGB, whatever its mode (grayscale, 16-bit, palette, RGBA, CMYK ...)."""
    path = Path(path)
    problem = _not_a_file(path)
    if problem:
        raise ImageError(f"{path}: {problem}")
    if path.stat().st_size == 0:
        raise ImageError(f"{path}: empty file")
    return _decode_rgb(path, str(path), MAX_PIXELS)


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no image file (missing, a directory, a pipe ...), or None when it is a file."""
    if path.is_file():
        return None
    if not path.exists():
        return "file not found"
    return "is a directory, not an image" if path.is_dir() else "is not a regular file"


def require_files(paths: Iterable[str | Path], what: str = "") -> None:
    """The ImageError :func:`open_rgb` gives for the first of ``paths`` that is not a file (missing, a folder), before
    any work: one stat each, where decoding every photo would cost minutes. ``what`` (e.g. "the valid split") leads
    the message."""
    for path in paths:
        problem = _not_a_file(Path(path))
        if problem:
            raise ImageError(f"{what}: {path}: {problem}" if what else f"{path}: {problem}")


def rgb_from_bytes(data: bytes, name: str, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """An image sent as bytes (a photo uploaded to ``attnkit serve``) as 8-bit RGB, checked as a file is."""
    if not data:
        raise ImageError(f"{name}: empty file")
    return _decode_rgb(io.BytesIO(data), name, max_pixels)


# The formats a photo is read in. Pillow opens more, but some by running other programs: an EPS file is handed to
# Ghostscript (a PostScript program, with no time limit), which an upload to ``attnkit serve`` must never reach.
PHOTO_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM", "TGA")  # a camera's MPO opens as JPEG


def _decode_rgb(source, name: str, max_pixels: int) -> Image.Image:
    """Decode ``source`` (a path or a file object) whole, refusing more than ``max_pixels``; ``name`` is said in errors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source, formats=PHOTO_FORMATS) as image:
                width, height = image.size
                if width == 0 or height == 0:
                    raise ImageError(f"{name}: image has zero size ({width}x{height})")
                if width * height > max_pixels:
                    raise ImageError(f"{name}: {width}x{height} pixels is over the limit of {max_pixels:,} (decompression bomb?)")
                ImageFile.LOAD_TRUNCATED_IMAGES = False
                image.load()  # decode now, inside the error handling: truncated data fails here
                return _to_rgb(_upright(image))
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file in a format read here ({', '.join(PHOTO_FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"{name}: too many pixels (decompression bomb limit)") from None
    except (OSError, SyntaxError, ValueError) as error:  # truncated or corrupt data
        raise ImageError(f"{name}: unreadable or truncated image ({error})") from None


def _upright(image: Image.Image) -> Image.Image:
    """The image as a viewer shows it: a phone's photo is often stored sideways, with an EXIF orientation tag that
    says how to turn it; captioning the stored pixels would call left right. Untagged images stay as they are."""
    if image.getexif().get(EXIF_ORIENTATION, 1) == 1:
        return image
    return ImageOps.exif_transpose(image)


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16/32-bit grayscale: scale to 8 bits, not clip
        # One working copy, scaled in place (4 bytes a pixel): a 7900 x 7900 PNG of 139 kB had cost 1.5 GB in float64
        if image.mode == "F":  # floating point: stretch to the image's own maximum
            values = np.array(image, dtype=np.float32)
            values *= 255.0 / max(float(values.max()) if values.size else 0.0, 1e-12)
        else:  # integers: 16-bit range when any value needs it, in integers (floor(v * 255 / 65535) exactly)
            values = np.array(image, dtype=np.int32)
            if values.size and values.max() > 255:
                np.clip(values, 0, 65535, out=values)
                values *= 255
                values //= 65535
        np.clip(values, 0, 255, out=values)
        image = Image.fromarray(values.astype(np.uint8), mode="L")
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # else Pillow warns when dropping palette transparency
    return image.convert("RGB")


def image_tensor(image: Image.Image, size: int, normalization: tuple[tuple[float, ...], tuple[float, ...]]) -> Tensor:
    """Resize to size x size (squashing, as the encoders were set up for) and normalise: (3, size, size)."""
    resized = image.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=None)
    pixels = torch.from_numpy(np.asarray(resized, dtype=np.float32).copy()).permute(2, 0, 1) / 255.0  # (3, H, W)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in normalization)
    return (pixels - mean) / std


def load_image(path: str | Path, size: int, normalization: tuple[tuple[float, ...], tuple[float, ...]]) -> Tensor:
    return image_tensor(open_rgb(path), size, normalization)


def grey_cells(pixels: Tensor, keep: Tensor) -> Tensor:
    """One copy of normalised ``pixels`` (3, H, W) per keep mask of ``keep`` (B, rows, columns) bool, with the pixels
    of every cell the mask drops greyed: set to the normalisation's mean colour, 0 after normalising, what the
    backbone saw least of in training. (B, 3, H, W)

    The cells tile the image as the encoder's grid does (cell (r, c) covers rows r*H/rows .. (r+1)*H/rows, rounded)."""
    _, height, width = pixels.shape
    rows, columns = keep.shape[1:]
    cell_row = _cell_of_pixel(height, rows, keep.device)  # (H,)
    cell_column = _cell_of_pixel(width, columns, keep.device)  # (W,)
    kept_pixels = keep[:, cell_row][:, :, cell_column]  # (B, H, W)
    return pixels.unsqueeze(0) * kept_pixels.unsqueeze(1).to(pixels.dtype)


def _cell_of_pixel(pixels: int, cells: int, device: torch.device) -> Tensor:
    """The cell each of ``pixels`` pixels along one side falls in, for ``cells`` cells whose edges are rounded. (pixels,)"""
    edges = torch.tensor([round(k * pixels / cells) for k in range(1, cells)], device=device)  # (cells - 1,) inner edges
    return torch.bucketize(torch.arange(pixels, device=device), edges, right=True)


MOSAIC_PHOTOS = 4  # a 2 x 2 mosaic, row-major: top-left, top-right, bottom-left, bottom-right


def _check_mosaic_photos(count: int) -> None:
    if count != MOSAIC_PHOTOS:
        raise UserError(f"a 2 x 2 mosaic needs {MOSAIC_PHOTOS} photos, got {count}")


def mosaic(images: list[Image.Image], size: int) -> Image.Image:
    """Four images side by side as one size x size RGB image, each squashed into its quadrant (row-major).

    The localisation test (issue 19; ``attnkit.analysis.quadrant_weights``) asks how much of a word's
    attention falls on the quadrant of the photo it was forced to describe."""
    _check_mosaic_photos(len(images))
    if size < 2:
        raise UserError(f"a mosaic needs at least 2 x 2 pixels, got size {size}")
    half = size // 2
    edges = (0, half, size)  # an odd size gives the right column and bottom row one pixel more
    sheet = Image.new("RGB", (size, size))
    for index, image in enumerate(images):
        row, column = divmod(index, 2)
        box = (edges[column], edges[row], edges[column + 1], edges[row + 1])
        sheet.paste(image.convert("RGB").resize((box[2] - box[0], box[3] - box[1]), Image.Resampling.BILINEAR, reducing_gap=None), box[:2])
    return sheet


def open_mosaic(paths: list[str | Path], size: int) -> Image.Image:
    """The mosaic of four photo files; a missing or unreadable one is an :class:`ImageError` naming it."""
    _check_mosaic_photos(len(paths))  # before reading any of them
    return mosaic([open_rgb(path) for path in paths], size)


def mosaic_arrangements(inputs: int, seed: int, described: list[int] | None = None) -> list[list[int]]:
    """For each input i of ``described`` (default: every input), the four inputs of its mosaic in quadrant order:
    i and three others drawn at random, the order shuffled, all from ``seed`` (so a study or a training set can be
    repeated, and its arrangements recorded)."""
    if inputs < MOSAIC_PHOTOS:
        raise UserError(f"a mosaic needs at least {MOSAIC_PHOTOS} inputs (photos with their sentences), got {inputs}")
    generator = random.Random(seed)
    arrangements = []
    for i in range(inputs) if described is None else described:
        order = [i, *generator.sample([j for j in range(inputs) if j != i], MOSAIC_PHOTOS - 1)]
        generator.shuffle(order)
        arrangements.append(order)
    return arrangements


@dataclass(frozen=True)
class MosaicFile:
    """Four photo files read as one 2 x 2 mosaic (row-major): a training image that exists only as its parts."""

    photos: tuple[Path, ...]

    def __post_init__(self) -> None:
        _check_mosaic_photos(len(self.photos))


ImageSource = Path | MosaicFile  # what a caption dataset's image is: one photo file, or a mosaic of four


def load_image_source(image: ImageSource, size: int, normalization: tuple[tuple[float, ...], tuple[float, ...]]) -> Tensor:
    """(3, size, size) pixels of a photo file or of a mosaic of four."""
    if isinstance(image, MosaicFile):
        return image_tensor(open_mosaic(list(image.photos), size), size, normalization)
    return load_image(image, size, normalization)
