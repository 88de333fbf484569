"""Importance estimators checked on generated scenes, where the truth is known: chosen on validation, scored on test.

Run from the project root, on a joint scene model (``bench/scenes.py`` trains one)::

    python bench/importance_scenes.py --checkpoint runs/bench-scenes-rnn/joint/best.pt
    python bench/importance_scenes.py --checkpoint runs/bench-scenes-transformer/joint/declared.pt --valid 100
    python bench/importance_scenes.py --checkpoint ... --quick      # 3 + 3 scenes: a smoke check

1. Every candidate (each estimator of :mod:`attnkit.importance`; windows and random masks at several settings,
   hidden at the input, in the memory or from each step's attention) scores its maps on ``--valid`` validation scenes exactly as attention is scored, by
   ``attnkit.comparison.evaluate_scenes``: the pointing game over the words that name an object (image), the
   AER against the gold links over every word and over content words only (text), with the seconds per scene.
2. Chosen on validation, never on test: the image estimator that points at the named object most often (in-box
   mass breaks ties), the text estimator with the lowest AER over content words (over every word breaks ties).
   Norm-weighted attention is a view of attention, not an estimate of importance: it is scored, never chosen.
3. The chosen estimators and the attention on ``--test`` scenes: pointing overall and per word kind, AER over
   every word and over content words, against issue 45's targets: the image estimator points at the named object
   >= 95 % of the time and more often than the attention; the text estimator's AER over content words <= 0.10 and
   below the attention's.

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
from attnkit.importance import ESTIMATES_OF_IMPORTANCE, ImportanceSettings
from machine import busy_cores, print_result, project_path

TARGETS = {"pointing_hit_rate": 95.0, "aer_content_words": 0.10}  # issue 45, test scenes, unsupervised models
CANDIDATES = {  # name -> settings of one estimator; the name says the settings and where it hides (no place named: at the input)
    "attention": ImportanceSettings(("attention",)),
    "input": ImportanceSettings(("input",), hide_at="input"),
    "input_memory": ImportanceSettings(("input",), hide_at="memory"),
    "windows_1_2": ImportanceSettings(("windows",), window_sizes=(1, 2), hide_at="input"),
    "windows_1_2_3": ImportanceSettings(("windows",), window_sizes=(1, 2, 3), hide_at="input"),
    "windows_2_3": ImportanceSettings(("windows",), window_sizes=(2, 3), hide_at="input"),
    "windows_1_2_memory": ImportanceSettings(("windows",), window_sizes=(1, 2), hide_at="memory"),
    "windows_1_2_3_memory": ImportanceSettings(("windows",), window_sizes=(1, 2, 3), hide_at="memory"),
    "windows_2_3_memory": ImportanceSettings(("windows",), window_sizes=(2, 3), hide_at="memory"),
    "random_masks_256_share_0.25": ImportanceSettings(("random_masks",), masks=256, mask_share=0.25, hide_at="input"),
    "random_masks_256_share_0.5": ImportanceSettings(("random_masks",), masks=256, mask_share=0.5, hide_at="input"),
    "random_masks_256_share_0.25_memory": ImportanceSettings(("random_masks",), masks=256, mask_share=0.25, hide_at="memory"),
    "random_masks_256_share_0.5_memory": ImportanceSettings(("random_masks",), masks=256, mask_share=0.5, hide_at="memory"),
    "windows_1_2_attention": ImportanceSettings(("windows",), window_sizes=(1, 2), hide_at="attention"),
    "windows_1_2_3_attention": ImportanceSettings(("windows",), window_sizes=(1, 2, 3), hide_at="attention"),
    "random_masks_256_share_0.25_attention": ImportanceSettings(("random_masks",), masks=256, mask_share=0.25, hide_at="attention"),
    "gradients_32": ImportanceSettings(("gradients",), gradient_steps=32),
    "norm_weighted": ImportanceSettings(("norm_weighted",)),
}
FULL = {"valid": 50, "test": 200}
QUICK = {"valid": 3, "test": 3}
GROUNDING_KEYS = (
    "pointing_hit_rate", "in_box_mass", "aer", "aer_content_words", "pointing_hit_rate_by_word_kind", "misses_by_word_kind", "misses_on_other_objects_by_word_kind",
)  # fmt: skip


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a joint scene checkpoint (French -> English and captions)")
    parser.add_argument("--valid", type=positive_int, default=None, help=f"validation scenes to choose on (default {FULL['valid']})")
    parser.add_argument("--test", type=positive_int, default=None, help=f"test scenes to report on (default {FULL['test']})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated scenes (bench/scenes.py's default: 0)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help=f"which candidates, separated by commas (default all: {', '.join(CANDIDATES)})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['valid']} validation and {QUICK['test']} test scenes")
    return parser


def scored(comparer: AttentionComparer, scenes, settings: ImportanceSettings) -> tuple[dict, dict, float]:
    """The estimator's grounding, the attention's (emitting step), and the seconds per scene the evaluation took."""
    began = time.perf_counter()
    result = evaluate_scenes(comparer, scenes, importance=settings, progress=False)
    seconds = (time.perf_counter() - began) / len(scenes)
    (found,) = result["importance_grounding"].values()
    pick = lambda grounding: {key: grounding[key] for key in GROUNDING_KEYS}  # noqa: E731
    by_head = {"by_head": result["norm_weighted_by_head"]} if "norm_weighted_by_head" in result else {}  # norm_weighted: every head's view
    return {**pick(found), **by_head}, {**pick(result["grounding"]), "by_head": result["grounding_by_head"]}, round(seconds, 3)


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    valid_count, test_count = args.valid or sizes["valid"], args.test or sizes["test"]
    names = [name.strip() for name in args.candidates.split(",") if name.strip()]
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown or not names:
        raise UserError(f"unknown candidate {', '.join(unknown) or '(none)'}; choose from {', '.join(CANDIDATES)}")
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        raise UserError(f"no checkpoint at {checkpoint} (bench/scenes.py trains one)")
    busy_before = busy_cores()
    comparer = AttentionComparer.from_checkpoints(joint=checkpoint, device="cpu")

    valid_scenes = generate_scenes(valid_count, args.seed, "valid")
    validation, seconds, attention_valid = {}, {}, None
    for name in names:
        validation[name], attention_valid, seconds[name] = scored(comparer, valid_scenes, CANDIDATES[name])
        found = validation[name]
        print(f"validation, {name}: pointing {found['pointing_hit_rate']}%, AER {found['aer']} (content words {found['aer_content_words']}), {seconds[name]} s per scene")
    print(f"validation, the attention: pointing {attention_valid['pointing_hit_rate']}%, AER {attention_valid['aer']} (content words {attention_valid['aer_content_words']})")

    choosable = [name for name in names if CANDIDATES[name].estimators[0] in ESTIMATES_OF_IMPORTANCE]
    if not choosable:
        raise UserError("no candidate estimates importance (norm_weighted is a view of attention): add one to --candidates")
    image_choice = max(choosable, key=lambda name: (validation[name]["pointing_hit_rate"], validation[name]["in_box_mass"]))
    text_choice = min(choosable, key=lambda name: (validation[name]["aer_content_words"], validation[name]["aer"]))
    print(f"chosen on validation: image {image_choice}, text {text_choice}")

    test_scenes = generate_scenes(test_count, args.seed, "test")
    test = {}
    for name in dict.fromkeys([image_choice, text_choice]):
        test[name], attention_test, seconds_test = scored(comparer, test_scenes, CANDIDATES[name])
        print(f"test, {name}: pointing {test[name]['pointing_hit_rate']}%, AER {test[name]['aer']} (content words {test[name]['aer_content_words']}), {seconds_test} s per scene")
    print(f"test, the attention: pointing {attention_test['pointing_hit_rate']}%, AER {attention_test['aer']} (content words {attention_test['aer_content_words']})")
    image, text = test[image_choice], test[text_choice]
    checks = {
        "image_pointing_at_least_95": image["pointing_hit_rate"] >= TARGETS["pointing_hit_rate"],
        "image_points_more_often_than_attention": image["pointing_hit_rate"] > attention_test["pointing_hit_rate"],
        "text_content_aer_at_most_0.10": text["aer_content_words"] <= TARGETS["aer_content_words"],
        "text_content_aer_below_attention": text["aer_content_words"] < attention_test["aer_content_words"],
    }
    for check, ok in checks.items():
        print(f"target {check}: {'met' if ok else 'NOT met'}")
    result = {
        "benchmark": "importance_scenes",
        "mode": "quick" if args.quick else "full",
        "checkpoint": project_path(str(checkpoint)),
        "decoder": comparer.captioner.model.decoder.__class__.__name__,
        "valid_scenes": valid_count,
        "test_scenes": test_count,
        "seed": args.seed,
        "validation": validation,
        "validation_attention": attention_valid,
        "seconds_per_scene_validation": seconds,
        "chosen": {"image": image_choice, "text": text_choice},
        "test": test,
        "test_attention": attention_test,
        "targets": TARGETS,
        "checks": checks,
        "met": all(checks.values()),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
