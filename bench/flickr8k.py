"""Quality on the Flickr8k subset: Show-Attend-Tell through the shared decoder, and the same decoder without attention.

Run from the project root::

    python bench/flickr8k.py            # full: tasks/configs/flickr8k.yaml; the attention model, then the ablation, seeds 0 and 1
    python bench/flickr8k.py --quick    # the same steps on 300 training images for about two minutes (a smoke check;
                                        # the subset is written to <run folder>/quick-data, so --quick --reuse reuses)
    python bench/flickr8k.py --choose train.attention_regularization=0.25,1 --skip-ablation
                                        # one attention model per value; the best on validation is tested

1. Prepares ``data/flickr8k`` from ``../shared/data/flickr8k`` when it is not there
   (``data_scripts/prepare_flickr8k.py``); the frozen EfficientNet-Lite0 grid features
   are cached once (``cache/features``) and shared by both models.
2. Trains the recipe for ``--epochs`` (default 10; validation: greedy free-running decoding
   scored with CIDEr-D keeps the best epoch; ``--minutes`` is only a safety cap).
   With ``--choose KEY=V1,V2,...`` it trains one attention model per value, decodes each one's
   best checkpoint on the validation photos at the widest ``--beams`` (as the target is
   measured) and keeps the value whose validation CIDEr-D there is highest; only that one is
   tested (the JSON lists every candidate's validation CIDEr-D and BLEU-4, and which was chosen).
   ``--reuse`` takes a run already finished under the run folder with the same config instead
   of training it again (any folder: a ``--choose`` value equal to the recipe finds the
   recipe's runs), so a second seed or the ablation can be added to earlier runs.
3. Trains the same recipe, for the same number of epochs, with ``decoder.score=none``: no
   attention, the context is the mean grid vector, the baseline that shows what attention adds
   (``--skip-ablation`` leaves it out; ``met`` then needs the ablation's figure and is null).
   Every model trains once per ``--seeds`` value (default 0 and 1): figures are the mean and the
   spread (max - min) over the seeds, and ``--choose`` ranks values by their mean validation score.
4. With ``--scst-epochs N``: each model then trains N epochs of self-critical sequence training
   (``train.objective=scst``, :data:`SCST` and ``--scst-set`` on top) from its cross-entropy run's
   best.pt, into a run folder of its own; both stages are tested, and the recipe's figures (the
   target, the ablation's margin) are those of the SCST stage, which the cross-entropy stage's
   figures stand beside.
5. With ``--ensemble``: the recipe's seeds (its last stage) also caption together, beam search over the mean
   of their log-probabilities (:mod:`attnkit.ensemble`), on validation and test; reported apart
   (``ensemble``), never as the recipe's figure.
6. Scores each best checkpoint on the test images (all 5 references each) with beam 1
   and beam 5: BLEU-1..4, METEOR, CIDEr-D (pycocoevalcap) and NLTK corpus BLEU-4.

Human-readable lines first; the LAST line of stdout is one JSON object. Targets (issue 46): NLTK
BLEU-4 >= TARGET_BLEU4 and CIDEr-D >= TARGET_CIDER at the widest beam for the attention model (mean
over the seeds), above the no-attention model by at least MIN_MARGIN BLEU-4 and MIN_MARGIN_CIDER
CIDEr-D; ``met`` requires all four.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from attnkit.captioning import Captioner, train_captioning
from attnkit.checkpoint import load_checkpoint
from attnkit.cli import positive_int, positive_number
from attnkit.config import ExperimentConfig, load_config, to_dict
from attnkit.data.captions import image_root, read_caption_split, write_caption_dataset
from attnkit.errors import UserError, run_cli
from attnkit.model import count_parameters
from attnkit.run_folder import RunFolder
from attnkit.train import TrainingProgress
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_scripts import prepare_flickr8k  # noqa: E402  (the project root is not on sys.path for bench/ scripts)

TARGET_BLEU4 = 23.5  # issue 46: mean of two seeds at beam 5 (Xu et al. 2015: 19.5 soft, 21.3 hard; adaptive attention 23.5)
TARGET_CIDER = 59.0  # issue 46: CIDEr-D, likewise (adaptive attention on Flickr8k: 58.9 CIDEr)
MIN_MARGIN = 1.0  # attention earns its place: the no-attention model trails by at least this much BLEU-4 ...
MIN_MARGIN_CIDER = 2.0  # ... and this much CIDEr-D (means over the seeds)
QUICK = {"train": 300, "valid": 50, "test": 100}  # images per split in --quick mode
QUICK_DATA = "quick-data"  # --quick: the subset's dataset folder in the run folder (rewritten the same each time)
MODELS = {"attention": [], "no_attention": ["decoder.score=none"]}
# The self-critical stage's settings (BENCHMARKS.md, "Self-critical training"): batches of 32 photos (x 5 samples) for
# more steps an epoch; learning rate 2e-4 (the fine-tuned blocks 4x slower, as in cross-entropy), chosen on validation
# over the 5e-5 SCST codebases use after cross-entropy (they take some 10,000 steps an epoch on COCO; here 165).
# A GPU recipe's token batches and warm-up (tasks/configs/flickr8k_gpu.yaml) are its cross-entropy stage's only.
SCST = ["train.objective=scst", "train.lr=0.0002", "image_encoder.backbone_lr=0.00005", "train.batch_size=32", "train.batch_tokens=0", "train.warmup_steps=0"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/flickr8k.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override (both models)")
    parser.add_argument("--epochs", type=positive_int, default=10, help="epochs of each model: the same for both, so the ablation is fair")
    parser.add_argument("--minutes", type=positive_number, default=60.0, help="safety cap on each model's training time (the target's 60 minutes; the cap is part of the config --reuse compares)")
    parser.add_argument("--out", default="", help="run folder (default runs/bench-flickr8k, or runs/bench-flickr8k-quick)")
    parser.add_argument("--data", default="", help="data root holding flickr8k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--quick", action="store_true", help=f"train on {QUICK['train']} images for a minute each, test on {QUICK['test']}")
    parser.add_argument("--choose", metavar="KEY=V1,V2,...", help="train the attention model once per value of KEY and test the one best on validation")
    parser.add_argument("--seeds", default="0,1", help="train.seed of each run, comma-separated (each model trains once per seed; figures: mean and spread)")
    parser.add_argument("--beams", default="1,5", help="beam sizes the test is decoded with (the widest is the target's)")
    parser.add_argument("--skip-ablation", action="store_true", help="train and test the attention model only (no decoder.score=none baseline)")
    parser.add_argument("--scst-epochs", type=int, default=0, metavar="N", help="then N epochs of self-critical training from each model's best.pt (0: none)")
    parser.add_argument("--scst-set", dest="scst_overrides", action="append", default=[], metavar="KEY=VALUE", help="config override of the SCST stage only (after SCST's settings)")
    parser.add_argument(
        "--reuse", action="store_true",
        help="take a finished run under the run folder whose saved config equals the one asked for (NOT_TRAINING apart: output_dir, search, kept epochs) "
        "instead of training it again, and continue one cut short",
    )  # fmt: skip
    parser.add_argument("--ensemble", action="store_true", help="also decode the recipe's seeds together as one ensemble (reported apart)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def candidates(choose: str | None) -> list[list[str]]:
    """The overrides of each attention model to train: one empty list without ``--choose``."""
    if not choose:
        return [[]]
    key, equals, values = choose.partition("=")
    options = [value.strip() for value in values.split(",") if value.strip()]
    if not equals or not key.strip() or not options:
        raise UserError(f"--choose {choose!r} must look like section.key=value1,value2")
    twice = sorted({value for value in options if options.count(value) > 1})
    if twice:
        raise UserError(f"--choose {choose!r} names {', '.join(twice)} twice: each value is one model, and two of one would be the same")
    return [[f"{key.strip()}={value}"] for value in options]


def ensure_dataset(folder: Path, data_root: str) -> None:
    if not (folder / "dataset.json").is_file():
        prepare_flickr8k.main(["--out", str(folder)] + (["--data", data_root] if data_root else []))


def quick_subset(folder: Path, into: Path) -> Path:
    splits = {split: read_caption_split(folder, split)[:count] for split, count in QUICK.items()}
    return write_caption_dataset(into, splits, image_root(folder), info={"name": "flickr8k-quick", "subset_of": str(folder)})


def numbers(text: str, option: str, smallest: int) -> list[int]:
    """``"0,1"`` -> [0, 1]: whole numbers, each at least ``smallest``, none twice (one message otherwise)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option} {text!r} must be whole numbers separated by commas, e.g. {option} {smallest},{smallest + 1}") from None
    if not values or min(values) < smallest:
        raise UserError(f"{option} {text!r}: each value must be at least {smallest}")
    twice = sorted({value for value in values if values.count(value) > 1})
    if twice:
        raise UserError(f"{option} {text!r} names {', '.join(map(str, twice))} twice: each value is one run, and two runs of one would be the same")
    return values


NOT_TRAINING = ("output_dir", "search", "train.keep_epochs", "train.log_every")  # config keys that change nothing training produces


def training_keys(config: dict) -> dict:
    """``{"section.key": value}`` of a config (a plain dict), the :data:`NOT_TRAINING` keys left out."""
    flat = {f"{section}.{key}": value for section, keys in config.items() if isinstance(keys, dict) for key, value in keys.items()}
    flat.update({section: value for section, value in config.items() if not isinstance(value, dict)})
    return {key: value for key, value in flat.items() if key not in NOT_TRAINING and key.partition(".")[0] not in NOT_TRAINING}


def trains(folder: Path, config: ExperimentConfig) -> TrainingProgress | None:
    """``--reuse``: the progress of the run in ``folder`` when its last.pt trains exactly ``config`` (its saved config
    equal to it, :data:`NOT_TRAINING` apart); None for another training, no run, or a file that cannot be read."""
    run = RunFolder(folder)
    if not run.holds_run():
        return None
    try:
        saved, progress = run.standing_run()
        progress = TrainingProgress(**progress)
    except (UserError, TypeError):  # a damaged file, an older attnkit's progress: not reusable, trained again
        return None
    # A key the saved config lacks came after its run: the run trained with that key's default.
    kept, wanted = {**training_keys(to_dict(ExperimentConfig())), **training_keys(saved)}, training_keys(to_dict(config))
    # A key asked as "" (e.g. data.target_lang, image_encoder.weights_sha256) is resolved by training and saved resolved.
    same = kept.keys() == wanted.keys() and all(value in ("", kept[key]) for key, value in wanted.items())
    return progress if same else None


def finished_run(out: Path, config: ExperimentConfig) -> tuple[Path, TrainingProgress] | None:
    """A run folder under ``out`` that :func:`trains` ``config`` and ran to its end (all epochs, early stopping or the
    time budget), with its best.pt."""
    for folder in sorted(path.parent for path in out.glob("*/last.pt")):
        progress = trains(folder, config)
        if progress is not None and ran_to_its_end(folder, progress, config):
            return folder, progress
    return None


def ran_to_its_end(folder: Path, progress: TrainingProgress, config: ExperimentConfig) -> bool:
    """The run in ``folder`` stopped of itself (all of ``config``'s epochs, early stopping or the time budget) and has
    its best.pt; a run without a stop reason was cut short (the machine or the session went away)."""
    return (progress.stop_reason != "" or progress.epoch >= config.train.epochs) and (folder / "best.pt").is_file()


def training_digest(config: ExperimentConfig) -> str:
    """Eight hex digits naming what a run trains (:func:`training_keys`): run folders carry it, so a changed recipe
    trains into a new folder and never replaces the runs of the one before."""
    return hashlib.sha256(json.dumps(training_keys(to_dict(config)), sort_keys=True, default=str).encode()).hexdigest()[:8]


def cut_short_run(folder: Path, config: ExperimentConfig) -> Path | None:
    """``folder``'s last.pt when it :func:`trains` ``config`` but stopped before its end (the machine or the session
    went away): ``--reuse`` continues it from there rather than starting over."""
    return folder / "last.pt" if trains(folder, config) is not None else None


def mean_and_spread(values: list[float | None]) -> dict:
    """Mean, spread and runs of one score over the seeds. A score some run could not measure (METEOR where Java or
    its jar is missing, as on the lent GPU machine) has no mean or spread: None, as that run's own figure is."""
    if any(value is None for value in values):
        return {"mean": None, "spread": None, "runs": values}
    values = [float(value) for value in values]  # plain floats (scores may come as numpy floats)
    return {"mean": round(sum(values) / len(values), 2), "spread": round(max(values) - min(values), 2), "runs": values}


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    # Everything a user can get wrong fails here, before any data is prepared or any model trained.
    options = candidates(args.choose)
    seeds = numbers(args.seeds, "--seeds", 0)
    beams = numbers(args.beams, "--beams", 1)
    asked: dict[str, str] = {}
    for option in options:
        config = load_config(args.config, [*option, *MODELS["no_attention"], *args.overrides])  # an unknown key or a bad value: one message
        same = asked.setdefault(json.dumps(to_dict(config), sort_keys=True, default=str), option[0] if option else "")
        if option and same != option[0]:
            raise UserError(f"--choose {args.choose!r}: {same} and {option[0]} train the same model (the same value written two ways)")
    if args.ensemble and len(seeds) < 2:
        raise UserError("--ensemble decodes the seeds' checkpoints together: give at least two --seeds")
    if args.scst_epochs < 0 or (args.scst_overrides and not args.scst_epochs):
        raise UserError("--scst-epochs N (N >= 1) runs the SCST stage, which --scst-set configures; 0 (the default) runs none")
    if args.scst_epochs:  # the stage's keys and values, checked now (its start, each run's best.pt, is known later)
        load_config(args.config, [*args.overrides, *SCST, f"train.epochs={args.scst_epochs}", "train.init_from=best.pt", *args.scst_overrides])
    mode = "quick" if args.quick else "full"
    busy_before = busy_cores()
    dataset = ROOT / "data" / "flickr8k"
    ensure_dataset(dataset, args.data)
    out = Path(args.out or ROOT / "runs" / f"bench-flickr8k{'-quick' if args.quick else ''}")
    results: dict[str, dict] = {}
    choice: dict | None = None
    # --quick: a subset written in a fixed place under the run folder (the same files each time), so the runs'
    # data.path, part of their digest, stays the same and --reuse finds them.
    data = quick_subset(dataset, out / QUICK_DATA) if args.quick else dataset
    epochs, minutes = (3, 1.0) if args.quick else (args.epochs, args.minutes)
    test = read_caption_split(data, "test")

    def train(name: str, stem: str, model_overrides: list[str], seed: int, stage: list[str] = ()):
        """Train (or with --reuse take or continue) one model into ``<out>/<stem>-seed<seed>-<training digest>``;
        ``stage``: overrides after the user's (the SCST stage's)."""
        overrides = [f"data.path={data}", f"train.epochs={epochs}", f"train.max_minutes={minutes}", f"train.seed={seed}", *model_overrides]
        config = load_config(args.config, [*overrides, *args.overrides, *stage])  # the user's --set after the recipe's: they win
        folder = out / f"{stem}-seed{seed}-{training_digest(config)}"
        config = load_config(args.config, [f"output_dir={folder}", *overrides, *args.overrides, *stage])
        reusable = finished_run(out, config) if args.reuse else None
        if reusable:
            folder, progress = reusable
            print(f"flickr8k ({mode}): reusing '{name}' (seed {seed}) from {folder}: the same config, trained to its end ({progress.epoch} epochs)")
            # wall None: only a run trained here from its start knows its minutes with setup (a reused or continued one does not)
            return {"folder": folder, "config": config, "progress": progress, "wall": None, "seed": seed, "origin": "reused"}
        unfinished = cut_short_run(folder, config) if args.reuse else None
        started = time.perf_counter()
        if unfinished:
            resume = load_checkpoint(unfinished, task="captioning")
            print(f"flickr8k ({mode}): continuing '{name}' (seed {seed}) in {folder} from epoch {resume.training['progress']['epoch']}")
            progress = train_captioning(config, resume=resume, progress_bar=not args.no_progress)
        else:
            print(f"flickr8k ({mode}): training '{name}' (seed {seed}) into {folder} (a run cut short there is replaced; --reuse continues it)")
            progress = train_captioning(config, overwrite=True, progress_bar=not args.no_progress)
        wall = None if unfinished else time.perf_counter() - started
        return {"folder": folder, "config": config, "progress": progress, "wall": wall, "seed": seed, "origin": "continued" if unfinished else "trained"}

    valid = read_caption_split(data, "valid")

    def captioner_of(run: dict) -> Captioner:
        captioner = Captioner.from_checkpoint(run["folder"] / "best.pt", cache_dir=run["config"].data.feature_cache or None)
        captioner.search = run["config"].search  # the decoding asked for now (a reused run saved the settings of its day)
        return captioner

    def on_validation(captioner: Captioner) -> dict:
        """The validation photos at the widest beam: what --choose ranks by, as the target is measured."""
        scores = captioner.evaluate(valid, image_root(data), beam_size=max(beams), batch_size=64, meteor=False, log=lambda _: None)
        return {"bleu4_nltk": scores["bleu4_nltk"], "cider_d": scores["cider_d"], "beam": max(beams)}

    def on_test(captioner: Captioner) -> dict:
        """The test photos at each beam, with the seconds each decoding took."""
        scores = {}
        for beam in beams:
            began = time.perf_counter()
            scores[f"beam{beam}"] = captioner.evaluate(test, image_root(data), beam_size=beam, batch_size=64)
            scores[f"beam{beam}"]["decode_seconds"] = round(time.perf_counter() - began, 1)
        return scores

    def described(scores: dict) -> str:
        return "; ".join(f"beam {beam} BLEU-4 {scores[f'beam{beam}']['bleu4_nltk']} (NLTK), CIDEr-D {scores[f'beam{beam}']['cider_d']}" for beam in beams)

    def validate(run: dict) -> dict:
        """The run's best checkpoint :func:`on_validation` (once per run)."""
        if "valid_widest" not in run:
            run["valid_widest"] = on_validation(captioner_of(run))
        return run["valid_widest"]

    def evaluate(name: str, run: dict) -> dict:
        progress, folder = run["progress"], run["folder"]
        captioner = captioner_of(run)
        scores = on_test(captioner)
        print(f"{name} (seed {run['seed']}): {described(scores)}; {progress.epoch} epochs in {progress.seconds / 60:.1f} min")
        return {
            **scores,
            "seed": run["seed"],
            "run_dir": str(folder),
            "valid_best_cider_d": round(progress.best_score, 2),  # greedy, the epoch kept
            f"valid_beam{max(beams)}": validate(run),
            "origin": run["origin"],  # trained by this run, reused (--reuse), or continued from where it was cut short
            "train_minutes": round(progress.seconds / 60, 2),
            "train_wall_minutes_with_setup": None if run["wall"] is None else round(run["wall"] / 60, 2),
            "epochs": progress.epoch,
            "stop_reason": progress.stop_reason or "all epochs",
            "parameters": count_parameters(captioner.model),
            "trainable_parameters": sum(p.numel() for p in captioner.model.parameters() if p.requires_grad),
        }

    def summary(runs: list[dict]) -> dict:
        """Per beam, the mean and spread over the seeds of each caption score."""
        return {
            f"beam{beam}": {metric: mean_and_spread([run[f"beam{beam}"][metric] for run in runs]) for metric in ("bleu4_nltk", "bleu4", "cider_d", "meteor")}
            for beam in beams
        }  # fmt: skip

    # The attention model: per --choose value one run per seed; the value best on validation (mean over the seeds) is tested.
    trained = {}
    for option in options:
        key, _, value = option[0].partition("=") if option else ("", "", "")
        stem = f"attention-{key.rpartition('.')[2]}={value}" if option else "attention"
        trained[tuple(option)] = [train("attention", stem, option, seed) for seed in seeds]
    option = [] if not args.choose else list(max(trained, key=lambda o: sum(validate(run)["cider_d"] for run in trained[o]) / len(trained[o])))
    if args.choose:
        widest = f"beam{max(beams)}"
        choice = {
            "key": args.choose.partition("=")[0], "chosen": option[0], "ranked_by": f"validation CIDEr-D at {widest}, mean over the seeds",
            f"valid_{widest}": {o[0]: {m: mean_and_spread([validate(run)[m] for run in runs]) for m in ("cider_d", "bleu4_nltk")} for o, runs in trained.items()},
            "valid_best_cider_d_greedy": {o[0]: mean_and_spread([run["progress"].best_score for run in runs]) for o, runs in trained.items()},
        }  # fmt: skip
        for value, figures in choice[f"valid_{widest}"].items():
            print(f"validation at {widest}: {value}: CIDEr-D {figures['cider_d']['mean']}, BLEU-4 {figures['bleu4_nltk']['mean']} (NLTK; mean of {len(seeds)})")
        print(f"chosen on validation (CIDEr-D at {widest}, mean over the seeds): {option[0]}")
    def self_critical(name: str, stem: str, model_overrides: list[str], cross_entropy: dict) -> dict:
        """The SCST stage of one cross-entropy run, from its best.pt."""
        stage = [*SCST, f"train.epochs={args.scst_epochs}", f"train.init_from={cross_entropy['folder'] / 'best.pt'}", *args.scst_overrides]
        return train(name, f"{stem}-scst", model_overrides, cross_entropy["seed"], stage)

    def stages(name: str, stem: str, model_overrides: list[str], cross_entropy_runs: list[dict]) -> dict[str, list[dict]]:
        """Each run's test figures, and with --scst-epochs those of its SCST stage (as ``<name>_scst``)."""
        tested = {name: [evaluate(name, run) for run in cross_entropy_runs]}
        if args.scst_epochs:
            tested[f"{name}_scst"] = [evaluate(f"{name}_scst", self_critical(f"{name}_scst", stem, model_overrides, run)) for run in cross_entropy_runs]
        return tested

    runs = stages("attention", "attention", option, trained[tuple(option)])
    if not args.skip_ablation:
        # The chosen value too, so the baseline differs from the tested model in its attention only.
        ablated = [*option, *MODELS["no_attention"]]
        runs.update(stages("no_attention", "no_attention", ablated, [train("no_attention", "no_attention", ablated, seed) for seed in seeds]))
    results = {name: {"runs": model_runs, "summary": summary(model_runs)} for name, model_runs in runs.items()}
    test_images = len(test)

    widest = f"beam{max(beams)}"
    recipe = "attention_scst" if args.scst_epochs else "attention"  # the last stage is the recipe's figure
    ensemble = None
    if args.ensemble:  # every seed's best.pt of the recipe's last stage, one captioner
        members = [Path(run["run_dir"]) / "best.pt" for run in runs[recipe]]
        config = trained[tuple(option)][0]["config"]
        together = Captioner.from_checkpoints(members, cache_dir=config.data.feature_cache or None)
        together.search = config.search
        ensemble = {"members": [str(member) for member in members], **on_test(together), f"valid_{widest}": on_validation(together)}
        print(f"ensemble of {len(members)} ({recipe}, reported apart): {described(ensemble)}")
    attention = results[recipe]["summary"][widest]
    margin = met = None
    if "no_attention" in results:
        ablation = results[recipe.replace("attention", "no_attention")]["summary"][widest]
        margin = round(attention["bleu4_nltk"]["mean"] - ablation["bleu4_nltk"]["mean"], 2)
        cider_margin = round(attention["cider_d"]["mean"] - ablation["cider_d"]["mean"], 2)
        met = attention["bleu4_nltk"]["mean"] >= TARGET_BLEU4 and attention["cider_d"]["mean"] >= TARGET_CIDER and margin >= MIN_MARGIN and cider_margin >= MIN_MARGIN_CIDER
        print(
            f"target: NLTK BLEU-4 >= {TARGET_BLEU4} and CIDEr-D >= {TARGET_CIDER} at {widest} ({attention['bleu4_nltk']['mean']}, {attention['cider_d']['mean']}; "
            f"{recipe}, mean of {len(seeds)}) and above no attention by >= {MIN_MARGIN} BLEU-4 ({margin:+.2f}) and >= {MIN_MARGIN_CIDER} CIDEr-D ({cider_margin:+.2f}): "
            f"{'met' if met else 'NOT met'}"
        )
        print(f"attention vs none at {widest}: BLEU-4 {attention['bleu4_nltk']} vs {ablation['bleu4_nltk']} (NLTK), CIDEr-D {attention['cider_d']} vs {ablation['cider_d']}")
    result = {
        "benchmark": "flickr8k",
        "mode": mode,
        "test_images": test_images,
        "seeds": seeds,
        "beams": beams,
        "recipe": recipe,
        f"bleu4_nltk_{widest}_mean": attention["bleu4_nltk"]["mean"],
        f"cider_d_{widest}_mean": attention["cider_d"]["mean"],
        "target_bleu4": TARGET_BLEU4,
        "target_cider_d": TARGET_CIDER,
        "met": met,
        f"attention_minus_none_bleu4_nltk_{widest}": margin,
        "min_margin": MIN_MARGIN,
        "beam_gain_bleu4_nltk": {  # the widest beam against greedy, per model (means over the seeds)
            name: round(model["summary"][widest]["bleu4_nltk"]["mean"] - model["summary"]["beam1"]["bleu4_nltk"]["mean"], 2)
            for name, model in results.items() if "beam1" in model["summary"]
        },
        "models": results,
        "ensemble": ensemble,
        "choice": choice,
        "config": project_path(args.config),
        "overrides": args.overrides,
        "scst": {"epochs": args.scst_epochs, "settings": [*SCST, *args.scst_overrides]} if args.scst_epochs else None,
        "run_dir": str(out),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
