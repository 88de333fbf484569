"""What the importance maps cost: one photo and one sentence, both forms, both modalities (issue 32's <= 5 s).

Run from the project root::

    python bench/importance_cost.py --joint runs/bench-real-attention/joint/best.pt
    python bench/importance_cost.py --captioner runs/bench-flickr8k/attention-seed1-c4bdc0ed/best.pt \\
        --translator runs/single-multi30k-study/best.pt

Two figures for the same photo, German sentence and forced English sentence (default: the README's
study photo):

1. in-process: ``AttentionComparer.compare`` with and without ``importance=True`` (every layer's and
   head's attention kept either way, as ``attnkit compare`` asks), after one warm-up, the median of
   ``--repeats``; the difference is what the maps cost to compute;
2. end to end: ``attnkit compare`` run as a user runs it (a fresh process: imports, model loading,
   figures, report), with and without ``--no-importance``, the median of ``--repeats``; the difference
   is what the maps cost a user, importance.png and the report's views included.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnkit.cli import positive_int
from attnkit.comparison import AttentionComparer
from attnkit.data.images import open_rgb
from attnkit.data.sources import default_data_root
from attnkit.errors import UserError, run_cli
from attnkit.importance import add_importance_arguments, settings_from_arguments
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 5.0  # issue 32: the importance maps of one photo and one sentence, on two CPU cores
PHOTO = "1258913059_07c613f7ff.jpg"  # the README's study photo, with its Multi30k sentences
GERMAN = "Drei Leute sitzen an einem Picknicktisch vor einem Gebäude, das wie der Union Jack bemalt ist."
ENGLISH = "three people sit at a picnic table outside of a building painted like a union jack ."


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--joint", help="a joint checkpoint (it captions and translates)")
    parser.add_argument("--captioner", help="instead of --joint: a captioning checkpoint ...")
    parser.add_argument("--translator", help="... and a translation checkpoint into the same language")
    parser.add_argument("--image", default="", help=f"the photo (default: the shared Flickr8k {PHOTO})")
    parser.add_argument("--source", default=GERMAN, help="the source sentence about it")
    parser.add_argument("--target", default=ENGLISH, help="the target sentence forced through both")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed runs of each kind (the median is reported)")
    add_importance_arguments(parser)  # the estimators timed, as attnkit compare takes them
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if bool(args.joint) == bool(args.captioner and args.translator) or bool(args.captioner) != bool(args.translator):
        raise UserError("give --joint, or both --captioner and --translator")
    image = Path(args.image) if args.image else default_data_root(ROOT) / "flickr8k" / "images" / PHOTO
    if not image.is_file():
        raise UserError(f"no photo at {image} (give --image)")
    settings = settings_from_arguments(args)  # refused before any model loads
    busy_before = busy_cores()
    comparer = AttentionComparer.from_checkpoints(args.joint, args.captioner, args.translator, device="cpu")
    photo = open_rgb(image)
    comparer.compare([photo], [args.source], [args.target], heads=True)  # warm-up: first calls allocate and pick kernels

    def in_process(importance: bool) -> float:
        began = time.perf_counter()
        comparer.compare([photo], [args.source], [args.target], heads=True, importance=settings if importance else False)
        return time.perf_counter() - began

    def end_to_end(importance: bool, out: Path) -> float:
        models = ["--checkpoint", args.joint] if args.joint else ["--caption-checkpoint", args.captioner, "--translation-checkpoint", args.translator]
        command = [sys.executable, str(ROOT / "tasks" / "compare.py"), *models, "--image", str(image), "--source", args.source, "--target", args.target]
        command += ["--out", str(out), "--device", "cpu", *([] if importance else ["--no-importance"])]
        command += settings.as_arguments()
        began = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - began

    timings: dict[str, dict[str, list[float]]] = {"in_process": {"with": [], "without": []}, "end_to_end": {"with": [], "without": []}}
    with tempfile.TemporaryDirectory(prefix="attnkit-importance-cost-") as scratch:
        for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits both kinds
            for kind, importance in (("with", True), ("without", False)):
                timings["in_process"][kind].append(in_process(importance))
                timings["end_to_end"][kind].append(end_to_end(importance, Path(scratch) / kind))
    medians = {where: {kind: round(statistics.median(values), 2) for kind, values in by_kind.items()} for where, by_kind in timings.items()}
    cost = {where: round(found["with"] - found["without"], 2) for where, found in medians.items()}
    for where, found in medians.items():
        print(f"{where.replace('_', ' ')}: {found['with']} s with importance maps, {found['without']} s without: the maps cost {cost[where]} s")
    met = cost["end_to_end"] <= TARGET_SECONDS
    print(f"target: the maps of one photo and one sentence in <= {TARGET_SECONDS} s end to end: {'met' if met else 'NOT met'} ({cost['end_to_end']} s)")
    result = {
        "benchmark": "importance_cost",
        "models": {"joint": args.joint} if args.joint else {"captioner": args.captioner, "translator": args.translator},
        "photo": project_path(str(image)),
        "repeats": args.repeats,
        "estimators": list(settings.estimators),
        "hide_at": settings.hide_at,
        "window_sizes": list(settings.window_sizes),
        "masks": settings.masks,
        "mask_share": settings.mask_share,
        "seconds": {where: {kind: [round(v, 3) for v in values] for kind, values in by_kind.items()} for where, by_kind in timings.items()},
        "median_seconds": medians,
        "importance_seconds": cost,
        "target_seconds": TARGET_SECONDS,
        "met": met,
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
