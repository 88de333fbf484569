"""Prepare your own captioned images (a folder of images and a TSV of captions) as an attnkit captioning dataset.

Reads ``--captions FILE``, UTF-8 text with one caption a line, ``image<TAB>caption`` (an image may
have several lines; an optional first line ``image<TAB>caption`` is a header and skipped; ``image``
is a path relative to ``--images DIR``, with ``/`` between folders), and writes the folder that
``attnkit.data.captions`` reads: splits ``train``, ``valid`` and (unless asked for none) ``test``,
each image with all its captions, in the order of the captions file. Images are not copied:
``dataset.json`` points at ``--images``. Captions stay raw, whitespace-stripped; tokenisation
happens in attnkit.

The split is by image (all captions of an image are in one split), either

* random (the default): ``--valid N`` and ``--test N`` images are drawn with ``--seed S`` (default
  a tenth of the images each, at least 1 for valid; seed 0), the rest is train; the same files,
  options and seed give the same split; or
* from your lists: ``--train-list FILE --valid-list FILE [--test-list FILE]``, one image path a
  line (as in the captions file). Captioned images in no list are left out (and counted); an
  image in two lists is an error.

Every image written must exist under ``--images``: missing ones are an error that says how many
and names the first few, unless ``--skip-missing`` leaves them out (and counts them). With lists,
``--skip-missing`` also leaves out listed images that have no caption (otherwise an error).

Usage::

    python data_scripts/prepare_caption_folder.py --images photos/ --captions captions.tsv --out data/my-captions
    python data_scripts/prepare_caption_folder.py --images photos/ --captions captions.tsv --out data/my-captions \\
        --valid 200 --test 500 --seed 1
    python data_scripts/prepare_caption_folder.py --images photos/ --captions captions.tsv --out data/my-captions \\
        --train-list train.txt --valid-list valid.txt --test-list test.txt

Options:

--images DIR        the image folder (required); image paths in the files are relative to it.
--captions FILE     the TSV of captions (required).
--out DIR           output folder (required; created, its dataset files replaced).
--language CODE     the captions' language, stored in dataset.json (default en).
--valid N --test N  random split: images for validation and test (``--test 0``: no test split).
--seed S            random split: shuffling seed (default 0).
--train-list/--valid-list/--test-list FILE   split lists instead of a random split.
--skip-missing      leave out (and count) missing images instead of stopping.

Terms: the data is yours; ``dataset.json`` records the command and counts, and any ``--license``
and ``--citation`` text you give.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

PROJECT_ROOT = Path(__file__).resolve().parents[1]
try:
    from attnkit.data.captions import CaptionedImage, write_caption_dataset
    from attnkit.data.sources import clean
    from attnkit.errors import UserError, run_cli
except ImportError:  # run from a checkout where attnkit is not installed
    sys.path.insert(0, str(PROJECT_ROOT / "src"))
    from attnkit.data.captions import CaptionedImage, write_caption_dataset
    from attnkit.data.sources import clean
    from attnkit.errors import UserError, run_cli

HEADER = ("image", "caption")
LIST_OPTIONS = {"train": "train_list", "valid": "valid_list", "test": "test_list"}
SHOWN = 5  # missing images named in an error


def read_lines(path: Path, what: str) -> tuple[list[str], str]:
    """Lines of a UTF-8 text file, split on '\\n' only, '\\r' removed; and the file's sha256."""
    if not path.exists():
        raise UserError(f"{what} not found: {path}")
    if not path.is_file():
        raise UserError(f"{what} {path} is not a file")
    try:
        data = path.read_bytes()
        text = data.decode("utf-8-sig")
    except OSError as error:
        raise UserError(f"cannot read {path}: {error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text ({error})") from None
    return [line.rstrip("\r") for line in text.split("\n")], hashlib.sha256(data).hexdigest()


def image_path(name: str, where: str) -> str:
    """A path relative to the image folder, '/'-separated, './' and doubled '/' removed."""
    name = name.strip()
    if not name:
        raise UserError(f"{where}: the image path is empty")
    if " ".join(name.split()) != name:
        raise UserError(f"{where}: the image path {name!r} has tabs or runs of spaces, which the dataset format cannot keep; rename the file")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UserError(f"{where}: the image path {name} is absolute; give paths relative to --images")
    return path.as_posix()


def read_captions(path: Path) -> tuple[dict[str, list[str]], str]:
    """Image path -> its captions, images in order of first appearance; and the file's sha256."""
    lines, sha256 = read_lines(path, "captions file")
    captions: dict[str, list[str]] = {}
    first = True
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        image, separator, caption = line.partition("\t")
        if first and tuple(field.strip().lower() for field in (image, caption)) == HEADER:
            first = False
            continue
        first = False
        where = f"{path}, line {number}"
        if not separator:
            raise UserError(f"{where}: expected 'image<TAB>caption', found no tab")
        caption = clean(caption)
        if not caption:
            raise UserError(f"{where}: the caption is empty")
        captions.setdefault(image_path(image, where), []).append(caption)
    if not captions:
        raise UserError(f"{path} holds no captions")
    return captions, sha256


def read_split_list(path: Path, option: str) -> list[str]:
    """Image paths of a split list, in file order, each once."""
    lines, _ = read_lines(path, f"--{option} file")
    names = [image_path(line, f"{path}, line {number}") for number, line in enumerate(lines, 1) if line.strip()]
    return list(dict.fromkeys(names))


def first_few(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def keep_existing(names: list[str], images: Path, skip_missing: bool, source: str) -> tuple[list[str], list[str]]:
    """(names whose file exists under ``images``, names whose file does not); an error on a missing one unless ``skip_missing``."""
    missing = [name for name in names if not (images / name).is_file()]
    if missing and not skip_missing:
        raise UserError(
            f"{len(missing)} of the {len(names)} images in {source} are not in {images}: {first_few(missing)} "
            "(fix the paths, or give --skip-missing to leave them out)"
        )
    absent = set(missing)
    return [name for name in names if name not in absent], missing


def random_split(images: list[str], valid_size: int, test_size: int, seed: int) -> dict[str, list[str]]:
    """Seeded random choice of valid and test images; every split keeps the order of ``images``."""
    order = list(images)
    random.Random(seed).shuffle(order)
    chosen = {name: "valid" for name in order[:valid_size]} | {name: "test" for name in order[valid_size : valid_size + test_size]}
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for name in images:
        splits[chosen.get(name, "train")].append(name)
    return splits


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare a folder of images and a TSV of captions (image<TAB>caption) as an attnkit captioning dataset.",
    )
    parser.add_argument("--images", type=Path, required=True, help="image folder; image paths are relative to it")
    parser.add_argument("--captions", type=Path, required=True, help="TSV file: image<TAB>caption, one caption a line")
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; its dataset files are replaced)")
    parser.add_argument("--language", default="en", help="language of the captions (default en)")
    random_group = parser.add_argument_group("random split by image (the default)")
    random_group.add_argument("--valid", type=int, default=None, help="validation images (default a tenth, at least 1)")
    random_group.add_argument("--test", type=int, default=None, help="test images (default a tenth; 0: no test split)")
    random_group.add_argument("--seed", type=int, default=None, help="shuffling seed (default 0)")
    list_group = parser.add_argument_group("split from lists (one image path a line)")
    list_group.add_argument("--train-list", type=Path, default=None, help="training images")
    list_group.add_argument("--valid-list", type=Path, default=None, help="validation images")
    list_group.add_argument("--test-list", type=Path, default=None, help="test images (optional: without it, no test split)")
    parser.add_argument("--skip-missing", action="store_true", help="leave out (and count) missing images instead of stopping")
    parser.add_argument("--license", default=None, help="licence / terms of your data, stored in dataset.json")
    parser.add_argument("--citation", default=None, help="how to cite your data, stored in dataset.json")
    return parser


def check_options(args: argparse.Namespace) -> bool:
    """Whether split lists are used."""
    lists = [option for option, attribute in LIST_OPTIONS.items() if getattr(args, attribute) is not None]
    if lists:
        random_options = [f"--{name}" for name in ("valid", "test", "seed") if getattr(args, name) is not None]
        if random_options:
            raise UserError(f"{' and '.join(random_options)} set the random split; they cannot go with --{lists[0]}-list")
        if "train" not in lists or "valid" not in lists:
            raise UserError("split lists: give --train-list and --valid-list (and optionally --test-list)")
    for option in ("valid", "test"):
        if getattr(args, option) is not None and getattr(args, option) < 0:
            raise UserError(f"--{option} must be 0 or more, not {getattr(args, option)}")
    if args.valid == 0:
        raise UserError("--valid must be at least 1: training reads the valid split")
    if not args.images.is_dir():
        raise UserError(f"images folder not found: {args.images} (give --images DIR)")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a folder")
    return bool(lists)


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    use_lists = check_options(args)
    captions, sha256 = read_captions(args.captions)
    counts: dict[str, object] = {"captioned_images": len(captions), "captions": sum(len(texts) for texts in captions.values())}

    if use_lists:
        lists = {name: read_split_list(getattr(args, attribute), f"{name}-list")
                 for name, attribute in LIST_OPTIONS.items() if getattr(args, attribute) is not None}
        owner: dict[str, str] = {}
        for name, names in lists.items():
            for image in names:
                if image in owner:
                    raise UserError(f"{image} is in both the {owner[image]} list and the {name} list")
                owner[image] = name
        uncaptioned = {name: [image for image in names if image not in captions] for name, names in lists.items()}
        unknown = [image for names in uncaptioned.values() for image in names]
        if unknown and not args.skip_missing:
            raise UserError(
                f"{len(unknown)} listed images have no caption in {args.captions}: {first_few(unknown)} "
                "(fix the lists, or give --skip-missing to leave them out)"
            )
        split_names: dict[str, list[str]] = {}
        missing: dict[str, int] = {}
        for name, names in lists.items():
            captioned = [image for image in names if image in captions]
            split_names[name], gone = keep_existing(captioned, args.images, args.skip_missing, f"the {name} list")
            missing[name] = len(gone)
        counts["listed"] = {name: len(names) for name, names in lists.items()}
        counts["skipped"] = {name: {"missing_files": missing[name], "without_captions": len(uncaptioned[name])} for name in lists}
        counts["captioned_images_in_no_list"] = sum(1 for image in captions if image not in owner)
        split_description = "from the given lists: " + ", ".join(f"{name} {getattr(args, attribute)}" for name, attribute in LIST_OPTIONS.items() if name in lists)
    else:
        present, gone = keep_existing(list(captions), args.images, args.skip_missing, str(args.captions))
        counts["skipped_missing_files"] = len(gone)
        valid_size = args.valid if args.valid is not None else max(1, len(present) // 10)
        test_size = args.test if args.test is not None else len(present) // 10
        if valid_size + test_size >= len(present):
            raise UserError(
                f"{len(present)} images{' (after leaving out missing ones)' if gone else ''} leave nothing for training "
                f"after {valid_size} validation and {test_size} test images; ask for fewer with --valid/--test"
            )
        seed = args.seed if args.seed is not None else 0
        random_options = {"valid": valid_size, "test": test_size, "seed": seed}
        split_names = random_split(present, valid_size, test_size, seed)
        if not test_size:
            del split_names["test"]
        split_description = f"random by image, seed {seed}: {valid_size} valid, {test_size} test, the rest train"

    for name, names in split_names.items():  # a test split given (--test-list) must hold images too
        if not names:
            raise UserError(f"the {name} split has no image (its list is empty, or all its images were left out)")
    splits = {name: [CaptionedImage(image, tuple(captions[image])) for image in names] for name, names in split_names.items()}

    command = ["python", "data_scripts/prepare_caption_folder.py", *(sys.argv[1:] if argv is None else argv)]
    info = {
        "name": args.out.resolve().name,
        "source": f"captions file {args.captions.name} (sha256 {sha256}) and images in {args.images}",
        "license": args.license or "not given (your own data: add the terms with --license)",
        "citation": args.citation or "not given",
        "command": shlex.join(command),
        "options": {
            "images": str(args.images),
            "captions": str(args.captions),
            "language": args.language,
            **({name + "_list": str(getattr(args, attribute)) for name, attribute in LIST_OPTIONS.items() if getattr(args, attribute) is not None}
               if use_lists else random_options),
            "skip_missing": args.skip_missing,
        },
        "preprocessing": "none: raw captions, whitespace-stripped, in file order",
        "split": split_description,
        "counts": counts,
    }
    write_caption_dataset(args.out, splits, args.images, language=args.language, info=info)
    for name, items in splits.items():
        print(f"{name}: {len(items):,} images, {sum(len(item.captions) for item in items):,} captions")
    if use_lists:
        skipped = counts["skipped"]
        left_out = {name: sum(gone.values()) for name, gone in skipped.items()}
        if any(left_out.values()):
            print("left out: " + ", ".join(
                f"{name} {skipped[name]['missing_files']} missing files, {skipped[name]['without_captions']} without captions" for name in skipped))
        if counts["captioned_images_in_no_list"]:
            print(f"{counts['captioned_images_in_no_list']:,} captioned images are in no list (not written)")
    elif counts["skipped_missing_files"]:
        print(f"left out {counts['skipped_missing_files']:,} images missing from {args.images}")
    print(f"wrote {args.out} (images stay in {args.images}; split {split_description})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
