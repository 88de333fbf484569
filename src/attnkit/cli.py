"""Pieces shared by the scripts in tasks/ that decode: search options and numbered output paths."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.errors import UserError


def add_search_arguments(parser: argparse.ArgumentParser, batch_size: int) -> None:
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the checkpoint's search.beam_size; 1 = greedy)")
    parser.add_argument("--n-best", type=int, default=1, help="print this many outputs per input")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="inputs decoded together in one batched search")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")


def beam_for(args: argparse.Namespace, checkpoint_beam: int) -> int:
    """The beam size to use; a clear error for impossible --beam / --n-best combinations."""
    if args.beam is not None and args.beam < 1:
        raise UserError("--beam must be at least 1")
    if args.n_best < 1 or (args.n_best > (args.beam or args.n_best)):
        raise UserError("--n-best must be between 1 and the beam size")
    if args.batch_size < 1:
        raise UserError("--batch-size must be at least 1")
    return args.beam or max(checkpoint_beam, args.n_best)


def numbered_path(path: str | Path, number: int, several: bool) -> Path:
    """``OUT.png`` for a single input, ``OUT-<number>.png`` when there are several."""
    path = Path(path)
    return path.with_name(f"{path.stem}-{number}{path.suffix or '.png'}") if several else path
