"""Score a checkpoint: sacreBLEU BLEU and chrF as JSON.

    python tasks/evaluate.py --checkpoint runs/demo/best.pt --split test
    python tasks/evaluate.py --checkpoint CK --source test.de --reference test.en --beam 5

``--split`` reads the prepared dataset the checkpoint was trained on (or
``--data DIR``); ``--source``/``--reference`` take any raw, untokenised
parallel text, one sentence per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from attnkit.checkpoint import load_checkpoint
from attnkit.data.text import read_lines, read_parallel
from attnkit.errors import UserError, run_cli
from attnkit.translation import TASK, Translator


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--split", help="split of the prepared dataset: train, valid or test")
    parser.add_argument("--data", help="prepared dataset folder (default: the one in the checkpoint's config)")
    parser.add_argument("--source", metavar="FILE", help="raw source sentences, one per line")
    parser.add_argument("--reference", metavar="FILE", help="raw reference translations, line-aligned with --source")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the checkpoint's search.beam_size)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="score only the first N pairs (0: all)")
    parser.add_argument("--output", metavar="FILE", help="also write the translations here, one per line")
    parser.add_argument("--device", default="auto")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if bool(args.source) != bool(args.reference):
        raise UserError("--source and --reference go together")
    if bool(args.split) == bool(args.source):
        raise UserError("give either --split NAME or --source FILE --reference FILE")
    checkpoint = load_checkpoint(args.checkpoint, task=TASK)
    config = checkpoint.config
    if args.split:
        data = args.data or config["data"]["path"]
        pairs = read_parallel(data, args.split, config["data"]["source_lang"], config["data"]["target_lang"])
        what = {"data": data, "split": args.split}
    else:
        sources, references = read_lines(args.source), read_lines(args.reference)
        if len(sources) != len(references):
            raise UserError(f"{args.source} has {len(sources)} lines but {args.reference} has {len(references)}")
        pairs = list(zip(sources, references))
        what = {"source": args.source, "reference": args.reference}
    if args.limit > 0:
        pairs = pairs[: args.limit]
    translator = Translator.from_checkpoint(checkpoint, device=args.device)
    scores = translator.evaluate(pairs, beam_size=args.beam, batch_size=args.batch_size, hypotheses_file=args.output)
    print(json.dumps({"checkpoint": args.checkpoint, **what, **scores}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
