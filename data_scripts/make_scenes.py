"""Generate synthetic scenes with ground truth and write them as a dataset folder.

Usage::

    python data_scripts/make_scenes.py --out data/scenes                      # 4,000 / 300 / 500 / 500 scenes
    python data_scripts/make_scenes.py --out data/scenes-small --train 500 --valid 50 --test 100 --compositional 100 --seed 1

The folder holds ``images/``, a captioning dataset ``captions/`` (every English
phrasing of a scene is a reference), a French -> English parallel-text dataset
``text/`` (one pair per phrasing), ``<split>.jsonl`` with the ground truth (boxes,
the object each English word names, sure and possible word alignments) and
``dataset.json``. The ``compositional`` split holds the colour-shape pairs that the
other splits never show (see ``attnkit.data.scenes.HELD_OUT``). The same options
and seed always give the same files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
try:
    from attnkit.data.scenes import HELD_OUT, write_scene_dataset
    from attnkit.errors import UserError, run_cli
except ImportError:  # run from a checkout where attnkit is not installed, as the other data scripts can
    sys.path.insert(0, str(PROJECT_ROOT / "src"))
    from attnkit.data.scenes import HELD_OUT, write_scene_dataset
    from attnkit.errors import UserError, run_cli


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--valid", type=int, default=300)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--compositional", type=int, default=500, help="scenes with held-out colour-shape pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    counts = {"train": args.train, "valid": args.valid, "test": args.test, "compositional": args.compositional}
    if any(count < 0 for count in counts.values()) or args.train == 0:
        raise UserError("scene counts must not be negative, and --train must be positive")
    if args.size < 32:
        raise UserError("--size must be at least 32 pixels")
    folder = write_scene_dataset(args.out, {split: count for split, count in counts.items() if count > 0}, seed=args.seed, size=args.size)
    print(", ".join(f"{split}: {count:,}" for split, count in counts.items()) + " scenes")
    print(f"held out for the compositional split: {', '.join(f'{c} {s}' for c, s in sorted(HELD_OUT))}")
    print(f"wrote {Path(folder).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
