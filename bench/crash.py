"""Crash safety: kill a training run with SIGKILL at random moments, then check nothing was lost.

    python bench/crash.py                 # 20 kills (about 6 minutes on 2 CPU cores)
    python bench/crash.py --kills 4       # a smoke run
    python bench/crash.py --device cuda   # the runs train on a GPU (default: the CPU)

One uninterrupted reference run first. Then the same run again, killed ``--kills``
times: every second kill at a random moment, the others while a checkpoint is being
written (the killer watches the run folder for the temporary file of an atomic write
and kills a few milliseconds after it appears). After every kill:

* every checkpoint in the folder must load with ``torch.load(weights_only=True)``
  (through attnkit's checkpoint validation);
* the run goes on with ``attnkit train --resume last.pt`` (or starts afresh when the
  kill came before the first checkpoint), which must not be refused: the lock of the
  killed process is gone with it and its temporary files are cleared.

After the last kill the run finishes; its final weights must equal the reference's
bit for bit (on CPU resume is exact), its log must hold each epoch once, and best.pt
must hold the epoch the progress names.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.distributed import resolve_device
from attnkit.errors import UserError, run_cli
from attnkit.files import temporary_files
from attnkit.run_folder import CHECKPOINTS
from machine import add_device_argument, busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
# The embedded Tatoeba corpus with a model big enough that a checkpoint write (about 10 MB with Adam's
# moments) takes a moment, and epochs short enough that kills land in every phase of a run.
RECIPE = [
    "--config", "tasks/configs/tiny.yaml",
    "--set", "text_encoder.embedding_size=64", "--set", "text_encoder.hidden_size=64",
    "--set", "decoder.embedding_size=64", "--set", "decoder.hidden_size=128", "--set", "decoder.attention_size=64",
    "--set", "decoder.dropout=0.2", "--set", "train.batch_size=64", "--set", "train.valid_max_examples=32",
    "--set", "train.patience=0",
]  # fmt: skip


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench-crash"))
    add_device_argument(parser)
    return parser


def train_command(run: Path, epochs: int, threads: int, device: torch.device = torch.device("cpu")) -> list[str]:
    last = run / "last.pt"
    common = ["--no-progress", "--set", f"train.epochs={epochs}", "--set", f"train.threads={threads}", "--set", f"train.device={device}"]
    if last.exists():
        return [sys.executable, "tasks/train.py", "--resume", str(last), *common]
    return [sys.executable, "tasks/train.py", *RECIPE, "--set", f"output_dir={run}", *common]


def start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate()
    if process.returncode != 0:
        raise UserError(f"a training run failed (exit {process.returncode}):\n{output[-3000:]}")
    return output


def kill_at_random(process: subprocess.Popen, rng: random.Random, longest: float) -> str:
    """SIGKILL after a random delay of up to ``longest`` seconds (unless the run ends first); says when it landed."""
    delay = rng.uniform(0.5, longest)
    try:
        process.wait(delay)
        return "ended first"
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        return f"random, {delay:.1f} s"


def kill_during_write(process: subprocess.Popen, run: Path, rng: random.Random, writes_left: int) -> str:
    """SIGKILL a few milliseconds into one of the next ``writes_left`` checkpoint writes of this process, chosen at random."""
    target, seen, current = rng.randint(1, max(1, writes_left)), 0, None
    while process.poll() is None:
        names = writing(run, process.pid)
        if names and names[0] != current:  # a new write began
            seen, current = seen + 1, names[0]
            if seen == target:
                time.sleep(rng.uniform(0.0, 0.005))
                process.send_signal(signal.SIGKILL)
                process.wait()
                return f"during the write of {names[0].split('.')[1]}.pt"
        elif not names:
            current = None
        time.sleep(0.0005)
    return "ended first"


def epochs_saved(run: Path) -> int:
    last = run / "last.pt"
    return load_checkpoint(last).training["progress"]["epoch"] if last.exists() else 0


def writing(run: Path, pid: int) -> list[str]:
    """The temporary checkpoint files process ``pid`` has open in ``run`` (see attnkit.files.atomic_path)."""
    return [path.name for name in CHECKPOINTS for path in temporary_files(run / name, pid)]


def check_checkpoints(run: Path) -> tuple[int, int]:
    """(checkpoints found, checkpoints that do not load)."""
    found = bad = 0
    for name in CHECKPOINTS:
        if (run / name).exists():
            found += 1
            try:
                load_checkpoint(run / name)
            except UserError as error:
                bad += 1
                print(f"  CORRUPT {name}: {error}")
    return found, bad


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    device = resolve_device(args.device)  # before the run folders are emptied
    out = Path(args.out)
    reference, crashed = out / "reference", out / "crashed"
    for run in (reference, crashed):
        if run.exists():
            for path in run.iterdir():
                path.unlink()
    busy = busy_cores()
    rng = random.Random(args.seed)

    started = time.perf_counter()
    finish(start(train_command(reference, args.epochs, args.threads, device)))
    reference_seconds = time.perf_counter() - started
    epoch_seconds = sum(json.loads(line)["epoch_seconds"] for line in (reference / "log.jsonl").read_text().splitlines()) / args.epochs
    print(f"reference run: {args.epochs} epochs in {reference_seconds:.0f} s ({epoch_seconds:.1f} s an epoch)")

    kills = landed_in_writes = corrupt = checked = attempts = 0
    while kills < args.kills and attempts < 3 * args.kills:
        number, attempts = attempts, attempts + 1
        epochs_left = args.epochs - epochs_saved(crashed)
        process = start(train_command(crashed, args.epochs, args.threads, device))
        if number % 2 == 0:  # start-up takes about what the reference spent outside its epochs
            how = kill_at_random(process, rng, longest=0.9 * (reference_seconds - epoch_seconds * (args.epochs - epochs_left)))
        else:
            how = kill_during_write(process, crashed, rng, writes_left=2 * epochs_left)
        if how == "ended first":  # the run finished before this kill: start it over for the remaining kills
            print(f"attempt {number + 1}: the run ended before its kill; starting over")
            for path in crashed.iterdir():
                path.unlink()
            continue
        kills += 1
        leftovers = writing(crashed, process.pid)
        landed_in_writes += bool(leftovers)
        found, bad = check_checkpoints(crashed)
        checked, corrupt = checked + found, corrupt + bad
        epoch = epochs_saved(crashed) if not bad else "unreadable"
        print(f"kill {kills} ({how}): last.pt at epoch {epoch}; {found} checkpoint(s), {bad} corrupt; half-written: {leftovers or 'none'}")

    finish(start(train_command(crashed, args.epochs, args.threads, device)))
    final, expected = load_checkpoint(crashed / "last.pt"), load_checkpoint(reference / "last.pt")
    same_weights = all(torch.equal(final.model[name], expected.model[name]) for name in expected.model)
    log = [json.loads(line)["epoch"] for line in (crashed / "log.jsonl").read_text().splitlines()]
    progress = final.training["progress"]
    best_ok = load_checkpoint(crashed / "best.pt").training["progress"]["epoch"] == progress["best_epoch"]
    print(f"after {kills} kills ({landed_in_writes} during a checkpoint write): {corrupt} corrupt of {checked} checkpoints checked; "
          f"resumed run {'EQUALS' if same_weights else 'DIFFERS FROM'} the uninterrupted one; log epochs {log}")  # fmt: skip
    return print_result(
        {
            "benchmark": "crash",
            "device": str(device),
            "kills": kills,
            "kills_during_checkpoint_writes": landed_in_writes,
            "checkpoints_checked": checked,
            "corrupt_checkpoints": corrupt,
            "resumed_run_finished": True,
            "final_weights_equal_uninterrupted": same_weights,
            "log_has_each_epoch_once": log == list(range(1, args.epochs + 1)),
            "best_pt_matches_progress": best_ok,
            "epochs": args.epochs,
            "reference_seconds": round(reference_seconds, 1),
            "seconds": round(time.perf_counter() - started, 1),
            "command": "python bench/crash.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        },
        busy,
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(run_cli(main))
