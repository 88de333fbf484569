"""Translate sentences with a trained checkpoint.

    python tasks/translate.py --checkpoint runs/demo/best.pt "je suis fatigue ."
    python tasks/translate.py --checkpoint CK --beam 5 --input sentences.txt > out.txt
    echo "il est grand ." | python tasks/translate.py --checkpoint CK --attention-png attn.png

Prints one detokenised translation per input line (with --n-best N: N lines of
``index<TAB>score<TAB>translation`` per input). A sentence that cannot be
translated (empty, only unknown words) prints an empty line, a message on
stderr, and makes the exit code 1; the others are still translated.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnkit.cli import add_search_arguments, beam_for, numbered_path
from attnkit.data.text import read_lines
from attnkit.errors import UserError, run_cli
from attnkit.translation import Translator
from attnkit.viz import plot_attention_matrix
from attnkit.vocab import EOS


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input, else standard input)")
    parser.add_argument("--checkpoint", required=True, help="a translation checkpoint (best.pt)")
    parser.add_argument("--input", metavar="FILE", help="translate each line of this UTF-8 file")
    parser.add_argument("--attention-png", metavar="OUT.png", help="write the source x output attention matrix (OUT-<n>.png per sentence when several)")
    add_search_arguments(parser, batch_size=64)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.sentences and args.input:
        raise UserError("give sentences or --input FILE, not both")
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    if args.sentences:
        sentences = list(args.sentences)
    elif args.input:
        sentences = read_lines(args.input)
    else:
        sentences = sys.stdin.read().splitlines()
    if not sentences:
        raise UserError("nothing to translate: no sentence given")

    beam = beam_for(args, translator.search.beam_size)
    results = translator.translate(sentences, beam_size=beam, batch_size=args.batch_size, n_best=args.n_best)
    failures = 0
    for number, nbest in enumerate(results, 1):
        best = nbest[0]
        if best.error:
            failures += 1
            print(f"error: sentence {number}: {best.error}", file=sys.stderr)
            print()
            continue
        if best.truncated:
            print(
                f"warning: sentence {number} has more than {translator.pipeline.max_source_length} words; "
                "only the first ones were translated",
                file=sys.stderr,
            )
        if args.n_best == 1:
            print(best.text)
        else:
            for translation in nbest:
                print(f"{number}\t{translation.score:.4f}\t{translation.text}")
    sys.stdout.flush()

    if args.attention_png:
        drawable = [(n, r[0]) for n, r in enumerate(results, 1) if not r[0].error]
        for number, best in drawable:
            path = numbered_path(args.attention_png, number, several=len(results) > 1)
            rows = best.words + ([EOS] if best.finished else [])
            plot_attention_matrix(best.attention, best.source_words, rows, path, title=best.text)
            print(f"attention: {path}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
