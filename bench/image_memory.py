"""Which image memory makes a captioner's attention localise and matter: captions, faithfulness and localisation of each candidate, on validation.

Run from the project root::

    python bench/image_memory.py                     # the default candidates (CANDIDATES), trained for --epochs each
    python bench/image_memory.py --candidate "grid14: image_encoder.image_size=448 image_encoder.grid_size=14"
    python bench/image_memory.py --checkpoint "recipe: runs/bench-flickr8k/attention/best.pt"   # a captioner trained elsewhere
    python bench/image_memory.py --evaluate-only     # the candidates an earlier run left in --out, measured again
    python bench/image_memory.py --quick             # a tiny model on a slice of the data (a smoke check)

Each candidate is ``tasks/configs/flickr8k.yaml`` (Show-Attend-Tell over EfficientNet-Lite2 cells, last two blocks fine-tuned; the
default candidates pin the Lite0 backbone issue 19 measured them on) with its overrides, trained for the same ``--epochs`` into ``--out``/NAME (NAME's letters, digits, '.' and '-'; a name
that would leave ``--out`` or share a folder with another is refused, and a run there that this benchmark did not
train is never replaced). Every candidate's config is checked before the first one trains. Everything is measured
on the Flickr8k *validation* photos (the choice is made there, never on the test photos):

1. captions: BLEU-4 and CIDEr-D at beam 5 (all references; a ``--checkpoint`` decoded with ``--config``'s search
   settings, e.g. its length penalty, as the candidates are), and the best greedy validation CIDEr-D of training;
2. spread: each word's normalised entropy and effective cells (exp entropy) over its photo, its reference forced;
3. faithfulness: erasure (:func:`attnkit.analysis.erasure`): how often removing the word's peak cell, or a
   random cell, changes the word the model would emit, and the log-probability it loses;
4. localisation: each photo in a 2 x 2 mosaic with three other validation photos (seeded, recorded), its
   reference forced over the mosaic: the share of each word's attention on its own quadrant (chance a
   quarter) and the pointing game (its peak cell lies mostly in that quadrant; chance: the share of such
   cells, 18.4 % on 7 x 7, where the middle row and column lie half in two quadrants).

Each figure is given for content words, function words and punctuation apart (``attnkit.comparison``'s
closed-class list). Writes ``table.md`` (one row per candidate) and ``results.json`` into ``--out``.
Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from attnkit.importance import CHOSEN, IMPORTANCE_LABELS, add_importance_arguments, settings_from_arguments
from attnkit.captioning import Captioner, train_captioning
from attnkit.checkpoint import load_checkpoint
from attnkit.cli import check_output_folder, positive_int, positive_number
from attnkit.comparison import caption_attention_study
from attnkit.config import load_config
from attnkit.data.captions import image_root, read_caption_split, write_caption_dataset
from attnkit.data.images import MOSAIC_PHOTOS
from attnkit.errors import UserError, run_cli
from attnkit.files import write_json_atomic, write_text_atomic
from attnkit.model import count_parameters
from attnkit.run_folder import CHECKPOINTS
from attnkit.train import TrainingProgress
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_scripts import prepare_flickr8k  # noqa: E402  (the project root is not on sys.path for bench/ scripts)

# name -> overrides of tasks/configs/flickr8k.yaml (issue 19: what could make the cells local enough to attend to), on
# the EfficientNet-Lite0 7 x 7 grid they were measured on (the recipe's backbone until issue 46 moved it to Lite2)
LITE0 = ["image_encoder.backbone=efficientnet_lite0", "image_encoder.image_size=224", "image_encoder.grid_size=7"]
CANDIDATES = {
    "recipe 7x7 (last 2 blocks fine-tuned)": LITE0,
    "14x14 (448 px)": [*LITE0, "image_encoder.image_size=448", "image_encoder.grid_size=14"],
    "14x14 (cut at stride 16)": [*LITE0, "image_encoder.blocks=12", "image_encoder.grid_size=14"],  # EfficientNet-Lite0's 112-channel stage
    "7x7 + 2 self-attention layers": [*LITE0, "image_encoder.self_attention_layers=2", "image_encoder.feedforward_size=1024"],
    "7x7, frozen backbone": [*LITE0, "image_encoder.trainable_blocks=0", "image_encoder.backbone_lr=0"],  # the recipe until issue 31
    "7x7, penalty 0": [*LITE0, "train.attention_regularization=0"],
    "7x7, penalty 1": [*LITE0, "train.attention_regularization=1"],
}
QUICK = {"train": 40, "valid": 8}  # photos per split in --quick mode
QUICK_MODEL = ["decoder.embedding_size=16", "decoder.hidden_size=32", "decoder.attention_size=16", "image_encoder.memory_size=32", "train.batch_size=16"]
GROUPS = ("content", "function")  # the table's columns; punctuation is in the JSON
OUTPUTS = ("table.md", "results.json")  # what the benchmark writes in --out, beside the candidates' run folders
OWNER = ".image-memory-candidate"  # in each run folder the benchmark trains: the run there is its own, to replace on a rerun


def parse_named(text: str, what: str) -> tuple[str, str]:
    """'NAME: REST' -> (NAME, REST), or a clear message."""
    name, colon, rest = text.partition(":")
    if not colon or not name.strip():
        raise UserError(f"{what} {text!r} must look like 'NAME: ...'")
    return name.strip(), rest.strip()


def parse_all(texts: list[str], what: str) -> dict[str, str]:
    """Every 'NAME: REST' of an option by name; a name given twice is refused (a dict would keep only the last)."""
    found: dict[str, str] = {}
    for text in texts:
        name, rest = parse_named(text, what)
        if name in found:
            raise UserError(f"{what} '{name}' is given twice: give each candidate a name of its own")
        found[name] = rest
    return found


def run_folders(names: list[str], out: Path) -> dict[str, Path]:
    """Each trained candidate's run folder, directly in ``out``: its name with runs of other characters than
    letters, digits, '.' and '-' as '_' ("7x7, penalty 0" -> 7x7_penalty_0). A name that would leave ``out``
    ('..'), be one of its files, or share a folder with another candidate is refused."""
    folders: dict[str, Path] = {}
    taken: dict[str, str] = {}
    for name in names:
        folder = re.sub(r"[^A-Za-z0-9.-]+", "_", name)  # no '/' is left: never below another folder
        if not re.search(r"[A-Za-z0-9]", folder):  # '.' is --out itself, '..' the folder above it
            raise UserError(f"--candidate '{name}': the name must hold a letter or a digit (it names the candidate's run folder in --out)")
        if folder.lower() in OUTPUTS:
            raise UserError(f"--candidate '{name}': its run folder would be --out's {folder}; choose another name")
        other = taken.setdefault(folder.lower(), name)  # lower case: one folder on a case-insensitive file system
        if other != name:
            raise UserError(f"--candidate '{other}' and '{name}' would train into one folder ({out / folder}): give names that differ in letters or digits")
        folders[name] = out / folder
    return folders


def check_ours(folders: dict[str, Path]) -> None:
    """Before any training: a candidate's folder holds no run, or one this benchmark trained (its OWNER file),
    which training replaces; a run of anyone else there is never overwritten."""
    for name, folder in folders.items():
        if any((folder / checkpoint).exists() for checkpoint in CHECKPOINTS) and not (folder / OWNER).is_file():
            raise UserError(f"--candidate '{name}': {folder} holds a run this benchmark did not train (no {OWNER} in it); move it away or give another --out")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/flickr8k.yaml"))
    parser.add_argument("--candidate", action="append", default=[], metavar="'NAME: KEY=VALUE ...'", help="a candidate to train (default: CANDIDATES)")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="'NAME: PATH'", help="a captioner trained elsewhere, measured as it is")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override of every trained candidate")
    parser.add_argument("--epochs", type=positive_int, default=10, help="epochs of each candidate (the same for all)")
    parser.add_argument("--minutes", type=positive_number, default=60.0, help="safety cap on each candidate's training time")
    parser.add_argument("--photos", type=positive_int, default=None, help="measure on the first N validation photos (default all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mosaics and of the random cells erased")
    parser.add_argument("--evaluate-only", action="store_true", help="measure the candidates an earlier run left in --out (no training)")
    parser.add_argument("--out", default="", help="run folder (default runs/bench-image-memory, or runs/bench-image-memory-quick)")
    parser.add_argument("--data", default="", help="data root holding flickr8k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--quick", action="store_true", help=f"tiny models on {QUICK['train']} training photos, {QUICK['valid']} validation photos")
    add_importance_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    settings = settings_from_arguments(args)  # a bad importance setting: one message before any work
    trained = {name: rest.split() for name, rest in parse_all(args.candidate, "--candidate").items()} if args.candidate else ({} if args.checkpoint else dict(CANDIDATES))
    given = {name: Path(path) for name, path in parse_all(args.checkpoint, "--checkpoint").items()}
    for name, path in given.items():
        if not path.is_file():
            raise UserError(f"--checkpoint {name}: no checkpoint at {path}")
    if set(trained) & set(given):
        raise UserError(f"candidate names must differ: {', '.join(sorted(set(trained) & set(given)))} is both trained and given")
    mode = "quick" if args.quick else "full"
    out = Path(args.out or ROOT / "runs" / f"bench-image-memory{'-quick' if args.quick else ''}")
    check_output_folder(out, "--out", files=OUTPUTS)
    folders = run_folders(list(trained), out)
    if args.evaluate_only:
        for name, folder in folders.items():
            if not (folder / "best.pt").is_file():
                raise UserError(f"--evaluate-only: candidate '{name}' has no model in {folder} (train it first, or give its --out)")
    else:
        check_ours(folders)
        for name, path in given.items():
            trained_there = [candidate for candidate, folder in folders.items() if path.resolve().parent == folder.resolve()]
            if trained_there:
                raise UserError(f"--checkpoint {name}: {path} is in the run folder that candidate '{trained_there[0]}' trains into (it would be replaced before it is measured)")
    dataset = ROOT / "data" / "flickr8k"
    results = {}
    with tempfile.TemporaryDirectory(prefix="attnkit-image-memory-") as scratch:
        data = Path(scratch) / "data" if args.quick else dataset
        epochs, minutes = (2, 1.0) if args.quick else (args.epochs, args.minutes)
        configs = {  # every candidate's config, checked before any data is prepared or any candidate trained
            name: load_config(args.config, [f"output_dir={folders[name]}", f"data.path={data}", f"train.epochs={epochs}", f"train.max_minutes={minutes}",
                                            *(QUICK_MODEL if args.quick else []), *overrides, *args.overrides])
            for name, overrides in trained.items()
        }  # fmt: skip
        recipe = load_config(args.config, args.overrides)
        cache = recipe.data.feature_cache or None  # grid features of the frozen backbones
        busy_before = busy_cores()
        if not (dataset / "dataset.json").is_file():
            prepare_flickr8k.main(["--out", str(dataset)] + (["--data", args.data] if args.data else []))
        if args.quick:
            splits = {split: read_caption_split(dataset, split)[:count] for split, count in QUICK.items()}
            write_caption_dataset(data, splits, image_root(dataset), info={"name": "flickr8k-quick", "subset_of": str(dataset)})
        valid = read_caption_split(data, "valid")[: args.photos]
        if len(valid) < MOSAIC_PHOTOS:
            raise UserError(f"{len(valid)} validation photo(s): the mosaics need at least {MOSAIC_PHOTOS}")
        for name, overrides in trained.items():
            if args.evaluate_only:
                progress = TrainingProgress(**load_checkpoint(folders[name] / "last.pt").training["progress"])
            else:
                print(f"image memory ({mode}): training '{name}' ({' '.join(overrides) or 'the recipe'}) into {folders[name]} (a previous run of it there is replaced)")
                folders[name].mkdir(parents=True, exist_ok=True)
                write_text_atomic(folders[name] / OWNER, f"{name}\n")  # before training: a run left half-done is still known as ours
                progress = train_captioning(configs[name], overwrite=True, progress_bar=not args.no_progress)
            results[name] = {"overrides": overrides, "training": training_summary(progress)}
        for name, path in given.items():
            run_end = path.parent / "last.pt"  # the whole run's time and epochs, where the run folder is there
            progress = load_checkpoint(run_end if run_end.is_file() else path).training["progress"]
            results[name] = {"checkpoint": str(path), "training": training_summary(TrainingProgress(**progress))}
        for name in results:
            checkpoint = folders[name] / "best.pt" if name in folders else given[name]
            captioner = Captioner.from_checkpoint(checkpoint, cache_dir=cache)
            # Every candidate decodes with its config's search settings (the recipe's unless it overrides them), a
            # checkpoint from elsewhere with the recipe's: not the ones saved with it, which may predate the recipe's.
            captioner.search = configs[name].search if name in configs else recipe.search
            began = time.perf_counter()
            scores = captioner.evaluate(valid, image_root(data), beam_size=5, batch_size=64, meteor=False)
            study = caption_attention_study(captioner, [(image_root(data) / item.image, item.captions[0]) for item in valid], seed=args.seed, importance=settings)
            results[name].update(
                grid=study.pop("grid"),
                parameters=count_parameters(captioner.model),
                valid_beam5={key: scores[key] for key in ("bleu4", "cider_d", "images")},
                study=study,
                measure_seconds=round(time.perf_counter() - began, 1),
            )
            print(describe(name, results[name]))
    out.mkdir(parents=True, exist_ok=True)
    table = write_text_atomic(out / "table.md", markdown_table(results, len(valid)))
    write_json_atomic(out / "results.json", results, indent=2)
    print(table.read_text())
    result = {
        "benchmark": "image_memory",
        "mode": mode,
        "valid_photos": len(valid),
        "seed": args.seed,
        "candidates": {name: headline(found) for name, found in results.items()},
        "outputs": {"table": str(table), "results": str(out / "results.json")},
        "config": project_path(args.config),
        "overrides": args.overrides,
        "evaluate_only": args.evaluate_only,
        "run_dir": str(out),
    }
    return print_result(result, busy_before)


def training_summary(progress: TrainingProgress) -> dict:
    return {"minutes": round(progress.seconds / 60, 2), "epochs": progress.epoch, "valid_best_cider_d": round(progress.best_score, 2), "stop_reason": progress.stop_reason or "all epochs"}


def headline(found: dict) -> dict:
    """The table's figures of one candidate (content words), for the JSON line."""
    study = found["study"]
    content_erasure, content_mosaic = study["erasure"]["by_group"].get("content", {}), study["mosaic"]["by_group"].get("content", {})
    return {
        "valid_bleu4": found["valid_beam5"]["bleu4"],
        "valid_cider_d": found["valid_beam5"]["cider_d"],
        "train_minutes": found["training"]["minutes"],
        "content_effective_cells": study["attention_by_group"].get("content", {}).get("effective_positions"),
        "content_peak_flip": content_erasure.get("peak_flip"),
        "content_random_flip": content_erasure.get("random_flip"),
        "content_mosaic_mass": content_mosaic.get("mass"),
        "content_mosaic_pointing": content_mosaic.get("pointing"),
        "content_mosaic_reading_mass": study["mosaic"].get("reading", {}).get("by_group", {}).get("content", {}).get("mass"),
        **{f"content_agreement_{form}": content_rank_correlation(study, "agreement", form) for form in study.get("agreement", {})},
        **{f"content_norm_weighted_agreement_{form}": content_rank_correlation(study, "norm_weighted_agreement", form) for form in study.get("norm_weighted_agreement", {})},
    }


def content_rank_correlation(study: dict, section: str, form: str) -> float | None:
    """The content words' rank correlation of an attention view with the importance estimator ``form``."""
    return study[section][form].get("by_group", {}).get("content", {}).get("rank_correlation")


def estimator_label(form: str) -> str:
    """``form``'s name in the table and the lines, ``(chosen)`` on the image estimator chosen on scenes."""
    return IMPORTANCE_LABELS[form] + (" (chosen)" if form == CHOSEN["image"] else "")


def describe(name: str, found: dict) -> str:
    figures = headline(found)
    agreements = ", ".join(f"{estimator_label(form)} {figures[f'content_agreement_{form}']}" for form in found["study"].get("agreement", {}))
    viewed = found["study"].get("norm_weighted_agreement", {})
    if viewed:
        agreements += "; the norm-weighted view's with " + ", ".join(f"{estimator_label(form)} {figures[f'content_norm_weighted_agreement_{form}']}" for form in viewed)
    return (
        f"{name}: valid BLEU-4 {figures['valid_bleu4']}, CIDEr-D {figures['valid_cider_d']} (beam 5); content words: "
        f"{figures['content_effective_cells']} effective cells, peak erased changes the word {percent(figures['content_peak_flip'])} "
        f"(random {percent(figures['content_random_flip'])}), mosaic mass {percent(figures['content_mosaic_mass'])}, "
        f"pointing {percent(figures['content_mosaic_pointing'])} (the step that has read it: mass {percent(figures['content_mosaic_reading_mass'])}); "
        f"rank correlation with {agreements}; measured in {found['measure_seconds']} s"
    )


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def markdown_table(results: dict, photos: int) -> str:
    """One row per candidate: captions, training time, spread, erasure and localisation, content | function words."""
    forms = list(next(iter(results.values()))["study"].get("agreement", {})) if results else []  # one run: the same estimators for all
    header = (
        "| candidate | grid | train min (epochs) | valid BLEU-4 | valid CIDEr-D | effective cells | peak erased: word changes | random cell: word changes "
        "| log p lost (peak) | mosaic: mass on own quadrant | mosaic: pointing | mosaic, reading step: mass "
        + "".join(f"| rank corr. with {estimator_label(form)} (shuffled) " for form in forms) + "|"
    )
    lines = [
        f"Flickr8k validation, {photos} photos; each pair: content / function words; mosaic chance: a quarter of the mass, and for the pointing"
        " the share of cells mostly inside a quadrant (7 x 7: 18.4 %, 9 x 9: 19.8 %); agreement: content words.", "", header,
        "|" + "---|" * (12 + len(forms)),
    ]
    for name, found in results.items():
        study = found["study"]

        def both(section: dict, key: str, scale: float = 1.0, digits: int = 1) -> str:
            return " / ".join(f"{scale * section[g][key]:.{digits}f}" if g in section else "n/a" for g in GROUPS)

        def agreed(form: str) -> str:
            content = study.get("agreement", {}).get(form, {}).get("by_group", {}).get("content")
            return "n/a" if content is None else f"{content['rank_correlation']:.3f} ({content['shuffled_rank_correlation']:.3f})"

        erasure, mosaic, spread = study["erasure"]["by_group"], study["mosaic"]["by_group"], study["attention_by_group"]
        training = found["training"]
        lines.append(
            f"| {name} | {found['grid'][0]}x{found['grid'][1]} | {training['minutes']} ({training['epochs']}) | {found['valid_beam5']['bleu4']} "
            f"| {found['valid_beam5']['cider_d']} | {both(spread, 'effective_positions')} | {both(erasure, 'peak_flip', 100)} % "
            f"| {both(erasure, 'random_flip', 100)} % | {both(erasure, 'peak_drop', 1, 3)} | {both(mosaic, 'mass', 100)} % | {both(mosaic, 'pointing', 100)} % "
            f"| {both(study['mosaic'].get('reading', {}).get('by_group', {}), 'mass', 100)} % | " + "".join(f"{agreed(form)} | " for form in forms).rstrip()
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(run_cli(main))
