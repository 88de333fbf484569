"""Average the weights of several checkpoints of one model into one checkpoint (checkpoint averaging).

    attnkit train --config CONFIG --set train.keep_epochs=5      # keeps epoch-<k>.pt of the last 5 epochs
    attnkit average runs/NAME/epoch-*.pt --out runs/NAME/averaged.pt
    attnkit evaluate --checkpoint runs/NAME/averaged.pt --split valid

The mean of the weights after the last few epochs is usually a little better than any one of them
and costs nothing at decoding time. The checkpoints must be of one model (the same task, vocabularies,
weight shapes and model config: heads, image size, ...); the result holds weights, config and vocabularies only (it translates and
captions; it cannot be resumed). Checkpoints of several runs are refused unless --across-runs: two seeds' mean
is far worse than each (captioning runs decode as an ensemble instead). Compare it with best.pt on the validation split, not the test. An
existing --out (an earlier mean, a run's best.pt) is replaced only with --overwrite; a run's last.pt never (the run
could not be resumed).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from pathlib import Path

from attnkit.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from attnkit.cli import check_output_file, same_file
from attnkit.errors import UserError
from attnkit.run_folder import RunFolder


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit average", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoints of one model (e.g. runs/NAME/epoch-*.pt)")
    parser.add_argument("--out", required=True, help="where to write the averaged checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists (a run's best.pt, say)")
    parser.add_argument("--across-runs", action="store_true", help="average checkpoints of several runs (runs fine-tuned from one start); refused otherwise")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    check_output_file(args.out, "--out")
    inputs = [Path(path) for path in args.checkpoints]
    for i, path in enumerate(inputs):
        if any(same_file(path, other) for other in inputs[:i]):
            raise UserError(f"{path} is given twice: each checkpoint counts once in the mean")
        if same_file(Path(args.out), path):
            # Refused before any work: the inputs are read one by one, and one would be read after it was replaced.
            raise UserError(f"--out {args.out} is one of the checkpoints to average; write the mean to a new file")
    out = Path(args.out)
    run = RunFolder(out.parent)
    if out.name == "last.pt" and run.owns(out):  # even with --overwrite: a mean holds no training state
        raise UserError(f"--out {out} is the training state of the run in {run.path}: the mean cannot be resumed, so the run could not go on; write it to another file (averaged.pt)")
    if out.exists() and not args.overwrite:
        whose = f" (the {out.name} of the run in {run.path})" if run.owns(out) else ""
        raise UserError(f"--out {out} exists{whose}; pass --overwrite to replace it, or write the mean to a new file")
    checkpoints = [load_checkpoint(path) for path in args.checkpoints]
    folders = {path.resolve().parent for path in inputs}  # a run's epoch checkpoints share one folder: its last.pt is read once
    if len(runs := {run_id for run_id in map(run_in, folders) if run_id is not None}) > 1 and not args.across_runs:
        # Two seeds' weights do not line up (a unit of one is no unit of the other): their mean translates next to nothing.
        instead = "decode them as an ensemble (attnkit caption or evaluate --checkpoint A --checkpoint B)" if checkpoints[0].task == "captioning" else "compare them one by one"
        raise UserError(
            f"these checkpoints come from {len(runs)} runs (their folders' last.pt name different runs): the mean of runs trained "
            f"from different starts is far worse than each; {instead}, or pass --across-runs for runs fine-tuned from one start (a model soup)"
        )
    averaged = average_checkpoints(checkpoints, args.checkpoints)
    with run.claim() if run.owns(out) else contextlib.nullcontext():  # not while a training writes that run
        save_checkpoint(out, averaged)
    print(f"wrote {args.out}: the mean of {len(checkpoints)} checkpoints' weights")
    return 0


def run_in(path: Path) -> str | None:
    """The run whose checkpoints a folder holds: the run_id in its last.pt (a folder's checkpoints are its run's: a new
    run there removes the old one's, a resume into a new folder keeps the id), or None where no run can be read."""
    folder = RunFolder(path)
    if not folder.holds_run():
        return None
    with contextlib.suppress(UserError):  # a damaged last.pt: the mean's inputs have been read already
        return folder.standing_progress().get("run_id") or None
    return None

