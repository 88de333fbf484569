"""The real cross-modal study: one decoder's attention over Flickr8k photos and over German sentences.

Run from the project root::

    python bench/real_attention.py                  # full: trains tasks/configs/flickr8k_multi30k_transformer.yaml, then the study
    python bench/real_attention.py --evaluate-only  # the study again on the joint model an earlier run left in --out
    python bench/real_attention.py --quick          # a tiny model on a slice of the data, 6 study photos (a smoke check)
    python bench/real_attention.py --scst-epochs 5  # the joint model, then five epochs of self-critical training; that is studied
    python bench/real_attention.py --scst-epochs 5 --resume  # the same, continuing stages an earlier run left in --out
    python bench/real_attention.py --evaluate-only --captioner runs/bench-flickr8k/attention/best.pt \\
        --translator runs/bench-multi30k/best.pt    # also study (and score) two single-task models

1. Data: prepares ``data/flickr8k`` and ``data/multi30k-de-en-study`` when missing (the second also when it
   was prepared with other exclusions); the second leaves the study photos' Multi30k pairs out of the
   translation training and validation data (``prepare_multi30k.py --exclude-photos``), so neither side of
   the joint model sees a study photo or its sentence in training, and the caption validation photos' pairs
   too, whose English is one of their validation captions word for word.
2. Study photos: the Flickr8k *test* photos that Multi30k also describes (458 in the shared data),
   each with its Multi30k German sentence and English sentence.
3. Trains the joint model (one decoder, target embeddings and output layer for the EfficientNet-Lite0
   captioner and the German -> English translator), unless ``--evaluate-only``. With ``--scst-epochs N``
   it then trains N epochs of self-critical training from the joint model's best.pt into ``joint-scst``
   (its caption batches self-critical, its translation batches still cross-entropy; the captioning
   bench's SCST settings, :data:`JOINT_SCST`, and ``--scst-set`` on top), and that stage is what the
   rest scores and studies.
4. Quality on the usual tests at beam 5: Flickr8k test BLEU-4 / CIDEr-D (all 5 references; the
   captioning recipe's search settings) and Multi30k test_2016_flickr BLEU (the translation
   recipe's); the same for ``--captioner`` / ``--translator`` when given.
5. The study: each photo's English sentence is forced through the image side and through the German
   side of the joint model (and of the single-task pair when given). Per modality: entropy, normalised
   entropy, peak weight, effective positions and coverage of each word's attention (the step that
   emits it), erasure (the log-probability a word loses when its attention peak, a random
   position or the lowest-weight position is removed; how often the word changes), and the
   attention's agreement with the word's importance maps (what its log-probability loses when cells
   or source words are hidden, by the estimators ``--importance`` names, hidden where ``--hide-at``
   says; by default those chosen on scenes, ``attnkit.importance.CHOSEN``, beside importance through
   attention: rank correlation, peak match, mass on the most important positions, each against
   shuffled attention; per layer and head for content words), split into content words, function
   words (a closed-class list) and punctuation. Words outside the model's vocabulary are left out
   and counted.
6. Localisation on mosaics (no annotations needed): each study photo with three other study photos
   in a 2 x 2 mosaic, and their four German sentences joined as one source, in the same order (the
   other three and the order drawn from ``--seed``; ``mosaic.arrangements`` records them). The
   photo's English sentence is forced through both sides; per modality and word group, the share of
   each word's attention on its own photo's quadrant / its own sentence (``mass``; chance is about a
   quarter) and how often its peak lies there (``pointing``); per layer and head for content words.
7. Writes ``study.json``, ``erasure.png`` (peak against random removal, per modality) and the
   comparison of one photo (``example/``: PNG, HTML report, statistics) into ``--out``.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.captioning import Captioner
from attnkit.checkpoint import load_checkpoint
from attnkit.analysis import Erasure
from attnkit.comparison import (
    AttentionComparer,
    StudyInput,
    add_erasure_by_group,
    agreement_by_group,
    attention_by_group,
    comparison_word_groups,
    erasure_groups,
    mosaic_study,
    summarise_erasure_by_group,
)
from attnkit.cli import non_negative_int, positive_int
from attnkit.config import ExperimentConfig, load_config
from attnkit.data.captions import CaptionedImage, image_root, read_caption_split, write_caption_dataset
from attnkit.data.images import MOSAIC_PHOTOS, open_rgb
from attnkit.data.multi30k import IMAGE_SPLITS_DIR, SPLITS, photo_id, read_split_with_photos
from attnkit.data.sources import default_data_root
from attnkit.data.folder import read_dataset_info
from attnkit.data.text import read_parallel, write_parallel_dataset
from attnkit.errors import UserError, run_cli
from attnkit.files import atomic_path, read_text_file, write_json_atomic, write_text_atomic
from attnkit.importance import CHOSEN, ImportanceSettings, add_importance_arguments, settings_from_arguments
from attnkit.model import count_parameters
from attnkit.multitask import train_multitask
from attnkit.report import write_comparison
from attnkit.train import TrainingProgress
from attnkit.translation import Translator
from attnkit.viz import plot_distributions
from flickr8k import QUICK_DATA, SCST, ran_to_its_end, trains
from machine import busy_cores, print_result, project_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_scripts import prepare_flickr8k, prepare_multi30k  # noqa: E402  (the project root is not on sys.path for bench/ scripts)

FLICKR8K_TEST_LIST = Path("flickr8k") / "Flickr_8k.testImages.txt"
# The photos whose Multi30k pairs the joint model's translation side must not train on: the study (test) photos, and
# the caption validation photos, whose own references are word for word Multi30k training targets (391 of 433).
STUDY_EXCLUSIONS = (FLICKR8K_TEST_LIST, Path("flickr8k") / "Flickr_8k.devImages.txt")
# The joint model's SCST stage: the captioner's settings (bench/flickr8k.py; its batches of 32 then hold 32 sentences
# too), with a short warm-up of its own in place of the joint recipe's 1,000 steps, which would hold the rate low for a fifth of
# a five-epoch stage. Not chosen on validation. An epoch is both tasks' batches (caption_share of them caption, one
# photo an example), so each photo comes round about twice an epoch, where the captioner's SCST sees it once.
JOINT_SCST = [*SCST, "train.warmup_steps=100"]
QUICK = {"train": 24, "valid": 6, "pairs": 300, "photos": 6}
QUICK_MODEL = [  # a tiny model: the steps run end to end in seconds
    "text_encoder.embedding_size=16", "text_encoder.hidden_size=16", "image_encoder.memory_size=32",
    "decoder.embedding_size=32", "decoder.hidden_size=32", "train.epochs=2", "train.max_minutes=0", "train.batch_size=16",
]  # fmt: skip


@dataclass(frozen=True)
class StudyPhoto:
    image: str  # Flickr8k file name
    german: str
    english: str
    multi30k_split: str  # where Multi30k has the photo: train, val or test_2016_flickr


def study_photos(data_root: Path) -> list[StudyPhoto]:
    """The Flickr8k test photos present in the shared images folder that Multi30k describes, in the test list's order."""
    images = data_root / "flickr8k" / "images"
    listed = flickr8k_test_list(data_root)
    sentences = {}
    for stem in SPLITS.values():
        for photo, (german, english) in read_split_with_photos(data_root, stem, ("de", "en")):
            sentences.setdefault(photo, (german, english, stem))
    return [StudyPhoto(name, *sentences[photo_id(name)]) for name in listed if (images / name).is_file() and photo_id(name) in sentences]


def flickr8k_test_list(data_root: Path) -> list[str]:
    return [line.strip() for line in read_text_file(data_root / FLICKR8K_TEST_LIST).split("\n") if line.strip()]


def study_photo(data_root: Path, photos: list[StudyPhoto], name: str) -> StudyPhoto:
    """One of ``photos`` (all the study photos) by its Flickr8k file name; a clear error for any other photo."""
    found = [photo for photo in photos if photo.image == name]
    if found:
        return found[0]
    if name not in flickr8k_test_list(data_root):
        raise UserError(f"--photo {name} is not a Flickr8k test photo (the study photos are the test photos Multi30k describes)")
    raise UserError(f"--photo {name} has no Multi30k sentences (or is missing from {data_root / 'flickr8k' / 'images'}): it is not a study photo")


def study(
    comparer: AttentionComparer, photos: list[StudyPhoto], images: Path, settings: ImportanceSettings, batch_size: int = 16
) -> tuple[dict, dict[str, dict[str, list[Erasure]]]]:
    """Force every photo's English sentence through both sides: the statistics by word group, the erasure of
    every studied word (modality -> group -> parts), and each word's attention against its importance maps
    (the estimators of ``settings``) by word group and, for content words, by layer and head."""
    comparisons, groups, skipped = [], [], []
    for start in range(0, len(photos), batch_size):
        chunk = photos[start : start + batch_size]
        try:
            found = comparer.compare([images / p.image for p in chunk], [p.german for p in chunk], [p.english for p in chunk], heads=True, importance=settings)
        except UserError:  # one sentence the two models cannot both read: compare one at a time, skip that one
            found = []
            for photo in chunk:
                try:
                    found += comparer.compare([images / photo.image], [photo.german], [photo.english], heads=True, importance=settings)
                except UserError as error:
                    skipped.append({"image": photo.image, "why": str(error)})
                    found.append(None)
        for comparison in found:
            if comparison is not None:
                comparisons.append(comparison)
                groups.append(comparison_word_groups(comparer, comparison))
    if not comparisons:
        raise UserError("no study sentence could be forced through both models")
    erased = erasure_groups()
    for comparison, word_groups in zip(comparisons, groups):
        add_erasure_by_group(erased, comparison, word_groups)
    words = sum(len(g) for g in groups)
    unknown = sum(g is None for word_groups in groups for g in word_groups)
    result = {
        "sentences": len(comparisons),
        "skipped_sentences": skipped,
        "words": words,
        "unknown_words_left_out": unknown,
        "attention": attention_by_group(comparisons, groups),
        "erasure": summarise_erasure_by_group(erased),
        "agreement": agreement_by_group(comparisons, groups, heads=True),
    }
    return result, erased


def describe_study(name: str, result: dict) -> list[str]:
    lines = [f"{name}: {result['sentences']} sentences, {result['words']} words ({result['unknown_words_left_out']} unknown, left out)"]
    for modality in ("image", "text"):
        attention, erasure = result["attention"][modality], result["erasure"][modality]
        lines.append(
            f"  {modality}: normalised entropy {attention['normalised_entropy']}, peak {attention['peak']}, "
            f"effective positions {attention['effective_positions']}, coverage max {attention.get('coverage_max')}"
        )
        for group, erased in erasure["by_group"].items():
            lines.append(
                f"    erasure, {group} ({erased['steps']}): log p lost {erased['peak_drop']} (peak) vs {erased['random_drop']} (random) "
                f"vs {erased['lowest_drop']} (lowest); word changes {100 * erased['peak_flip']:.1f}% / {100 * erased['random_flip']:.1f}%"
            )
    for modality, by_form in result.get("agreement", {}).items():
        for form, found in by_form.items():
            chosen = " (the estimator chosen on scenes for this modality)" if CHOSEN[modality] == form else ""
            groups = ", ".join(
                f"{group} {g['rank_correlation']} (shuffled {g['shuffled_rank_correlation']}), peak {100 * g['peak_match']:.1f}% (shuffled {100 * g['shuffled_peak_match']:.1f}%)"
                for group, g in found["by_group"].items()
            )
            lines.append(f"  {modality} attention against importance {form}{chosen}, rank correlation and peak match: {groups}")
    mosaic = result.get("mosaic")
    if mosaic:
        lines.append(f"  localisation on {mosaic['mosaics']} mosaics (seed {mosaic['seed']}): attention mass on the own input / pointing game")
        for modality in ("image", "text"):
            found = mosaic[modality]
            groups = ", ".join(f"{group} {100 * g['mass']:.1f}% / {100 * g['pointing']:.1f}%" for group, g in found["by_group"].items())
            chance = f"chance {100 * found['chance']:.1f}%" + (f" / {100 * found['pointing_chance']:.1f}%" if "pointing_chance" in found else "")
            lines.append(f"    {modality} ({chance}): {groups}")
            reading = mosaic.get("reading", {}).get(modality)
            if reading:
                groups = ", ".join(f"{group} {100 * g['mass']:.1f}% / {100 * g['pointing']:.1f}%" for group, g in reading["by_group"].items())
                lines.append(f"    {modality}, the step that has read the word: {groups}")
    return lines


def ensure_data(data_root: Path, folder: Path) -> tuple[Path, Path]:
    """``folder``/flickr8k and ``folder``/multi30k-de-en-study, prepared when missing."""
    captions, pairs = folder / "flickr8k-joint", folder / "multi30k-de-en-study"
    if not (captions / "dataset.json").is_file():
        multi30k_photos = [data_root / IMAGE_SPLITS_DIR / f"{SPLITS[split]}.txt" for split in ("valid", "test")]
        prepare_flickr8k.main(["--data", str(data_root), "--out", str(captions), *(f"--exclude-photos={path}" for path in multi30k_photos)])
    if excluded_lists(pairs) != [path.name for path in STUDY_EXCLUSIONS]:  # missing, or prepared before the validation photos went
        exclusions = [argument for path in STUDY_EXCLUSIONS for argument in ("--exclude-photos", str(data_root / path))]
        prepare_multi30k.main(["--source", "de", "--target", "en", "--data", str(data_root), "--out", str(pairs), *exclusions])
    return captions, pairs


def excluded_lists(pairs: Path) -> list[str] | None:
    """The file names of the photo lists a prepared Multi30k folder left out (None when it is not prepared)."""
    if not (pairs / "dataset.json").is_file():
        return None
    excluded = read_dataset_info(pairs).get("excluded_photos") or {}
    return [Path(path).name for path in excluded.get("lists", [excluded["list"]] if "list" in excluded else [])]


def quick_slices(captions: Path, pairs: Path, photos: list[StudyPhoto], into: Path) -> tuple[Path, Path]:
    """A few training photos and pairs; the test split of the captions is the first study photos."""
    caption_splits = {split: read_caption_split(captions, split)[: QUICK[split]] for split in ("train", "valid")}
    by_image = {item.image: item for item in read_caption_split(captions, "test")}
    caption_splits["test"] = [by_image.get(p.image, CaptionedImage(p.image, (p.english,))) for p in photos]
    pair_splits = {split: read_parallel(pairs, split, "de", "en")[: QUICK["pairs"] if split == "train" else QUICK["valid"]] for split in ("train", "valid", "test")}
    return (
        write_caption_dataset(into / "flickr8k", caption_splits, image_root(captions), info={"name": "flickr8k-quick"}),
        write_parallel_dataset(into / "multi30k", ("de", "en"), pair_splits, {"name": "multi30k-de-en-quick"}),
    )


def quality(captioner: Captioner, translator: Translator, captions: Path, pairs: Path, beam: int, search: dict) -> dict:
    """Caption and translation test scores at ``beam``, each task decoded with its single-task recipe's search settings."""
    captioner.search, translator.search = search["captioning"], search["translation"]
    started = time.perf_counter()
    caption = captioner.evaluate(read_caption_split(captions, "test"), image_root(captions), beam_size=beam, batch_size=64, meteor=False)
    translation = translator.evaluate(read_parallel(pairs, "test", "de", "en"), beam_size=beam, batch_size=64)
    return {
        "caption": {name: caption[name] for name in ("bleu4", "bleu4_nltk", "cider_d", "images")},
        "translation": {name: translation[name] for name in ("bleu", "chrf", "sentences", "bleu_signature")},
        "decode_seconds": round(time.perf_counter() - started, 1),
    }


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/flickr8k_multi30k_transformer.yaml"), help="the joint recipe (default: the Transformer decoder, chosen on validation)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override of the joint model")
    parser.add_argument("--data", default="", help="data root holding flickr8k/ and multi30k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--out", default="", help="run folder (default runs/bench-real-attention, or runs/bench-real-attention-quick)")
    parser.add_argument("--evaluate-only", action="store_true", help="skip training: study the joint model an earlier run left in --out")
    parser.add_argument("--resume", action="store_true", help="a stage already in --out with the same config: read it back when it ran to its end, continue it when cut short")
    parser.add_argument("--captioner", default="", help="a single-task captioning checkpoint to score and study too (with --translator)")
    parser.add_argument("--translator", default="", help="a single-task de->en translation checkpoint to score and study too")
    parser.add_argument("--photo", default="", help="the study photo of the example report (a Flickr8k file name; default the first)")
    parser.add_argument("--photos", type=non_negative_int, default=0, help=f"study only the first N photos (default all; at least {MOSAIC_PHOTOS}, a mosaic's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mosaics: which three other photos join each photo, and their order")
    parser.add_argument("--beam", type=positive_int, default=5, help="beam of the quality scores")
    parser.add_argument("--figure", default="", help="also copy the example's comparison.png here (the figure of docs/comparison.md, \"What the study says\")")
    parser.add_argument("--quick", action="store_true", help=f"a tiny model on {QUICK['train']} photos and {QUICK['pairs']} pairs, {QUICK['photos']} study photos")
    parser.add_argument("--scst-epochs", type=non_negative_int, default=0, metavar="N", help="then N epochs of self-critical training from the joint model's best.pt, into joint-scst (0: none)")
    parser.add_argument("--scst-set", dest="scst_overrides", action="append", default=[], metavar="KEY=VALUE", help="config override of the SCST stage only (after JOINT_SCST)")
    add_importance_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    settings = settings_from_arguments(args)  # a bad estimator setting: one message before any work
    if bool(args.captioner) != bool(args.translator):
        raise UserError("give both --captioner and --translator (the single-task pair), or neither")
    if args.scst_overrides and not args.scst_epochs:
        raise UserError("--scst-set configures the SCST stage, which --scst-epochs N (N >= 1) runs; 0 (the default) runs none")
    scst_stage = [*JOINT_SCST, f"train.epochs={args.scst_epochs}", *args.scst_overrides] if args.scst_epochs else []
    if scst_stage:  # the stage's keys and values, checked before any work (its start is known later)
        load_config(args.config, [*args.overrides, *scst_stage, "train.init_from=best.pt"])
    mode = "quick" if args.quick else "full"
    busy_before = busy_cores()
    data_root = Path(args.data) if args.data else default_data_root(ROOT)
    if not (data_root / FLICKR8K_TEST_LIST).is_file():
        raise UserError(f"{data_root} has no {FLICKR8K_TEST_LIST} (give --data ROOT: the folder holding flickr8k/ and multi30k/)")
    every_photo = study_photos(data_root)
    photos = every_photo[: args.photos or QUICK["photos"]] if args.quick or args.photos else every_photo
    if len(photos) < MOSAIC_PHOTOS:
        raise UserError(
            f"{len(photos)} study photo(s): the mosaics need at least {MOSAIC_PHOTOS} Flickr8k test photos with Multi30k sentences "
            f"(--photos, or the photos in {data_root / 'flickr8k' / 'images'})"
        )
    example = study_photo(data_root, every_photo, args.photo) if args.photo else photos[0]
    out = Path(args.out or ROOT / "runs" / f"bench-real-attention{'-quick' if args.quick else ''}")
    stage = out / ("joint-scst" if scst_stage else "joint")  # the run folder of the model scored and studied
    checkpoint = stage / "best.pt"
    if args.evaluate_only and not checkpoint.is_file():
        raise UserError(f"--evaluate-only: no joint model in {stage} (train first, or give its --out)")
    print(f"study photos: {len(photos)} Flickr8k test photos with Multi30k sentences")

    # --quick leaves the project's data/ alone: what it prepares goes to the run folder, the same files each time
    # (so the runs' data paths, part of their config, stay the same and --resume finds them)
    quick_data = out / QUICK_DATA
    captions, pairs = ensure_data(data_root, quick_data if args.quick else ROOT / "data")
    if args.quick:
        captions, pairs = quick_slices(captions, pairs, photos, quick_data)
    overrides = [f"output_dir={out / 'joint'}", f"data.path={captions}", f"data.text_path={pairs}"]
    if args.quick:
        overrides += [f"data.feature_cache={quick_data / 'cache'}", *QUICK_MODEL]
    config = load_config(args.config, [*overrides, *args.overrides])  # the user's --set last: they win
    training = trained_stage(config, "training the joint model", args, resume=args.resume)
    if scst_stage:
        scst_config = load_config(args.config, [*overrides, *args.overrides, *scst_stage, f"output_dir={stage}", f"train.init_from={out / 'joint' / 'best.pt'}"])
        # An SCST stage is kept only when the best.pt it started from is the one there now (the first stage read back).
        kept_start = args.resume and training["origin"] == "read back"
        training["scst"] = trained_stage(scst_config, "self-critical training of the joint model", args, resume=kept_start)
    cache = config.data.feature_cache or None
    setups = {"joint": (Captioner.from_checkpoint(checkpoint, cache_dir=cache), Translator.from_checkpoint(checkpoint))}
    if args.captioner:
        setups["single_task"] = (Captioner.from_checkpoint(args.captioner, cache_dir=cache), Translator.from_checkpoint(args.translator))
    search = {
        "captioning": load_config(ROOT / "tasks/configs/flickr8k.yaml", []).search,
        "translation": load_config(ROOT / "tasks/configs/multi30k_de_en.yaml", []).search,
    }
    results = {}
    images = data_root / "flickr8k" / "images"
    for name, (captioner, translator) in setups.items():
        scores = quality(captioner, translator, captions, pairs, args.beam, search)
        print(f"{name}: Flickr8k test BLEU-4 {scores['caption']['bleu4']} (CIDEr-D {scores['caption']['cider_d']}), "
              f"Multi30k test_2016_flickr BLEU {scores['translation']['bleu']} at beam {args.beam}")  # fmt: skip
        began = time.perf_counter()
        comparer = AttentionComparer(captioner, translator)
        found, erased = study(comparer, photos, images, settings)
        inputs = [StudyInput(images / photo.image, photo.german, photo.english) for photo in photos]
        found["mosaic"] = mosaic_study(comparer, inputs, seed=args.seed, heads=True)
        found["study_seconds"] = round(time.perf_counter() - began, 1)
        print("\n".join(describe_study(name, found)))
        results[name] = {"quality": scores, "study": found, "parameters": count_parameters(captioner.model)}
        if name == "joint":
            erasure_figure = plot_erasure(erased, out / "erasure.png", found["sentences"])
            joint = comparer

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "study.json", results, indent=2)
    written = write_comparison(joint, open_rgb(images / example.image), example.german, example.english, out / "example", title=f"{example.image}: {example.english}", importance=settings)
    if args.figure:
        write_figure(written[0][0], Path(args.figure))
    result = {
        "benchmark": "real_attention",
        "mode": mode,
        "study_photos": len(photos),
        "example_photo": example.image,
        "results": results,
        "training": training,
        "outputs": {"study": str(out / "study.json"), "erasure_figure": str(erasure_figure), "example": str(out / "example")},
        "importance": {**dataclasses.asdict(settings), "chosen": CHOSEN},
        "config": project_path(args.config),
        "overrides": args.overrides,
        "scst_overrides": scst_stage,
        "evaluate_only": args.evaluate_only,
        "run_dir": str(out),
    }
    return print_result(result, busy_before)


def trained_stage(config: ExperimentConfig, what: str, args: argparse.Namespace, resume: bool) -> dict:
    """Train ``config``'s joint model into its run folder (replacing a run there), or with ``--evaluate-only`` read
    the one there; with ``resume``, a run there of the same config is read back when it ran to its end and
    continued from its last.pt when it was cut short. Returns how long it trained, how it stopped and where it came
    from (``origin``)."""
    folder = config.run_dir
    standing = trains(folder, config) if resume and not args.evaluate_only else None  # reads last.pt: only when it may train
    if args.evaluate_only:
        origin, progress = "read back", TrainingProgress(**load_checkpoint(folder / "last.pt").training["progress"])
    elif standing is not None and ran_to_its_end(folder, standing, config):
        print(f"{what}: reading back the run in {folder} (the same config, trained to its end)")
        origin, progress = "read back", standing
    elif standing is not None:
        print(f"{what}: continuing the run in {folder} from epoch {standing.epoch}")
        origin, progress = "continued", train_multitask(config, resume=load_checkpoint(folder / "last.pt", task="multitask"), progress_bar=not args.no_progress)
    else:
        kept = "" if resume else "; --resume continues one of the same config"
        print(f"{what} into {folder} (a previous run there is replaced{kept})")
        origin, progress = "trained", train_multitask(config, overwrite=True, progress_bar=not args.no_progress)
    return {"train_minutes": round(progress.seconds / 60, 2), "epochs": progress.epoch, "stop_reason": progress.stop_reason or "all epochs", "origin": origin}


def plot_erasure(erased: dict[str, dict[str, list[Erasure]]], path: Path, sentences: int) -> Path:
    """Per modality, the log p(word) a content word loses with its attention peak removed, against a random position."""
    drops = {
        f"{modality}: log p(content word) lost": {
            f"{removed} removed": torch.cat([getattr(part, f"{removed}_drop") for part in erased[modality]["content"]]).nan_to_num(0.0).tolist()
            for removed in ("peak", "random")
        }
        for modality in ("image", "text")
    }
    highest = max((max(v, default=0.0) for panel in drops.values() for v in panel.values()), default=1.0)
    return plot_distributions(drops, path, title=f"erasure on {sentences} study photos: the attention peak against a random position", value_range=(-0.5, max(1.0, highest)))


def write_figure(png: Path, target: Path) -> None:
    """Copy the example's PNG to ``target``, whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as temporary:
        temporary.write_bytes(png.read_bytes())


if __name__ == "__main__":
    sys.exit(run_cli(main))
