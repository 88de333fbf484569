"""Captioned images: the on-disk dataset format every captioning source is prepared into.

A prepared captioning dataset is a folder (written by ``data_scripts/``)::

    dataset.json   {"task": "captioning", "language": "en", "image_root": "...", "splits": {...}, ...}
    train.tsv      one line per caption: image<TAB>caption (raw text; an image has several lines)
    valid.tsv
    test.tsv

``image`` is a path relative to ``image_root``; ``image_root`` is stored relative
to the dataset folder when it can be (so the folder and the images can move
together), else absolute. Images are never copied. Captions stay raw:
tokenisation, lower-casing and the vocabulary's frequency cut-off happen in
attnkit with the run's config, as for translation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.folder import DatasetWrite, check_split_listed, read_dataset_info, writing_datasets
from attnkit.data.images import require_files
from attnkit.errors import UserError
from attnkit.files import read_text_file

TASK = "captioning"


@dataclass(frozen=True)
class CaptionedImage:
    image: str  # path relative to the dataset's image root (or absolute)
    captions: tuple[str, ...]  # raw reference captions, in source order


def write_caption_dataset(
    folder: str | Path,
    splits: Mapping[str, Sequence[CaptionedImage]],
    image_root: str | Path,
    language: str = "en",
    info: Mapping[str, object] | None = None,
    into: DatasetWrite | None = None,
) -> Path:
    """Write ``splits`` as a dataset folder: the old one stays whole until every new file is written, and
    dataset.json comes last (:class:`~attnkit.data.folder.DatasetWrite`; ``into``: with a caller's files)."""
    folder = Path(folder)
    image_root = Path(image_root).resolve()
    for name, items in splits.items():  # all checked before the folder is touched: a bad path keeps the dataset there
        for item in items:
            image = item.image
            if not image or image != image.strip() or any(c in image for c in "\t\r\n"):
                raise UserError(f"split '{name}': image path {image!r} is empty, has surrounding spaces or a tab / line break")
    try:
        with writing_datasets(into) as write:
            for name, items in splits.items():
                lines = [f"{item.image}\t{_one_line(caption)}\n" for item in items for caption in item.captions]
                write.write_text(folder / f"{name}.tsv", "".join(lines))
            stored_root = str(image_root)  # absolute unless the two share a folder below the file system root
            try:
                if Path(os.path.commonpath([image_root, folder.resolve()])) != Path(image_root.anchor):
                    stored_root = os.path.relpath(image_root, folder.resolve())
            except ValueError:  # another drive (Windows)
                pass
            meta = {
                "task": TASK,
                "language": language,
                "image_root": stored_root,
                "splits": {name: len(items) for name, items in splits.items()},
                "captions": {name: sum(len(item.captions) for item in items) for name, items in splits.items()},
                **(info or {}),
            }
            write.info(folder, meta)
    except OSError as error:
        raise UserError(f"cannot write the dataset folder {folder}: {error}") from None
    return folder


def _one_line(text: str) -> str:
    """Tabs and line breaks would break the TSV: they become spaces."""
    return " ".join(text.replace("\t", " ").split())


def image_root(folder: str | Path) -> Path:
    """Where the images of a prepared captioning dataset live."""
    folder = Path(folder)
    info = read_dataset_info(folder, task=TASK)
    stored = info.get("image_root", ".")
    if not isinstance(stored, str) or not stored:
        raise UserError(f"{folder}/dataset.json: image_root must be a folder's path (a non-empty string), got {stored!r}")
    root = Path(stored)
    return root if root.is_absolute() else (folder / root).resolve()


def require_split_photos(root: Path, splits: Mapping[str, Sequence[CaptionedImage]]) -> None:
    """One clear error before training when a photo a split names is not a file under ``root``: without a feature
    cache the photos are read lazily, and a missing one would stop the run mid-epoch (in a loader worker) or at the
    first validation."""
    for split, items in splits.items():
        require_files((root / item.image for item in items), f"the {split} split")


def read_caption_split(folder: str | Path, split: str) -> list[CaptionedImage]:
    """One split's images with all their captions, in order of first appearance."""
    folder = Path(folder)
    check_split_listed(folder, read_dataset_info(folder, task=TASK), split)
    path = folder / f"{split}.tsv"
    if not path.is_file():
        raise UserError(f"{folder} has no split '{split}' (missing {path.name})")
    captions: dict[str, list[str]] = {}
    for number, line in enumerate(read_text_file(path).split("\n"), start=1):
        if not line.strip():
            continue
        image, separator, caption = line.rstrip("\r").partition("\t")
        if not separator:
            raise UserError(f"{path}:{number}: expected image<TAB>caption")
        if not caption.strip():  # no word to train on, and a reference the caption scorers cannot read
            raise UserError(f"{path}:{number}: the caption of {image} is empty")
        captions.setdefault(image, []).append(caption)
    return [CaptionedImage(image, tuple(texts)) for image, texts in captions.items()]


FLICKR8K_LINE = re.compile(r"(?P<image>[^\t]+?)#(?P<k>\d+)[\t ](?P<caption>.*)")  # a few copies use a space, not a TAB


def read_flickr8k_captions(path: str | Path) -> dict[str, list[str]]:
    """A Flickr8k-format caption file (``image#k<TAB>caption`` per line) as image name -> captions, in file order."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"caption file not found: {path}")
    text = read_text_file(path)
    captions: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        match = FLICKR8K_LINE.fullmatch(line)
        if match is None:
            raise UserError(f"{path}, line {number}: expected '<image>#<k><TAB><caption>', found {line[:80]!r}")
        image, k, caption = match["image"].strip(), match["k"], _one_line(match["caption"])
        if not caption:
            raise UserError(f"{path}, line {number}: the caption of {image}#{k} is empty")
        if (image, k) in seen:
            raise UserError(f"{path}, line {number}: {image}#{k} appears twice")
        seen.add((image, k))
        captions.setdefault(image, []).append(caption)
    if not captions:
        raise UserError(f"{path} holds no captions")
    return captions
