"""Translate sentences with a trained checkpoint.

    attnkit translate --checkpoint runs/demo/best.pt "Je suis fatigué."
    attnkit translate --checkpoint CK --beam 5 --input sentences.txt > out.txt
    echo "Il est grand." | attnkit translate --checkpoint CK --attention-png attn.png

Prints one detokenised translation per input line (with --n-best N: N lines of
``number<TAB>score<TAB>translation`` per input, best first; ``number``: the input's, from 1; a translation the length
limit stopped before its end comes after every finished one, whatever its score). A sentence that cannot be
translated (empty, only unknown words) prints an empty line, a message on
stderr, and makes the exit code 1; the others are still translated.

Input is read, translated and printed ``--batch-size`` lines at a time, in input
order: output starts at once on long input and memory does not grow with it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from itertools import chain, islice

from attnkit.cli import GivenOnce, add_search_arguments, beam_for, check_output_file, input_lines, is_numbered_like, numbered_path, stdin_lines, utf8_argument, warn_cut_sources, warn_slow_decoding
from attnkit.errors import UserError
from attnkit.translation import Translation, Translator, draw_translation_attention


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit translate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input, else standard input)")
    parser.add_argument("--checkpoint", required=True, action=GivenOnce, help="a translation checkpoint (best.pt)")
    parser.add_argument("--input", metavar="FILE", help="translate each line of this UTF-8 file")
    parser.add_argument("--attention-png", metavar="OUT.png", help="write the source x output attention matrix (OUT-<n>.png per sentence when several)")
    parser.add_argument("--replace-unk", action="store_true", help="write the source word the attention peaks on in place of each <unk> (word-level vocabularies)")
    add_search_arguments(parser, batch_size=64)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.sentences and args.input:
        raise UserError("give sentences or --input FILE, not both")
    if args.attention_png:
        check_output_file(args.attention_png, "--attention-png", figure=True)
        if args.input and is_numbered_like(args.input, args.attention_png):  # OUT.png or OUT-<n>.png, known only as they come
            raise UserError(f"--attention-png {args.attention_png} would write {args.input}, the --input file, over it: write the figures elsewhere")
        for number in range(1, len(args.sentences) + 1):  # sentences as arguments: every OUT-<n>.png is known now
            check_output_file(numbered_path(args.attention_png, number, len(args.sentences) > 1), "--attention-png", figure=True)
    if args.sentences:
        sentences: Iterator[str] = iter([utf8_argument(sentence, f"sentence {number}") for number, sentence in enumerate(args.sentences, 1)])
    elif args.input:
        sentences = input_lines(args.input, "--input")  # opened now: a bad path fails before the model loads
    else:
        sentences = stdin_lines()
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device, precision=args.precision)
    warn_slow_decoding(translator)
    beam = beam_for(args, translator.search.beam_size)

    # Stream: read --batch-size lines, translate them, print them (in input order) and flush, then read on.
    # Only the batch in hand is kept; a BrokenPipeError from print (stdout closed) is left to run_cli.
    failures = count = 0
    several = None  # are there several sentences (--attention-png names OUT-<n>.png)? known after the first batch
    while batch := list(islice(sentences, args.batch_size)):
        if several is None:
            several = len(batch) > 1
            if not several and args.attention_png and args.batch_size == 1:
                ahead = list(islice(sentences, 1))  # is this sentence the only one? read one line ahead to know
                several = bool(ahead)
                sentences = chain(ahead, sentences)
        results = translator.translate(batch, beam_size=beam, batch_size=args.batch_size, n_best=args.n_best, replace_unknown=args.replace_unk)
        for number, nbest in enumerate(results, count + 1):
            failures += print_translations(number, nbest, args.n_best, translator)
        sys.stdout.flush()
        if args.attention_png:
            for number, nbest in enumerate(results, count + 1):
                if not nbest[0].error:
                    write_attention(nbest[0], numbered_path(args.attention_png, number, several=bool(several)))
        count += len(batch)
    if not count:
        raise UserError("nothing to translate: no sentence given")
    return 1 if failures else 0


def print_translations(number: int, nbest: list[Translation], n_best: int, translator: Translator) -> int:
    """Print sentence ``number``'s translations (an empty line and a message for one that failed); 1 when it failed."""
    best = nbest[0]
    if best.error:
        print(f"error: sentence {number}: {best.error}", file=sys.stderr)
        print()
        return 1
    if best.truncated:
        warn_cut_sources([number], translator)
    if n_best == 1:
        print(best.text)
    else:
        for translation in nbest:
            print(f"{number}\t{translation.score:.4f}\t{translation.text}")
    return 0


def write_attention(best: Translation, path) -> None:
    check_output_file(path, "--attention-png", figure=True)  # OUT-<n>.png may be a folder
    draw_translation_attention(best, path)
    print(f"attention: {path}", file=sys.stderr)

