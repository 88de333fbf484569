"""Prepare a Karpathy-split caption JSON (COCO, Flickr8k or Flickr30k) as an attnkit captioning dataset.

Reads one of Karpathy's split files, ``dataset_coco.json``, ``dataset_flickr8k.json`` or
``dataset_flickr30k.json`` (from ``caption_datasets.zip``, Karpathy and Fei-Fei 2015)::

    {"images": [{"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg", "split": "test",
                 "sentences": [{"raw": "A man with a red helmet on a small moped on a dirt road. ",
                                "tokens": ["a", "man", ...]}, ...]}, ...],
     "dataset": "coco"}

and writes the folder that ``attnkit.data.captions`` reads: splits ``train``, ``valid`` (from
``val``) and ``test``, each image with all its captions. The ``raw`` text of each sentence is used
(whitespace-stripped; the ``tokens`` are ignored: tokenisation happens in attnkit). An image's path
is ``filepath/filename`` under ``--images`` when it has a ``filepath`` (COCO: ``train2014/`` or
``val2014/``), else ``filename``. Images are not copied. For COCO the usual result is train 113,287
(82,783 train + 30,504 restval), valid 5,000 and test 5,000 images.

Usage::

    python data_scripts/prepare_coco.py --json caption_datasets/dataset_coco.json --images /data/coco --out data/coco
    python data_scripts/prepare_coco.py --json dataset_flickr8k.json --images /data/Flicker8k_Dataset \\
        --out data/flickr8k-karpathy --check-images

Options:

--json FILE             the Karpathy split JSON (required).
--images DIR            the image root (required): COCO's folder holding ``train2014/`` and ``val2014/``,
                        or the Flickr photo folder.
--out DIR               output folder (required; created, its dataset files replaced).
--restval {train,skip}  COCO's ``restval`` images (val2014 images outside Karpathy's val and test):
                        join train (default, as usual) or are left out.
--check-images          check that each image file exists; missing ones are left out and counted
                        (without it the images are not looked at).

An image with no non-empty sentence is left out and counted; empty sentences are dropped and counted.

Terms: ``dataset.json`` records the licence and citations of the dataset the JSON names (COCO:
annotations CC BY 4.0, images under Flickr's terms of use; Flickr8k / Flickr30k: research use,
photos owned by their Flickr owners) and Karpathy and Fei-Fei 2015 for the split.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

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

SPLITS = {"train": "train", "valid": "val", "test": "test"}  # our name -> Karpathy's
KARPATHY_SPLITS = ("train", "val", "test", "restval")

SPLIT_CITATION = "Karpathy, Fei-Fei (2015): Deep Visual-Semantic Alignments for Generating Image Descriptions, CVPR"
TERMS = {
    "coco": {
        "license": "COCO annotations: CC BY 4.0 (https://cocodataset.org/#termsofuse); the images belong to "
        "their Flickr owners and their use must follow Flickr's terms of use",
        "citation": "Lin et al. (2014): Microsoft COCO: Common Objects in Context, ECCV; Chen et al. (2015): "
        "Microsoft COCO Captions: Data Collection and Evaluation Server, arXiv:1504.00325",
    },
    "flickr8k": {
        "license": "no licence is given for the data; the photos come from Flickr and belong to their owners; "
        "Flickr8k was given out by the University of Illinois for research use",
        "citation": "Hodosh, Young, Hockenmaier (2013): Framing Image Description as a Ranking Task: Data, Models "
        "and Evaluation Metrics, Journal of Artificial Intelligence Research 47:853-899",
    },
    "flickr30k": {
        "license": "the photos come from Flickr and belong to their owners; the captions were given out by the "
        "University of Illinois for non-commercial research use under the Flickr30k terms",
        "citation": "Young, Lai, Hodosh, Hockenmaier (2014): From Image Descriptions to Visual Denotations, "
        "Transactions of the Association for Computational Linguistics 2:67-78",
    },
}
UNKNOWN_TERMS = {"license": "unknown: check the terms of the source dataset", "citation": "unknown"}


def read_json(path: Path) -> tuple[dict, str]:
    """The parsed file and its sha256."""
    if not path.exists():
        raise UserError(f"Karpathy split JSON not found: {path}")
    if not path.is_file():
        raise UserError(f"{path} is not a file (give --json the path of dataset_coco.json or similar)")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read {path}: {error}") from None
    try:
        parsed = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text ({error})") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("images"), list):
        raise UserError(f"{path} is not a Karpathy split file: expected an object with an \"images\" list")
    return parsed, hashlib.sha256(data).hexdigest()


def parse_entry(entry: object, where: str) -> tuple[str, str, list[str]]:
    """(image path relative to the image root, Karpathy split, raw sentences) of one ``images`` entry."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected an object, found {type(entry).__name__}")
    filename = entry.get("filename")
    if not isinstance(filename, str) or not filename.strip():
        raise UserError(f"{where}: no \"filename\"")
    where = f"{where} ({filename})"
    filepath = entry.get("filepath")
    if filepath is not None and not isinstance(filepath, str):
        raise UserError(f"{where}: \"filepath\" is not a string")
    split = entry.get("split")
    if split not in KARPATHY_SPLITS:
        raise UserError(f"{where}: \"split\" is {split!r}; expected one of {', '.join(KARPATHY_SPLITS)}")
    sentences = entry.get("sentences")
    if not isinstance(sentences, list):
        raise UserError(f"{where}: no \"sentences\" list")
    raws = []
    for number, sentence in enumerate(sentences):
        raw = sentence.get("raw") if isinstance(sentence, dict) else None
        if not isinstance(raw, str):
            raise UserError(f"{where}: sentence {number} has no \"raw\" text")
        raws.append(clean(raw))
    image = filename.strip().strip("/")
    if filepath and filepath.strip().strip("/"):
        image = f"{filepath.strip().strip('/')}/{image}"
    return image, split, raws


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare a Karpathy-split caption JSON (dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json) "
        "as an attnkit captioning dataset (train / valid / test).",
    )
    parser.add_argument("--json", type=Path, required=True, help="the Karpathy split JSON")
    parser.add_argument("--images", type=Path, required=True, help="image root: an image is DIR/filepath/filename (or DIR/filename)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; its dataset files are replaced)")
    parser.add_argument("--restval", choices=("train", "skip"), default="train", help="restval images join train (default) or are left out")
    parser.add_argument("--check-images", action="store_true", help="leave out (and count) images whose file does not exist")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if not args.images.is_dir():
        raise UserError(f"images folder not found: {args.images} (give --images DIR)")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a folder")
    parsed, sha256 = read_json(args.json)
    dataset = parsed.get("dataset") if isinstance(parsed.get("dataset"), str) else None

    ours = {karpathy: name for name, karpathy in SPLITS.items()}
    if args.restval == "train":
        ours["restval"] = "train"
    splits: dict[str, list[CaptionedImage]] = {name: [] for name in SPLITS}
    seen: dict[str, int] = {}
    karpathy_counts = dict.fromkeys(KARPATHY_SPLITS, 0)
    dropped = {"restval": 0, "missing_files": dict.fromkeys(SPLITS, 0), "no_sentences": 0, "empty_sentences": 0}
    for index, entry in enumerate(parsed["images"]):
        image, split, raws = parse_entry(entry, f"{args.json.name}: images[{index}]")
        if image in seen:
            raise UserError(f"{args.json.name}: images[{index}] and images[{seen[image]}] are both {image}")
        seen[image] = index
        karpathy_counts[split] += 1
        if split not in ours:
            dropped["restval"] += 1
            continue
        captions = tuple(raw for raw in raws if raw)
        dropped["empty_sentences"] += len(raws) - len(captions)
        if not captions:
            dropped["no_sentences"] += 1
            continue
        if args.check_images and not (args.images / image).is_file():
            dropped["missing_files"][ours[split]] += 1
            continue
        splits[ours[split]].append(CaptionedImage(image, captions))
    for name, items in splits.items():
        if not items:
            reason = " that exists under --images" if args.check_images and dropped["missing_files"][name] else ""
            raise UserError(
                f"{args.json} gives no '{SPLITS[name]}' image with a caption{reason} "
                f"({karpathy_counts[SPLITS[name]]} listed as '{SPLITS[name]}')"
            )

    terms = TERMS.get((dataset or "").lower(), UNKNOWN_TERMS)
    command = ["python", "data_scripts/prepare_coco.py", *(sys.argv[1:] if argv is None else argv)]
    info = {
        "name": f"{dataset or 'captions'}-karpathy",
        "source": f"Karpathy split JSON {args.json.name} (dataset {dataset or 'not named'}, sha256 {sha256})",
        "license": terms["license"],
        "citation": f"{terms['citation']}; split: {SPLIT_CITATION}",
        "command": shlex.join(command),
        "options": {"json": str(args.json), "images": str(args.images), "restval": args.restval, "check_images": args.check_images},
        "preprocessing": "none: the raw sentences, whitespace-stripped, in file order; valid is Karpathy's val"
        + ("; restval joins train" if args.restval == "train" else "; restval left out"),
        "counts": {"karpathy_splits": karpathy_counts, "dropped": dropped},
    }
    write_caption_dataset(args.out, splits, args.images, language="en", info=info)
    for name, items in splits.items():
        from_restval = " (train + restval)" if name == "train" and args.restval == "train" and karpathy_counts["restval"] else ""
        missing = f"; {dropped['missing_files'][name]:,} missing image files left out" if args.check_images else ""
        print(f"{name}: {len(items):,} images{from_restval}, {sum(len(item.captions) for item in items):,} captions{missing}")
    if dropped["restval"]:
        print(f"left out {dropped['restval']:,} restval images (--restval skip)")
    if dropped["no_sentences"] or dropped["empty_sentences"]:
        print(f"left out {dropped['no_sentences']:,} images without a caption; dropped {dropped['empty_sentences']:,} empty sentences")
    print(f"wrote {args.out} (images stay in {args.images})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
