"""Caption images with a trained checkpoint.

    attnkit caption --checkpoint runs/flickr8k/best.pt photo.jpg more/*.jpg
    attnkit caption --checkpoint CK --beam 5 --attention-png attention.png photo.jpg
    attnkit caption --checkpoint seed0/best.pt --checkpoint seed1/best.pt photo.jpg    # an ensemble

Prints ``path<TAB>caption`` per image (with --n-best N: N lines of
``path<TAB>rank<TAB>score<TAB>caption``). Many images go through one batched
beam search. An image that cannot be read (missing, not an image, truncated,
too large, a directory) prints a message on stderr and makes the exit code 1;
the other images are still captioned. ``--attention-png`` writes, per image,
the image and one panel per generated word with its attention map overlaid.
Several ``--checkpoint`` (of one recipe: one vocabulary) decode as an ensemble:
the search runs over the mean of their next-word log-probabilities, and the
overlays show the first checkpoint's attention.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnkit.captioning import Caption, Captioner, draw_caption_attention
from attnkit.cli import add_search_arguments, batches, beam_for, check_output_file, check_output_folder, numbered_path, refuse_replacing_inputs, warn_slow_decoding
from attnkit.data.images import ImageError, open_rgb
from attnkit.errors import UserError


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit caption", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", help="image files")
    parser.add_argument("--checkpoint", required=True, action="append", help="a captioning checkpoint (best.pt); several: an ensemble")
    parser.add_argument("--attention-png", metavar="OUT.png", help="write the per-word attention overlays (OUT-<n>.png per image when several)")
    parser.add_argument("--cache", metavar="DIR", help="feature cache folder for a frozen encoder (default: no cache)")
    add_search_arguments(parser, batch_size=32)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    several = len(args.images) > 1
    if args.attention_png:  # before any work: a bad output path is not learnt after captioning
        check_output_file(args.attention_png, "--attention-png", figure=True)
        outputs = [numbered_path(args.attention_png, number, several) for number in range(1, len(args.images) + 1)]
        for output in outputs if several else ():
            check_output_file(output, "--attention-png", figure=True)
        refuse_replacing_inputs(outputs, "--attention-png", [(f"the image {image}", image) for image in args.images])
    if args.cache:
        check_output_folder(args.cache, "--cache", writable=False)  # a full cache may be read-only
    captioner = Captioner.from_checkpoints(args.checkpoint, device=args.device, cache_dir=args.cache, precision=args.precision)
    warn_slow_decoding(captioner)
    beam = beam_for(args, captioner.search.beam_size)
    failures = 0
    numbers = iter(range(1, len(args.images) + 1))
    for chunk in batches(args.images, args.batch_size):  # print each batch as it is done
        results = captioner.caption(chunk, beam_size=beam, batch_size=args.batch_size, n_best=args.n_best)
        for nbest in results:
            failures += print_captions(nbest, args.n_best)
        sys.stdout.flush()
        for nbest in results:
            number = next(numbers)
            if args.attention_png and not nbest[0].error:
                write_overlays(nbest[0], numbered_path(args.attention_png, number, several))
    return 1 if failures else 0


def print_captions(nbest: list[Caption], n_best: int) -> int:
    """Print one image's captions (a message on stderr for one that failed); 1 when it failed."""
    best = nbest[0]
    if best.error:
        print(f"error: {best.error}", file=sys.stderr)
        return 1
    if n_best == 1:
        print(f"{best.image}\t{best.text}")
    else:
        for rank, caption in enumerate(nbest, 1):
            print(f"{caption.image}\t{rank}\t{caption.score:.4f}\t{caption.text}")
    return 0


def write_overlays(best: Caption, path) -> None:
    try:
        image = open_rgb(best.image)
    except ImageError as error:  # removed or changed since it was captioned
        raise UserError(str(error)) from None
    draw_caption_attention(best, image, path)
    print(f"attention: {path}", file=sys.stderr)

