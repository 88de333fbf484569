"""Multi30k task 1 as shared in ``../shared/data/multi30k`` (see ``SOURCE.md`` there): reading it, and its photos.

Raw files: ``task1/raw/{train,val,test_2016_flickr}.{en,de,fr}.gz`` (gzip'd UTF-8, one sentence a
line; line i of every language describes the same photo). ``task1/image_splits/<stem>.txt`` names
that photo, one Flickr30k file a line (``1000268201.jpg``). Flickr8k names the same photo
``1000268201_693b08cb0e.jpg``: the number before ``_`` is the Flickr photo id both share.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

from attnkit.data.sources import clean
from attnkit.errors import UserError
from attnkit.files import read_text_file

LANGUAGES = ("en", "de", "fr")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # our name -> Multi30k file stem
RAW_DIR = Path("multi30k") / "task1" / "raw"
IMAGE_SPLITS_DIR = Path("multi30k") / "task1" / "image_splits"
_PHOTO_ID = re.compile(r"(\d+)[_.]")


def read_gzip_lines(path: Path) -> list[str]:
    """Lines of a gzip'd UTF-8 file, split on '\\n' only (so line i stays line i), cleaned."""
    if not path.is_file():
        raise UserError(f"Multi30k file not found: {path}")
    try:
        with gzip.open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise UserError(f"cannot read {path}: {error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text ({error})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [clean(line.rstrip("\r")) for line in lines]


def read_split(root: Path, stem: str, languages: Sequence[str]) -> list[tuple[str, ...]]:
    """Line-aligned sentences of one split (``stem``, e.g. ``val``) in ``languages``, under data root ``root``."""
    raw_dir = root / RAW_DIR
    sides = [read_gzip_lines(raw_dir / f"{stem}.{lang}.gz") for lang in languages]
    for lang, side in zip(languages[1:], sides[1:]):
        if len(side) != len(sides[0]):
            raise UserError(f"{raw_dir}: {stem}.{languages[0]}.gz has {len(sides[0])} lines but {stem}.{lang}.gz has {len(side)}")
    for number, sentences in enumerate(zip(*sides), 1):
        for lang, sentence in zip(languages, sentences):
            if not sentence:
                raise UserError(f"{raw_dir}: line {number} of {stem}.{lang}.gz is empty")
    return list(zip(*sides))


def photo_id(file_name: str) -> str:
    """The Flickr photo id of a Flickr30k or Flickr8k image file name ('1000268201.jpg', '1000268201_693b08cb0e.jpg')."""
    match = _PHOTO_ID.match(Path(file_name.strip()).name)
    if match is None:
        raise UserError(f"'{file_name.strip()}' is not a Flickr image file name (digits, then '_' or '.')")
    return match.group(1)


def split_photos(root: Path, stem: str) -> list[str]:
    """The photo id of every sentence line of one split (``task1/image_splits/<stem>.txt``)."""
    path = root / IMAGE_SPLITS_DIR / f"{stem}.txt"
    if not path.is_file():
        raise UserError(f"Multi30k image list not found: {path}")
    return [photo_id(line) for line in read_text_file(path).split("\n") if line.strip()]


def read_split_with_photos(root: Path, stem: str, languages: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(photo id, line-aligned sentences in ``languages``) for every line of one split."""
    photos, sentences = split_photos(root, stem), read_split(root, stem, languages)
    if len(photos) != len(sentences):
        raise UserError(f"{root / IMAGE_SPLITS_DIR / f'{stem}.txt'} names {len(photos)} photos for {len(sentences)} sentence lines")
    return list(zip(photos, sentences))


def read_photo_list(path: str | Path) -> set[str]:
    """The photo ids of a list of image file names, one a line (e.g. Flickr8k's ``Flickr_8k.testImages.txt``)."""
    return {photo_id(line) for line in read_text_file(path).split("\n") if line.strip()}
