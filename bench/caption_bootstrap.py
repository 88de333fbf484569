"""How far apart captioners' test BLEU-4 and CIDEr-D can lie by the choice of test photos alone: a paired bootstrap over photos.

    python bench/caption_bootstrap.py RUN_A/best.pt RUN_B/best.pt [RUN_C/best.pt ...] --cache cache/features

Flickr8k's test split is 490 photos; two recipes that tie on validation have scored up to 1.4 BLEU-4 apart on it
(BENCHMARKS.md). This says how much of such a gap the photos alone can make, for checkpoints already trained:

1. Each checkpoint captions the split's photos once, with its own search settings at beam ``--beam`` (5, as the
   captioning targets are measured): its corpus BLEU-4 is NLTK's and its CIDEr-D pycocoevalcap's, the
   ``bleu4_nltk`` and ``cider_d`` of ``bench/flickr8k.py``.
2. ``--resamples`` times, photos are drawn with replacement, the same draw for every checkpoint (paired: a photo
   that is hard for one is hard for the others), and each checkpoint's figures are computed on the draw
   (Koehn 2004, "Statistical significance tests for machine translation evaluation").
3. Per checkpoint and figure: its value, and its standard deviation over the draws (what the photos alone move it
   by). For each checkpoint after the first: its difference from the first, the 95 % interval of that difference
   over the draws, and the share of draws in which it is above the first.

A draw costs a matrix product, not a scoring pass. Corpus BLEU comes from each photo's n-gram matches and lengths
summed over the draw, exactly as NLTK sums them (a test checks it equals ``nltk.translate.bleu_score.corpus_bleu``).
CIDEr-D is the draw's mean of each photo's CIDEr-D, with the document frequencies of the whole split's references
held fixed (pycocoevalcap would count a drawn photo's references again). Human-readable lines first; the LAST
line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnkit.captioning import Captioner
from attnkit.cli import positive_int
from attnkit.data.captions import image_root, read_caption_split
from attnkit.errors import UserError, run_cli
from attnkit.metrics import caption_words, cider_d_per_image
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
ORDERS = 4  # BLEU-4, uniform weights: NLTK's defaults
# One photo's statistics, summed over a draw: matches and candidate n-grams of each order, then the caption's
# length and its closest reference's length (NLTK's corpus BLEU is a function of these sums alone).
LENGTH, CLOSEST_REFERENCE = 2 * ORDERS, 2 * ORDERS + 1


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="two or more captioning checkpoints; the first is the one the others are compared with")
    parser.add_argument("--data", default=str(ROOT / "data" / "flickr8k"), help="a prepared captioning dataset (default data/flickr8k)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam", type=positive_int, default=5)
    parser.add_argument("--resamples", type=positive_int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the draws' random seed")
    parser.add_argument("--cache", default=None, help="the feature cache the checkpoints trained with (e.g. cache/features), so the photos' frozen features are read, not computed")
    return parser


def bleu_statistics(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> np.ndarray:
    """(P, 2 * ORDERS + 2) int64: per photo, NLTK's clipped matches and candidate n-grams for n = 1..4 (interleaved),
    the caption's length and the closest reference length, with NLTK's own definitions."""
    from nltk.translate.bleu_score import closest_ref_length, modified_precision

    rows = []
    for refs, hypothesis in zip(references, hypotheses, strict=True):
        row = []
        for n in range(1, ORDERS + 1):
            precision = modified_precision(refs, hypothesis, n)  # a Fraction NLTK leaves unreduced
            row += [precision.numerator, precision.denominator]
        rows.append([*row, len(hypothesis), closest_ref_length(refs, len(hypothesis))])
    return np.array(rows, dtype=np.int64).reshape(len(rows), 2 * ORDERS + 2)


def corpus_bleu4(totals: np.ndarray) -> np.ndarray:
    """Statistics summed over photos (..., 2 * ORDERS + 2) -> NLTK's corpus BLEU-4 (...,) on a 0-100 scale. As NLTK
    without smoothing: 0 without a matching unigram; an order with no match counts as the smallest float."""
    totals = np.asarray(totals, dtype=np.float64)
    matches, candidates = totals[..., 0 : 2 * ORDERS : 2], totals[..., 1 : 2 * ORDERS : 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_precision = np.where(matches > 0, np.log(matches / candidates), np.log(sys.float_info.min))
        length, reference = totals[..., LENGTH], totals[..., CLOSEST_REFERENCE]
        brevity = np.where(length > reference, 1.0, np.where(length == 0, 0.0, np.exp(1 - reference / length)))
    score = brevity * np.exp(log_precision.mean(-1))
    return 100 * np.where(matches[..., 0] == 0, 0.0, score)


def photo_figures(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> dict[str, np.ndarray]:
    """What each figure needs of each photo (words as :func:`attnkit.metrics.caption_words` leaves them): ``bleu4_nltk``,
    its BLEU statistics (P, 2 * ORDERS + 2); ``cider_d``, its pycocoevalcap CIDEr-D (P,), the split's document frequencies."""
    return {"bleu4_nltk": bleu_statistics(hypotheses, references), "cider_d": np.array(cider_d_per_image(hypotheses, references))}


def figures(per_photo: dict[str, np.ndarray], draws: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each figure of one checkpoint (its :func:`photo_figures`) on the whole split (``draws`` None: a scalar each)
    or on each draw (R, P) -> (R,)."""
    bleu, cider = per_photo["bleu4_nltk"], per_photo["cider_d"]
    if draws is None:
        return {"bleu4_nltk": corpus_bleu4(bleu.sum(0)), "cider_d": 100 * cider.mean()}
    return {"bleu4_nltk": corpus_bleu4(draws @ bleu), "cider_d": 100 * (draws @ cider) / len(cider)}


def compare(names: Sequence[str], checkpoints: Sequence[dict[str, np.ndarray]], resamples: int, seed: int) -> list[dict]:
    """Per checkpoint and figure its value and spread over the same ``resamples`` draws of photos; after the first, its
    difference from the first with the 95 % interval and the share of draws in which it is above."""
    photos = len(checkpoints[0]["cider_d"])
    draws = np.random.default_rng(seed).multinomial(photos, np.full(photos, 1.0 / photos), size=resamples)  # (R, P): times each photo is drawn
    drawn = [figures(checkpoint, draws) for checkpoint in checkpoints]  # per checkpoint: figure -> (R,)
    rows = []
    for index, (name, checkpoint) in enumerate(zip(names, checkpoints, strict=True)):
        row = {"checkpoint": name}
        for figure, value in figures(checkpoint).items():
            row[figure] = {"value": round(float(value), 2), "std_over_draws": round(float(drawn[index][figure].std()), 2)}
            if index:
                difference = drawn[index][figure] - drawn[0][figure]
                low, high = np.percentile(difference, [2.5, 97.5])
                row[figure].update(
                    minus_first=round(row[figure]["value"] - rows[0][figure]["value"], 2), interval_95=[round(float(low), 2), round(float(high), 2)],
                    share_above_first=round(float((difference > 0).mean()), 3),
                )  # fmt: skip
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if len(args.checkpoints) < 2:
        raise UserError("give two or more checkpoints: the others are compared with the first")
    missing = [path for path in args.checkpoints if not Path(path).is_file()]
    if missing:
        raise UserError(f"no checkpoint at {', '.join(missing)}")
    busy_before = busy_cores()
    items = read_caption_split(args.data, args.split)
    root = image_root(args.data)
    names, checkpoints = [], []
    for path in args.checkpoints:
        captioner = Captioner.from_checkpoint(path, cache_dir=args.cache)
        hypotheses, references, unreadable = captioner.caption_with_references(items, root, args.beam, batch_size=64)
        if unreadable:
            raise UserError(f"{unreadable} of the {args.split} photos could not be read: the figures would not be the split's")
        hypotheses, references = [caption_words(h) for h in hypotheses], [[caption_words(r) for r in refs] for refs in references]  # as caption_scores reads them
        names.append(project_path(str(Path(path).resolve())))
        checkpoints.append(photo_figures(hypotheses, references))
        whole = figures(checkpoints[-1])
        print(f"{names[-1]}: BLEU-4 {whole['bleu4_nltk']:.2f} (NLTK), CIDEr-D {whole['cider_d']:.2f} on {len(items)} {args.split} photos, beam {args.beam}")
    rows = compare(names, checkpoints, args.resamples, args.seed)
    for figure, label in (("bleu4_nltk", "BLEU-4"), ("cider_d", "CIDEr-D")):
        for row in rows[1:]:
            low, high = row[figure]["interval_95"]
            print(f"{row['checkpoint']} - {rows[0]['checkpoint']}: {row[figure]['minus_first']:+.2f} {label}, 95 % of draws within [{low:+.2f}, {high:+.2f}], above in {100 * row[figure]['share_above_first']:.1f} %")
        print(f"{label} of each checkpoint over the draws (std): {', '.join(str(row[figure]['std_over_draws']) for row in rows)}")
    result = {
        "benchmark": "caption_bootstrap", "data": project_path(str(Path(args.data).resolve())), "split": args.split, "photos": len(items),
        "beam": args.beam, "resamples": args.resamples, "seed": args.seed, "checkpoints": rows,
    }  # fmt: skip
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
