"""`make demo` timed as a newcomer runs it, here or on a machine made slower on purpose (issue 44, item 8).

Run from the project root, nothing else running::

    python bench/demo_run.py                    # this machine as it is
    python bench/demo_run.py --slowdown 2.5     # as on a machine 2.5 times slower (needs root: a cgroup CPU quota)
    python bench/demo_run.py --slowdown 2.5 --out runs/bench-demo-tiny --demo-option=--config=tasks/configs/tiny.yaml \
        --demo-option=--scenes=200 --demo-option=--scenes-set=train.epochs=2    # the check itself, in a few minutes

It runs ``attnkit demo --no-progress`` as its own process (into ``--out``, so runs/demo is left alone) and
reports its wall time and what the demo measured (its ``demo.json``: the translator's test scores, the
scene model's epochs, the held-out scene figures) against the README's promise: ``make demo`` within 8 minutes
with caption exact match >= 80 % and pointing >= 80 % on held-out scenes.

``--slowdown F`` lets every thread of the demo run at most 1/F of a core (Linux cgroup v1 CPU quotas, one cgroup
per thread, as root): a machine of the same cores, each F times slower. The demo trains for a fixed number of
epochs, so its figures do not move, and its time shows what such a machine takes. The calibration
(bench/machine.py) is measured inside the same limits, so the JSON line says how slow the slowed machine was.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from attnkit.cli import positive_number
from attnkit.errors import UserError, run_cli
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
PROMISE = {"minutes": 8.0, "caption_exact_match": 80.0, "pointing_hit_rate": 80.0}  # the README's, on held-out test scenes
WATCH_SECONDS = 0.2  # how often new threads are put in a cgroup of their own
CALIBRATE = "import json, sys; sys.path.insert(0, 'bench'); from machine import calibrate; print(json.dumps(calibrate()))"


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slowdown", type=positive_number, default=1.0, help="run as on a machine this many times slower (1: as it is)")
    parser.add_argument("--out", default=str(ROOT / "runs/bench-demo"), help="the demo's output_dir")
    parser.add_argument("--demo-option", action="append", default=[], metavar="OPTION", help="passed to attnkit demo (e.g. --demo-option=--scenes=200)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.slowdown < 1:
        raise UserError(f"--slowdown {args.slowdown:g}: a quota cannot make the machine faster; give 1 or more")
    busy = busy_cores()
    out = Path(args.out)
    command = [sys.executable, "-m", "attnkit", "demo", "--no-progress", *args.demo_option, "--set", f"output_dir={out}"]
    with slow_threads(args.slowdown) as enter:
        slowed = json.loads(subprocess.run([sys.executable, "-c", CALIBRATE], preexec_fn=enter, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
        print(f"running {' '.join(command[1:])} with every thread at 1/{args.slowdown:g} of a core; calibration there: {slowed}")
        started = time.perf_counter()
        finished = subprocess.run(command, preexec_fn=enter, cwd=ROOT)
        wall = time.perf_counter() - started
    if finished.returncode != 0:
        raise UserError(f"the demo failed (exit {finished.returncode}); its output is above")
    measured = json.loads((out / "demo.json").read_text(encoding="utf-8"))
    test = measured["held_out"]["test"]
    met = {
        "minutes": wall / 60 <= PROMISE["minutes"],
        "caption_exact_match": test["caption_exact_match"] >= PROMISE["caption_exact_match"],
        "pointing_hit_rate": test["pointing_hit_rate"] >= PROMISE["pointing_hit_rate"],
    }
    print(f"demo: {wall / 60:.1f} min wall; held-out scenes: caption exact {test['caption_exact_match']} %, pointing {test['pointing_hit_rate']} %")
    result = {
        "benchmark": "demo_run",
        "slowdown": args.slowdown,
        "wall_seconds": round(wall, 1),
        "calibration_slowed": slowed,  # this machine's calibration inside the quota: what the demo ran on
        "demo": measured,
        "promise": PROMISE,
        "met": met,
        "demo_options": args.demo_option,
        "out": project_path(str(out)),
    }
    return print_result(result, busy)


@contextlib.contextmanager
def slow_threads(slowdown: float) -> Iterator:
    """A function for ``preexec_fn`` that makes every thread of a child process (and of the processes it starts) run
    at most ``1 / slowdown`` of a core: a machine whose every core is ``slowdown`` times slower (a no-op at 1).

    One CPU quota for the whole process would not do: a phase with one busy thread (Python between the kernels) would
    run at full speed under a quota of more than one core. So each thread gets a cgroup of its own (cgroup v1 lets a
    thread move alone), with quota ``period / slowdown``; a watcher moves every new thread into its own as it appears
    (within ``WATCH_SECONDS``)."""
    if slowdown == 1:
        yield None
        return
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").is_file():
        raise UserError("cannot slow this machine's cores: needs the cgroup v1 cpu controller at /sys/fs/cgroup/cpu (Linux, as root)")
    parent = root / f"attnkit-slow-{os.getpid()}"
    try:
        parent.mkdir()
    except OSError as error:
        raise UserError(f"cannot make a cgroup at {parent}: {error.strerror} (run as root)") from None
    period, quota = 100_000, max(1_000, round(100_000 / slowdown))
    stop = threading.Event()

    def own_group(tid: str) -> None:
        group = parent / f"thread-{tid}"
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "tasks").write_text(tid)

    def watch() -> None:
        while not stop.wait(WATCH_SECONDS):
            for tasks in [parent / "tasks", *parent.glob("thread-*/tasks")]:
                with contextlib.suppress(OSError):
                    for tid in tasks.read_text().split():
                        if tasks.parent.name != f"thread-{tid}":  # new: started in its parent's group
                            own_group(tid)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def enter() -> None:  # in the child, before it runs the command
        (parent / "cgroup.procs").write_text(str(os.getpid()))

    try:
        yield enter
    finally:
        stop.set()
        watcher.join()
        for group in [*parent.glob("thread-*"), parent]:
            with contextlib.suppress(OSError):
                group.rmdir()


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
