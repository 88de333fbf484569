"""What ``attnkit compare --scenes N`` costs per scene, with importance maps (its default) and without.

Run from the project root::

    python bench/scene_compare_cost.py --checkpoint runs/scenes_multitask/best.pt            # 24 test scenes
    python bench/scene_compare_cost.py --checkpoint runs/scenes_multitask/best.pt --scenes 64

``attnkit compare --scenes N`` evaluates N generated test scenes and N compositional ones
(:func:`attnkit.comparison.evaluate_scenes`): it captions and translates them (batched beam search), then forces
each scene's first phrasing through both encoders with every layer's and head's attention, erasure and,
by default, the importance maps of every grid cell and source word (a re-encoded occlusion each). This times
:func:`~attnkit.comparison.evaluate_scenes` on ``--scenes`` test scenes, after a warm-up on two, with and
without the importance maps, and divides by the scenes. The cost depends on the model's size (its image
encoder above all: every grid cell is re-encoded) and on the machine; the JSON line says both.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnkit.cli import positive_int
from attnkit.comparison import AttentionComparer, evaluate_scenes
from attnkit.data.scenes import generate_scenes
from attnkit.errors import UserError, run_cli
from attnkit.model import count_parameters
from machine import busy_cores, print_result, project_path


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a joint (multitask) checkpoint trained on scenes (French -> English)")
    parser.add_argument("--scenes", type=positive_int, default=24, help="test scenes timed (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if not Path(args.checkpoint).is_file():
        raise UserError(f"--checkpoint {args.checkpoint} does not exist")
    busy_before = busy_cores()
    comparer = AttentionComparer.from_checkpoints(args.checkpoint, device="cpu")
    scenes = generate_scenes(args.scenes, args.seed, "test")
    evaluate_scenes(comparer, scenes[:2], progress=False)  # warm-up: first calls allocate and pick kernels
    seconds = {}
    for importance in (True, False):
        began = time.perf_counter()
        evaluate_scenes(comparer, scenes, importance=importance, progress=False)
        seconds[importance] = time.perf_counter() - began
        print(f"{'with' if importance else 'without'} importance maps: {seconds[importance]:.1f} s for {len(scenes)} scenes, {seconds[importance] / len(scenes):.2f} s a scene")
    layout = comparer.captioner.encode([scenes[0].image()]).layout
    result = {
        "benchmark": "scene_compare_cost",
        "checkpoint": project_path(args.checkpoint),
        "parameters": count_parameters(comparer.captioner.model),  # the joint model: both encoders, one decoder
        "image_grid": [layout.height, layout.width],
        "scenes": len(scenes),
        "seconds_with_importance": round(seconds[True], 2),
        "seconds_without_importance": round(seconds[False], 2),
        "per_scene_with_importance": round(seconds[True] / len(scenes), 3),
        "per_scene_without_importance": round(seconds[False] / len(scenes), 3),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
