"""Grounding on generated scenes: one decoder for captioning and translation, against separate decoders.

Run from the project root::

    python bench/scenes.py            # full: tasks/configs/scenes_multitask.yaml, <= 30 min for the joint model
    python bench/scenes.py --quick    # the same steps on 400 training scenes, a minute per model (a smoke check)
    python bench/scenes.py --evaluate-only   # step 4 again on the checkpoints of an earlier run in --out
    python bench/scenes.py --supervision 1 --no-separate   # the joint model trained with attention supervision

1. Writes the training and validation scenes (``attnkit.data.scenes``, seed ``--seed``)
   into the run folder; the frozen backbone's grid features are cached (``cache/features``).
2. Trains the joint model: an image encoder and a text encoder sharing one decoder,
   target embeddings and output layer, batches of both tasks mixed
   (``train.max_minutes`` = ``--minutes``).
3. Trains the same recipe twice more with one task each (``train.caption_share`` 1 and
   0): separate decoders, each for the joint model's number of epochs, so every
   decoder sees its task's data as often as the shared one did.
4. Evaluates both set-ups on ``--scenes`` held-out scenes of the in-distribution test
   split and of the compositional split (colour-shape pairs never seen in training),
   as ``attnkit compare --scenes`` does: caption BLEU-4 and exact match, translation
   BLEU and exact match, pointing-game hit rate and in-box attention mass over the
   words that name an object, AER of the text attention against the gold alignments.
   Which step's attention is a word's (the step that emits it, or the step whose query
   has read it: ``decoder.reading_offset``) is chosen on the validation scenes
   first; the figures of both are reported for every split. For a multi-head decoder
   (``scenes_transformer.yaml``) the declared attention (a layer's mean of heads, or one
   head) is then chosen on the validation scenes too and written into
   ``joint/declared.pt``, which the evaluation reads.

Targets from the issue, for the joint model on the in-distribution split: pointing
game >= 90 %, AER <= 0.15, caption BLEU-4 >= 90; ``met`` requires all three. With
``--supervision W`` (``train.attention_supervision`` = W for every model, gold attention
from the training scenes' ground truth) the targets are pointing >= 97 % and AER <= 0.05.
The compositional split has no target. Issue 32's targets read the importance maps from the input
(each grid cell greyed, each source word made ``<unk>``, re-encoded: what each word's log-probability
lost) scored exactly as the attention is: pointing >= 95 %, AER <= 0.10, and both better than the
attention's (``importance``). Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnkit.captioning import Captioner
from attnkit.checkpoint import load_checkpoint, save_checkpoint, with_overrides
from attnkit.comparison import AttentionComparer, choose_declared_attention, describe_scene_result, evaluate_scenes, several_heads
from attnkit.config import load_config
from attnkit.data.scenes import generate_scenes, write_scene_dataset
from attnkit.errors import UserError, run_cli
from attnkit.importance import ImportanceSettings
from attnkit.multitask import train_multitask
from attnkit.train import TrainingProgress
from attnkit.model import count_parameters
from attnkit.translation import Translator
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"pointing_hit_rate": 90.0, "aer": 0.15, "caption_bleu4": 90.0}
SUPERVISED_TARGETS = {"pointing_hit_rate": 97.0, "aer": 0.05, "caption_bleu4": 90.0}
IMPORTANCE_TARGETS = {"pointing_hit_rate": 95.0, "aer": 0.10}  # issue 32: input importance, scored as attention is, and better than attention
# Issue 32's instrument, as its figures were read: through attention, and one position at a time hidden at the input
# (compare's default since issue 45 hides a photo's cells from attention: bench/importance_scenes.py scores that one)
ISSUE_32_IMPORTANCE = ImportanceSettings(("attention", "input"), hide_at="input")
FULL = {"train": 4000, "valid": 300, "scenes": 500, "minutes": 30.0}
QUICK = {"train": 400, "valid": 50, "scenes": 50, "minutes": 1.0}
EVALUATED_SPLITS = ("test", "compositional")
SEPARATE = {"caption_only": 1.0, "translation_only": 0.0}  # train.caption_share of each single-task model


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/scenes_multitask.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override (every model)")
    parser.add_argument("--minutes", type=float, default=None, help=f"training budget of the joint model (default {FULL['minutes']:g}, quick {QUICK['minutes']:g})")
    parser.add_argument("--scenes", type=int, default=None, help=f"held-out scenes per evaluated split (default {FULL['scenes']}, quick {QUICK['scenes']})")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generated scene")
    parser.add_argument("--no-separate", action="store_true", help="train and evaluate the joint model only")
    parser.add_argument("--supervision", type=float, default=0.0, metavar="W", help="train with train.attention_supervision=W (default 0: off); other targets")
    parser.add_argument("--out", default="", help="run folder (default runs/bench-scenes[-supervised][-quick])")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['train']} training scenes, {QUICK['minutes']:g} minute per model, {QUICK['scenes']} scenes per split")
    parser.add_argument("--evaluate-only", action="store_true", help="skip training: evaluate the checkpoints an earlier run left in the run folder")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    mode = "quick" if args.quick else "full"
    sizes = QUICK if args.quick else FULL
    minutes = args.minutes if args.minutes is not None else sizes["minutes"]
    evaluated = args.scenes if args.scenes is not None else sizes["scenes"]
    busy_before = busy_cores()
    if args.supervision < 0:
        raise UserError("--supervision must be 0 (off) or a positive weight")
    targets = SUPERVISED_TARGETS if args.supervision > 0 else TARGETS
    out = Path(args.out or ROOT / "runs" / f"bench-scenes{'-supervised' if args.supervision else ''}{'-quick' if args.quick else ''}")
    data = out / "data"
    if not args.evaluate_only:
        write_scene_dataset(data, {"train": sizes["train"], "valid": sizes["valid"]}, seed=args.seed)
        print(f"scenes ({mode}): {sizes['train']} training and {sizes['valid']} validation scenes in {data}")
    base = [f"data.path={data / 'captions'}", f"data.text_path={data / 'text'}", f"train.attention_supervision={args.supervision}"]

    def train(name: str, overrides: list[str]) -> tuple[Path, dict]:
        if args.evaluate_only:
            last = out / name / "last.pt"
            if not last.is_file():
                raise UserError(f"--evaluate-only: no earlier run in {out / name} (train first, or give its --out)")
            progress = TrainingProgress(**load_checkpoint(last).training["progress"])
        else:
            config = load_config(args.config, [*base, f"output_dir={out / name}", *overrides, *args.overrides])  # the user's --set last
            print(f"training '{name}' into {out / name} (a previous run there is replaced)")
            progress = train_multitask(config, overwrite=True, progress_bar=not args.no_progress)
        facts = {"train_minutes": round(progress.seconds / 60, 2), "epochs": progress.epoch, "stop_reason": progress.stop_reason or "all epochs"}
        return out / name / "best.pt", facts

    joint_checkpoint, joint_training = train("joint", [f"train.max_minutes={minutes}"])
    setups = {"shared": AttentionComparer(Captioner.from_checkpoint(joint_checkpoint), Translator.from_checkpoint(joint_checkpoint))}
    training = {"shared": joint_training}
    if not args.no_separate:
        checkpoints = {}
        for name, share in SEPARATE.items():
            # as many epochs as the joint model trained; the time cap only guards against a slow machine
            same_epochs = [f"train.caption_share={share}", f"train.epochs={joint_training['epochs']}", "train.patience=0", f"train.max_minutes={minutes}"]
            checkpoints[name], training[name] = train(name, same_epochs)
        setups["separate"] = AttentionComparer(Captioner.from_checkpoint(checkpoints["caption_only"]), Translator.from_checkpoint(checkpoints["translation_only"]))
    parameters = {"shared": count_parameters(setups["shared"].captioner.model)}
    if "separate" in setups:
        parameters["separate"] = count_parameters(setups["separate"].captioner.model) + count_parameters(setups["separate"].translator.model)

    # Which step's attention is a word's: chosen on the validation scenes (never the test ones), by the
    # joint model's pointing rate plus 100 x (1 - AER); both extractions are reported on every split.
    valid_scenes = generate_scenes(sizes["valid"], args.seed, "valid")
    first_validation = evaluate_scenes(setups["shared"], valid_scenes, importance=False)
    validation = first_validation["grounding_by_extraction"]
    extraction = max(validation, key=lambda name: validation[name]["pointing_hit_rate"] + 100 * (1 - validation[name]["aer"]))
    for name, grounding in validation.items():
        print(f"validation ({sizes['valid']} scenes), extraction '{name}': pointing {grounding['pointing_hit_rate']}%, AER {grounding['aer']}")
    print(f"extraction chosen on validation: {extraction}")
    # A multi-head decoder's declared attention (one layer's mean of heads, or one head): chosen on the validation
    # scenes under that extraction by the same rule, and recorded in the checkpoint every later figure reads.
    declared = None
    same = first_validation["extraction"] == extraction  # the per-head table is under the evaluation's extraction
    heads = (first_validation if same else evaluate_scenes(setups["shared"], valid_scenes, extraction=extraction, importance=False))["grounding_by_head"]
    if several_heads(heads):
        layer, head = choose_declared_attention(heads)
        declared_checkpoint = save_checkpoint(
            out / "joint" / "declared.pt",
            with_overrides(load_checkpoint(joint_checkpoint), [f"decoder.attention_layer={layer}", f"decoder.attention_head={head}"]),
        )
        setups["shared"] = AttentionComparer.from_checkpoints(joint=declared_checkpoint)
        declared = {"layer": layer, "head": head, "checkpoint": project_path(str(declared_checkpoint)), "validation_grounding_by_head": heads}
        print(f"declared attention chosen on validation: layer {layer + 1}, {'the mean of its heads' if head < 0 else f'head {head + 1}'} ({declared_checkpoint})")

    results: dict[str, dict] = {}
    for setup, comparer in setups.items():
        results[setup] = {}
        for split in EVALUATED_SPLITS:
            began = time.perf_counter()
            metrics = evaluate_scenes(comparer, generate_scenes(evaluated, args.seed, split), extraction=extraction, importance=ISSUE_32_IMPORTANCE)
            metrics.pop("distributions")
            metrics["evaluate_seconds"] = round(time.perf_counter() - began, 1)
            results[setup][split] = metrics
            first, *erasure = describe_scene_result(metrics)
            print("\n".join([f"{setup} decoder, {split}: {first}", *erasure]))

    joint = results["shared"]["test"]
    reached = {
        "pointing_hit_rate": joint["grounding"]["pointing_hit_rate"],
        "aer": joint["grounding"]["aer"],
        "caption_bleu4": joint["captioning"]["bleu4"],
    }
    checks = {
        "pointing_hit_rate": reached["pointing_hit_rate"] >= targets["pointing_hit_rate"],
        "aer": reached["aer"] <= targets["aer"],
        "caption_bleu4": reached["caption_bleu4"] >= targets["caption_bleu4"],
    }
    met = all(checks.values())
    # Does the attention matter? Removing the peak must cost a word more than removing a random position.
    erasure = {modality: joint["erasure"][modality]["peak_drop"] > joint["erasure"][modality]["random_drop"] for modality in ("image", "text")}
    for modality, hurts in erasure.items():
        print(f"erasure, {modality}: removing the peak hurts {'more' if hurts else 'NOT more'} than removing a random position")
    for name, ok in checks.items():
        print(f"target {name}: {reached[name]} ({'met' if ok else 'NOT met'}; target {'<=' if name == 'aer' else '>='} {targets[name]})")
    # What the words rest on: the input-importance maps scored as the attention is, against the same ground truth.
    from_input = joint["importance_grounding"]["input"]
    importance = {
        "targets": IMPORTANCE_TARGETS,
        "reached": {"pointing_hit_rate": from_input["pointing_hit_rate"], "aer": from_input["aer"]},
        "checks": {
            "pointing_hit_rate": from_input["pointing_hit_rate"] >= IMPORTANCE_TARGETS["pointing_hit_rate"],
            "aer": from_input["aer"] <= IMPORTANCE_TARGETS["aer"],
            "points_more_often_than_attention": from_input["pointing_hit_rate"] > reached["pointing_hit_rate"],
            "aligns_better_than_attention": from_input["aer"] < reached["aer"],
        },
        "by_form": joint["importance_grounding"],
        "agreement": joint["agreement"],
    }
    importance["met"] = all(importance["checks"].values())
    for name, ok in importance["checks"].items():
        print(f"importance from the input, {name}: {'met' if ok else 'NOT met'} (pointing {from_input['pointing_hit_rate']}%, AER {from_input['aer']})")
    result = {
        "benchmark": "scenes",
        "mode": mode,
        "scenes_per_split": evaluated,
        "train_scenes": sizes["train"],
        "attention_supervision": args.supervision,
        "targets": targets,
        "reached": reached,
        "met": met,
        "importance": importance,
        "extraction": extraction,
        "declared_attention": declared,
        "erasure_peak_hurts_more": erasure,
        "validation_grounding_by_extraction": validation,
        "results": results,
        "training": training,
        "parameters": parameters,
        "config": project_path(args.config),
        "overrides": args.overrides,
        "evaluate_only": args.evaluate_only,
        "seed": args.seed,
        "run_dir": str(out),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
