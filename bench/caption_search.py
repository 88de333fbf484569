"""Which beam size and length normalisation a captioner should decode with, chosen on validation images.

    python bench/caption_search.py --checkpoint runs/bench-flickr8k/attention-seed0/best.pt
    python bench/caption_search.py --checkpoint CK --beams 1,3,5 --alphas 0,0.5,1,2 --split valid --limit 200

For every beam size and GNMT length penalty alpha (``search.length_penalty``: a hypothesis's score
is its log-probability / ((5 + length) / 6) ** alpha; 0 ranks by the raw log-probability, which
favours short captions), the validation captions' NLTK BLEU-4, CIDEr-D and BLEU-1, their mean length
against the references', the share that ended with <eos> and the brevity penalty BLEU pays: the
figures that say *why* a wider beam helps or not. The setting with the highest CIDEr-D on the chosen
split is printed with the command that makes it the checkpoint's default (``attnkit caption --beam``
and ``search.length_penalty``). Choose on validation, never on test.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from attnkit.captioning import Captioner
from attnkit.checkpoint import load_checkpoint
from attnkit.cli import non_negative_int
from attnkit.config import ExperimentConfig, from_dict
from attnkit.data.captions import image_root, read_caption_split
from attnkit.distributed import choose_threads
from attnkit.errors import UserError, run_cli
from attnkit.metrics import caption_scores, caption_words
from attnkit.model import MULTITASK
from flickr8k import numbers
from machine import add_device_argument, busy_cores, print_result, project_path


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", default="", help="prepared caption dataset (default: the checkpoint's data.path)")
    parser.add_argument("--split", default="valid", help="valid (default) or test: choose on valid")
    parser.add_argument("--beams", default="1,3,5")
    parser.add_argument("--alphas", default="0,0.5,1,2", help="GNMT length penalties, comma-separated (>= 0)")
    parser.add_argument("--limit", type=non_negative_int, default=0, help="the first N images of the split (0: all)")
    parser.add_argument("--cache", default="cache/features", help="feature cache of a frozen encoder ('' for none)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0: the usable cores; 1 beside another job)")
    add_device_argument(parser)
    return parser


def alphas_of(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--alphas {text!r} must be numbers separated by commas, e.g. --alphas 0,0.5,1") from None
    if not values or min(values) < 0 or len(set(values)) < len(values):
        raise UserError(f"--alphas {text!r}: each at least 0, none twice")
    return values


def length_figures(hypotheses: list[list[str]], references: list[list[list[str]]]) -> dict:
    """Mean caption length against the references' mean, and BLEU's brevity penalty over the corpus (the closest
    reference length per image, as corpus BLEU takes it)."""
    lengths = [len(caption_words(h)) for h in hypotheses]
    closest = []
    for refs, length in zip(references, lengths):
        closest.append(min((len(caption_words(r)) for r in refs), key=lambda n, length=length: (abs(n - length), n)))
    output, reference = sum(lengths), sum(closest)
    return {
        "mean_length": round(output / len(lengths), 2),
        "reference_mean_length": round(sum(len(caption_words(r)) for refs in references for r in refs) / sum(map(len, references)), 2),
        "brevity_penalty": round(1.0 if output >= reference else math.exp(1 - reference / max(output, 1)), 3),
    }


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    beams, alphas = numbers(args.beams, "--beams", 1), alphas_of(args.alphas)
    torch.set_num_threads(choose_threads(args.threads))
    busy = busy_cores()
    checkpoint = load_checkpoint(args.checkpoint, task=("captioning", MULTITASK))
    captioner = Captioner.from_checkpoint(checkpoint, device=args.device, cache_dir=args.cache or None)
    config = from_dict(ExperimentConfig, checkpoint.config)
    folder = Path(args.data or config.data.path)
    items = read_caption_split(folder, args.split)
    items = items[: args.limit] if args.limit > 0 else items
    root = image_root(folder)
    words_of = captioner.pipeline.tokenizer.words
    references = [[words_of(r) for r in item.captions] for item in items]
    rows = []
    for beam in beams:
        for alpha in alphas if beam > 1 else [0.0]:  # greedy takes one word at a time: alpha changes nothing
            captioner.search = replace(captioner.search, length_penalty=alpha)
            captions = [c[0] for c in captioner.caption([root / item.image for item in items], beam_size=beam, batch_size=64)]
            words = [captioner.pipeline.scored_words(c.words) for c in captions]
            scores = caption_scores(words, references, meteor=False, log=lambda _: None)
            row = {
                "beam": beam, "alpha": alpha, "bleu4_nltk": scores["bleu4_nltk"], "cider_d": scores["cider_d"], "bleu1": scores["bleu1"],
                "finished": round(sum(c.finished for c in captions) / len(captions), 3), **length_figures(words, references),
            }  # fmt: skip
            rows.append(row)
            print(
                f"beam {beam} alpha {alpha:g}: BLEU-4 {row['bleu4_nltk']}, CIDEr-D {row['cider_d']}, BLEU-1 {row['bleu1']}; "
                f"length {row['mean_length']} (references {row['reference_mean_length']}), brevity penalty {row['brevity_penalty']}, ended {row['finished']:.1%}"
            )
    best = max(rows, key=lambda row: row["cider_d"])
    print(f"best on {args.split} by CIDEr-D: beam {best['beam']}, alpha {best['alpha']:g} (BLEU-4 {best['bleu4_nltk']}, CIDEr-D {best['cider_d']})")
    result = {
        "benchmark": "caption_search", "checkpoint": project_path(args.checkpoint), "split": args.split, "images": len(items),
        "rows": rows, "best_by_cider_d": {"beam": best["beam"], "alpha": best["alpha"]},
    }  # fmt: skip
    return print_result(result, busy)


if __name__ == "__main__":
    sys.exit(run_cli(main))
