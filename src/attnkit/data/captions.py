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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.folder import read_dataset_info, write_dataset_info
from attnkit.errors import UserError
from attnkit.files import write_text_atomic

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
) -> Path:
    """Write ``splits`` as a dataset folder; files appear whole or not at all, dataset.json last."""
    folder = Path(folder)
    image_root = Path(image_root).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, items in splits.items():
            lines = []
            for item in items:
                image = _one_line(item.image)
                if not image:
                    raise UserError(f"split '{name}': an image with an empty path")
                lines += [f"{image}\t{_one_line(caption)}\n" for caption in item.captions]
            write_text_atomic(folder / f"{name}.tsv", "".join(lines))
        try:
            stored_root = os.path.relpath(image_root, folder.resolve())
        except ValueError:  # another drive (Windows)
            stored_root = str(image_root)
        meta = {
            "task": TASK,
            "language": language,
            "image_root": stored_root,
            "splits": {name: len(items) for name, items in splits.items()},
            "captions": {name: sum(len(item.captions) for item in items) for name, items in splits.items()},
            **(info or {}),
        }
        write_dataset_info(folder, meta)
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
    root = Path(info.get("image_root", "."))
    return root if root.is_absolute() else (folder / root).resolve()


def read_caption_split(folder: str | Path, split: str) -> list[CaptionedImage]:
    """One split's images with all their captions, in order of first appearance."""
    folder = Path(folder)
    read_dataset_info(folder, task=TASK)
    path = folder / f"{split}.tsv"
    if not path.is_file():
        raise UserError(f"{folder} has no split '{split}' (missing {path.name})")
    captions: dict[str, list[str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        image, separator, caption = line.rstrip("\r").partition("\t")
        if not separator:
            raise UserError(f"{path}:{number}: expected image<TAB>caption")
        captions.setdefault(image, []).append(caption)
    return [CaptionedImage(image, tuple(texts)) for image, texts in captions.items()]
