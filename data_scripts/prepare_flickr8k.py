"""Prepare Flickr8k (photos with 5 English captions each) as an attnkit captioning dataset.

Reads the original Flickr8k text files in ``ROOT/flickr8k/`` (see ``SOURCE.md`` beside them):
``Flickr8k.token.txt`` (one caption a line, ``<image>#<k><TAB><caption>``; a space instead of the
TAB, as on 3 lines of the original file, is accepted too), the standard split lists
``Flickr_8k.{train,dev,test}Images.txt`` (one image file name a line) and the photos in
``images/``; and writes the folder that ``attnkit.data.captions`` reads: splits ``train``,
``valid`` (from dev) and ``test``, each image with all its captions. Images are not copied:
``dataset.json`` points at the images folder. Captions stay raw (original casing, the space
before the final " ."), whitespace-stripped; tokenisation happens in attnkit.

An image named in a split list but absent from the images folder, or without a caption, is left
out and counted (per split, printed and stored in ``dataset.json``): the shared subset holds 6,276
of the 8,091 photos (every photo of the standard training split but those held out, and part of dev
and test), and the original train list names one image the original caption file has no caption
for. With the shared subset the result is train 5,273, valid 463 and test 490 images, 5 captions
each.

Usage::

    python data_scripts/prepare_flickr8k.py                      # -> data/flickr8k
    python data_scripts/prepare_flickr8k.py --data /data --out /tmp/flickr8k --images /data/Flicker8k_Dataset
    python data_scripts/prepare_flickr8k.py --out data/flickr8k-joint \
        --exclude-photos ../shared/data/multi30k/task1/image_splits/val.txt \
        --exclude-photos ../shared/data/multi30k/task1/image_splits/test_2016_flickr.txt

Options:

--data ROOT     folder holding ``flickr8k/`` (default ``$ATTNKIT_DATA``, else ``../shared/data``
                beside the project).
--out DIR       output folder (default ``data/flickr8k`` in the project, which git ignores: Flickr8k is
                not redistributed with attnkit).
--images DIR    the photos (default ``ROOT/flickr8k/images``); e.g. the ``Flicker8k_Dataset`` folder of
                the original download.
--exclude-photos LIST  leave the photos named in LIST (image file names one a line, Flickr8k or Flickr30k
                naming; may be given several times) out of ``train`` and ``valid`` (``test`` stays whole).
                A joint model with a Multi30k translator leaves out the Multi30k val and test photos: their
                English Multi30k sentence is one of the photo's Flickr8k captions, word for word.

Terms: no licence is given for the data; the photos belong to their Flickr owners, and Flickr8k was
given out by the University of Illinois for research use. Cite Hodosh, Young and Hockenmaier 2013;
``dataset.json`` records this.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
try:
    from attnkit.data.captions import CaptionedImage, read_flickr8k_captions, write_caption_dataset
    from attnkit.data.multi30k import photo_id, read_photo_list
    from attnkit.data.sources import default_data_root
    from attnkit.errors import UserError, run_cli
except ImportError:  # run from a checkout where attnkit is not installed
    sys.path.insert(0, str(PROJECT_ROOT / "src"))
    from attnkit.data.captions import CaptionedImage, read_flickr8k_captions, write_caption_dataset
    from attnkit.data.multi30k import photo_id, read_photo_list
    from attnkit.data.sources import default_data_root
    from attnkit.errors import UserError, run_cli

FOLDER = Path("flickr8k")
TOKEN_FILE = "Flickr8k.token.txt"
SPLITS = {"train": "Flickr_8k.trainImages.txt", "valid": "Flickr_8k.devImages.txt", "test": "Flickr_8k.testImages.txt"}
EXCLUDED_SPLITS = ("train", "valid")  # --exclude-photos: what a model learns or is chosen on
SOURCE = (
    "Flickr8k (Hodosh, Young, Hockenmaier 2013): Flickr8k.token.txt captions, the standard "
    "Flickr_8k.{train,dev,test}Images.txt split lists and the photos"
)
LICENSE = (
    "no licence is given for the data; the photos come from Flickr and belong to their owners; "
    "Flickr8k was given out by the University of Illinois for research use"
)
CITATION = (
    "Hodosh, Young, Hockenmaier (2013): Framing Image Description as a Ranking Task: Data, Models and "
    "Evaluation Metrics, Journal of Artificial Intelligence Research 47:853-899"
)


def read_lines(path: Path, what: str) -> list[str]:
    """Lines of a UTF-8 text file, split on '\\n' only, '\\r' removed."""
    if not path.is_file():
        raise UserError(f"Flickr8k {what} not found: {path}")
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:  # newline="": a lone '\r' stays in its line
            text = handle.read()
    except OSError as error:
        raise UserError(f"cannot read {path}: {error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text ({error})") from None
    return [line.rstrip("\r") for line in text.split("\n")]


def read_split_list(path: Path) -> list[str]:
    """Image file names, in file order, each once."""
    names = [line.strip() for line in read_lines(path, "split list")]
    return list(dict.fromkeys(name for name in names if name))


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare Flickr8k (captions, standard split lists, photos) as an attnkit captioning dataset (train / valid / test).",
    )
    parser.add_argument("--data", type=Path, default=None, help="data root holding flickr8k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default data/flickr8k in the project)")
    parser.add_argument("--images", type=Path, default=None, help="folder of the photos (default ROOT/flickr8k/images)")
    parser.add_argument("--exclude-photos", type=Path, action="append", default=[], metavar="LIST", help="leave these photos out of train and valid (repeatable)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    root = args.data if args.data is not None else default_data_root(PROJECT_ROOT)
    if not root.is_dir():
        raise UserError(f"data root not found: {root} (give --data ROOT or set ATTNKIT_DATA)")
    source_dir = root / FOLDER
    if not source_dir.is_dir():
        raise UserError(f"{root} has no {FOLDER} folder (expected the Flickr8k text files there)")
    images = args.images if args.images is not None else source_dir / "images"
    if not images.is_dir():
        raise UserError(f"images folder not found: {images} (give --images DIR)")
    out = args.out if args.out is not None else PROJECT_ROOT / "data" / "flickr8k"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    captions = read_flickr8k_captions(source_dir / TOKEN_FILE)
    lists = {name: read_split_list(source_dir / filename) for name, filename in SPLITS.items()}
    owner: dict[str, str] = {}
    for name, names in lists.items():
        for image in names:
            if image in owner:
                raise UserError(f"{image} is in both {SPLITS[owner[image]]} and {SPLITS[name]}")
            owner[image] = name

    left_out = set().union(*(read_photo_list(path) for path in args.exclude_photos))
    splits: dict[str, list[CaptionedImage]] = {}
    skipped: dict[str, dict[str, int]] = {}
    for name, names in lists.items():
        kept, absent, uncaptioned, excluded = [], 0, 0, 0
        for image in names:
            if left_out and name in EXCLUDED_SPLITS and photo_id(image) in left_out:
                excluded += 1
            elif not (images / image).is_file():
                absent += 1
            elif image not in captions:
                uncaptioned += 1
            else:
                kept.append(CaptionedImage(image, tuple(captions[image])))
        if not kept:
            raise UserError(
                f"no image of {SPLITS[name]} ({len(names)} named) is both in {images} and captioned in {TOKEN_FILE}"
                + (" (is --images the Flickr8k photo folder?)" if absent else "")
            )
        splits[name] = kept
        skipped[name] = {"not_in_images_folder": absent, "without_captions": uncaptioned, "excluded_photos": excluded}
    unlisted = sum(1 for image in captions if image not in owner and (images / image).is_file())

    command = ["python", "data_scripts/prepare_flickr8k.py", *(sys.argv[1:] if argv is None else argv)]
    info = {
        "name": "flickr8k",
        "source": SOURCE,
        "files": {"captions": f"{FOLDER.as_posix()}/{TOKEN_FILE}", **{name: f"{FOLDER.as_posix()}/{filename}" for name, filename in SPLITS.items()}},
        "license": LICENSE,
        "citation": CITATION,
        "command": shlex.join(command),
        "options": {"data": str(root), "images": str(images), "exclude_photos": [str(path) for path in args.exclude_photos]},
        "preprocessing": "none: raw captions, whitespace-stripped, in file order; valid is Flickr8k's dev split",
        "counts": {
            "listed": {name: len(names) for name, names in lists.items()},
            "skipped": skipped,
            "captioned_images_in_no_split": unlisted,
        },
    }
    write_caption_dataset(out, splits, images, language="en", info=info)
    for name, items in splits.items():
        gone = skipped[name]
        print(
            f"{name}: {len(items):,} images, {sum(len(item.captions) for item in items):,} captions; "
            f"skipped {sum(gone.values()):,} of {len(lists[name]):,} listed "
            f"({gone['not_in_images_folder']:,} not in the images folder, {gone['without_captions']:,} without captions"
            + (f", {gone['excluded_photos']:,} excluded" if gone["excluded_photos"] else "")
            + ")"
        )
    if unlisted:
        print(f"{unlisted:,} captioned images in the images folder are in no split list (not written)")
    print(f"wrote {out} (images stay in {images})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
