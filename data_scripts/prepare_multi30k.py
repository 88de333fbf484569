"""Prepare Multi30k (task 1: en / de / fr image descriptions) as an attnkit translation dataset.

Reads the raw task-1 files ``ROOT/multi30k/task1/raw/{train,val,test_2016_flickr}.{en,de,fr}.gz``
(gzip'd UTF-8, one sentence per line, line i of each language a translation of line i of the
others; see ``SOURCE.md`` beside them) and writes the folder that ``attnkit train`` reads
(see ``attnkit.data.text``): splits ``train`` (29,000 pairs), ``valid`` (val, 1,014) and
``test`` (test_2016_flickr, 1,000). Sentences stay raw (original casing and punctuation),
whitespace-stripped; line i of the source file stays paired with line i of the target file.

Usage::

    python data_scripts/prepare_multi30k.py --source de --target en
    python data_scripts/prepare_multi30k.py --source en --target fr --data /data --out data/multi30k-en-fr
    python data_scripts/prepare_multi30k.py --source de --target en --out data/multi30k-de-en-study \
        --exclude-photos ../shared/data/flickr8k/Flickr_8k.testImages.txt \
        --exclude-photos ../shared/data/flickr8k/Flickr_8k.devImages.txt

Options:

--source/--target   any ordered pair of en, de, fr (required).
--data ROOT         folder holding ``multi30k/`` (default ``$ATTNKIT_DATA``, else ``../shared/data``
                    beside the project).
--out DIR           output folder (default ``data/multi30k-SRC-TGT`` in the project, which git ignores:
                    Multi30k is not redistributed with attnkit).
--exclude-photos F  leave out of ``train`` and ``valid`` every pair whose photo is named in F (image file
                    names one a line, Flickr8k or Flickr30k naming; repeatable, the photos of every list
                    left out), e.g. the Flickr8k test and validation lists, so that
                    a joint model sees none of those photos' sentences in training (``bench/real_attention.py``
                    studies them). ``test`` stays whole: its BLEU stays comparable. The counts left out go
                    into ``dataset.json``.

Terms: Multi30k has no licence file; its README provides the data for non-commercial research and
educational purposes (images under Flickr's terms). Cite Elliott et al. 2016 and, for French,
Elliott et al. 2017; ``dataset.json`` records this.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
try:
    from attnkit.data.multi30k import LANGUAGES, RAW_DIR, SPLITS, read_photo_list, read_split, read_split_with_photos
    from attnkit.data.sources import default_data_root
    from attnkit.data.text import write_parallel_dataset
    from attnkit.errors import UserError, run_cli
except ImportError:  # run from a checkout where attnkit is not installed
    sys.path.insert(0, str(PROJECT_ROOT / "src"))
    from attnkit.data.multi30k import LANGUAGES, RAW_DIR, SPLITS, read_photo_list, read_split, read_split_with_photos
    from attnkit.data.sources import default_data_root
    from attnkit.data.text import write_parallel_dataset
    from attnkit.errors import UserError, run_cli

SOURCE = "Multi30k task 1 raw files (https://github.com/multi30k/dataset, data/task1/raw)"
LICENSE = (
    "no licence file; the Multi30k README provides the data for non-commercial research and "
    "educational purposes, and use of the Flickr30k images must follow Flickr's terms of use"
)
CITATION = (
    "Elliott, Frank, Sima'an, Specia (2016): Multi30K: Multilingual English-German Image Descriptions; "
    "Elliott, Frank, Barrault, Bougares, Specia (2017): Findings of the Second Shared Task on "
    "Multimodal Machine Translation and Multilingual Image Description (French data)"
)
EXCLUDED_SPLITS = ("train", "valid")  # --exclude-photos: what a model learns or is chosen on


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare Multi30k task-1 raw files as an attnkit translation dataset (train / valid / test).",
    )
    parser.add_argument("--source", required=True, help="source language: en, de or fr")
    parser.add_argument("--target", required=True, help="target language: en, de or fr")
    parser.add_argument("--data", type=Path, default=None, help="data root holding multi30k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default data/multi30k-SRC-TGT in the project)")
    parser.add_argument("--exclude-photos", type=Path, action="append", default=[], metavar="LIST", help="leave the pairs of these photos out of train and valid (repeatable)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    for role in ("source", "target"):
        if getattr(args, role) not in LANGUAGES:
            raise UserError(f"--{role} '{getattr(args, role)}' is not a Multi30k task-1 language; choose from {', '.join(LANGUAGES)}")
    if args.source == args.target:
        raise UserError(f"source and target language are both '{args.source}'")
    root = args.data if args.data is not None else default_data_root(PROJECT_ROOT)
    if not root.is_dir():
        raise UserError(f"data root not found: {root} (give --data ROOT or set ATTNKIT_DATA)")
    raw_dir = root / RAW_DIR
    if not raw_dir.is_dir():
        raise UserError(f"{root} has no {RAW_DIR} folder (expected the Multi30k task-1 raw files there)")
    out = args.out if args.out is not None else PROJECT_ROOT / "data" / f"multi30k-{args.source}-{args.target}"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    languages = (args.source, args.target)
    left_out = set().union(*(read_photo_list(path) for path in args.exclude_photos)) if args.exclude_photos else None  # every list given
    splits, excluded = {}, {}
    for name, stem in SPLITS.items():
        if left_out is None or name not in EXCLUDED_SPLITS:
            splits[name] = read_split(root, stem, languages)
            continue
        lines = read_split_with_photos(root, stem, languages)  # each split's files read once
        splits[name] = [pair for photo, pair in lines if photo not in left_out]
        excluded[name] = len(lines) - len(splits[name])
    for name, pairs in splits.items():  # training validates every epoch, and an empty test split scores nothing
        if not pairs:
            raise UserError(f"the {name} split has no pair left: --exclude-photos {' '.join(map(str, args.exclude_photos))} lists every photo of it")
    command = ["python", "data_scripts/prepare_multi30k.py", *(sys.argv[1:] if argv is None else argv)]
    info = {
        "name": f"multi30k-{args.source}-{args.target}",
        "source": SOURCE,
        "files": {name: f"{RAW_DIR.as_posix()}/{stem}.{{{args.source},{args.target}}}.gz" for name, stem in SPLITS.items()},
        "license": LICENSE,
        "citation": CITATION,
        "command": shlex.join(command),
        "options": {"source": args.source, "target": args.target},
        "preprocessing": "none: raw sentences, whitespace-stripped; line i of both languages kept as a pair",
    }
    if args.exclude_photos:
        info["excluded_photos"] = {"lists": [str(path) for path in args.exclude_photos], "pairs_left_out": excluded}
    write_parallel_dataset(out, (args.source, args.target), splits, info=info)
    counts = ", ".join(f"{name} {len(pairs):,}" for name, pairs in splits.items())
    left_out = "".join(f"; left out {excluded[name]:,} {name} pairs of the listed photos" for name in excluded)
    print(f"wrote {out}: {counts} pairs ({args.source}->{args.target}){left_out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
