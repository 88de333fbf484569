"""Does masked-LM pre-training of the Transformer text encoder earn its place? Multi30k de->en at equal total time.

Run from the project root::

    python bench/pretrain.py                          # both data sizes, seeds 1 and 2, --minutes per arm, one arm after another
    python bench/pretrain.py --data slice --minutes 20  # the low-resource slice only
    python bench/pretrain.py --quick                  # every step on a little data and a small model, a few minutes (smoke check)
    python bench/pretrain.py --arm pretrained --data full --seed 1 --no-summary   # one arm (bench/pretrain_on_device.sh runs eight at once)
    python bench/pretrain.py --prepare                # only the data folders (before several arms start at once)
    python bench/pretrain.py --summarise              # the table, the JSON and the head figure from the arms already in --out

For each data size (``full``: the 29,000 training pairs; ``slice``: the first ``--slice`` pairs, with the other
training pairs' German sentences as monolingual text that only pre-training reads, and 3,000 subword pieces per side
instead of the recipe's 6,000, which 5,000 sentences cannot give) and each seed, two arms of ``--minutes`` each,
pre-training included:

* ``scratch``: the recipe (``tasks/configs/multi30k_de_en_transformer.yaml``) with ``train.max_minutes`` = M;
* ``pretrained``: ``task: pretrain`` (BERT's masked LM, :mod:`attnkit.pretraining`) on the German side for
  ``--pretrain-share`` x M minutes, then the recipe from the pre-trained encoder (``text_encoder.init_from``)
  for what is left of M after the minutes pre-training took.

Both arms test their best.pt (the same rule for both: no checkpoint averaging) on test_2016_flickr with beam 5,
cased sacreBLEU. Targets (issue 34): a gain of >= 0.5 BLEU (mean of the seeds) on the full data, or >= 2 BLEU on
the slice. The per-layer, per-head statistics of the first seed's full-data encoders (pre-trained, fine-tuned,
from scratch) on 500 validation sentences go to ``heads.json`` and ``heads.png`` (``--figure`` copies it).
Each arm writes ``results/DATA-ARM-seedS.json`` as it ends; the summary reads them. Human-readable lines first;
the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from statistics import mean

from attnkit.config import load_config
from attnkit.data.text import read_parallel, write_parallel_dataset
from attnkit.errors import UserError, run_cli
from attnkit.files import write_json_atomic, write_text_atomic
from attnkit.pretraining import encoder_head_statistics, pretrained_from_checkpoint, train_pretraining
from attnkit.translation import TextPipeline, Translator, train_translation
from machine import busy_cores, print_result
from multi30k import QUICK, SOURCE, TARGET, ensure_dataset, quick_subset

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tasks/configs/multi30k_de_en_transformer.yaml"
DATA = ("full", "slice")
ARMS = ("scratch", "pretrained")
TARGET_GAIN = {"full": 0.5, "slice": 2.0}  # BLEU, mean of the seeds
# --quick: a small model on little data, so that every step runs in seconds on a CPU
QUICK_MODEL = [
    "data.tokenizer.vocab_size=1000", "text_encoder.hidden_size=64", "text_encoder.embedding_size=64", "text_encoder.num_layers=2",
    "text_encoder.feedforward_size=128", "decoder.hidden_size=64", "decoder.embedding_size=64", "decoder.num_layers=1",
    "decoder.feedforward_size=128", "train.warmup_steps=50", "train.precision=fp32",
]  # fmt: skip
HEAD_SENTENCES = 500
SLICE_SETTINGS = ["data.tokenizer.vocab_size=3000"]  # 6,000 pieces per side cannot be learnt from 5,000 sentences (sentencepiece allows at most ~5,000)
SHOWN = ("normalised_entropy", "previous", "next", "self", "punctuation")  # the figure's columns: each in [0, 1]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override of every run's config")
    parser.add_argument("--minutes", type=float, default=60.0, help="each arm's total training time, pre-training included")
    parser.add_argument("--pretrain-share", type=float, default=0.25, help="the share of an arm's minutes that pre-training gets")
    parser.add_argument("--frozen-steps", type=int, default=0, help="text_encoder.frozen_steps of the fine-tuning")
    parser.add_argument("--slice", type=int, default=5000, help="training pairs of the low-resource slice")
    parser.add_argument("--data", choices=DATA, action="append", help="data size(s) to run (default both)")
    parser.add_argument("--arm", choices=ARMS, action="append", help="arm(s) to run (default both)")
    parser.add_argument("--seed", type=int, action="append", help="seed(s) (default 1 and 2)")
    parser.add_argument("--out", default="", help="folder of the runs and results (default runs/bench-pretrain[-quick])")
    parser.add_argument("--data-root", default="", help="data root holding multi30k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--figure", default="", help="also copy the head figure here (e.g. docs/bert-heads.png)")
    parser.add_argument("--prepare", action="store_true", help="write the data folders into --out and stop (before arms run at once)")
    parser.add_argument("--summarise", action="store_true", help="train nothing: summarise the arms already in --out")
    parser.add_argument("--no-summary", action="store_true", help="run the arms only (another process summarises)")
    parser.add_argument("--quick", action="store_true", help="8,000 pairs, a 2,000-pair slice, a small model, 0.6 minutes per arm")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def datasets(args: argparse.Namespace, out: Path) -> dict[str, tuple[Path, Path | None]]:
    """Data size -> (dataset folder, monolingual text for pre-training or None)."""
    full = ROOT / "data" / f"multi30k-{SOURCE}-{TARGET}"
    ensure_dataset(full, args.data_root)
    if args.quick:
        full = quick_subset(full, out / "data-quick") if not (out / "data-quick" / "dataset.json").is_file() else out / "data-quick"
    sliced = out / f"data-slice-{args.slice}"
    if not (sliced / "dataset.json").is_file():
        pairs = read_parallel(full, "train", SOURCE, TARGET)
        if args.slice >= len(pairs):
            raise UserError(f"--slice {args.slice}: the training split has only {len(pairs)} pairs")
        splits = {"train": pairs[: args.slice], **{split: read_parallel(full, split, SOURCE, TARGET) for split in ("valid", "test")}}
        write_parallel_dataset(sliced, (SOURCE, TARGET), splits, {"name": f"multi30k-{SOURCE}-{TARGET}-slice-{args.slice}", "subset_of": str(full)})
        write_text_atomic(sliced / f"monolingual.{SOURCE}", "".join(source + "\n" for source, _ in pairs[args.slice :]))
    return {"full": (full, None), "slice": (sliced, sliced / f"monolingual.{SOURCE}")}


def run_arm(args: argparse.Namespace, out: Path, data: str, folder: Path, monolingual: Path | None, arm: str, seed: int) -> dict:
    """Train one arm within its minutes, test its best.pt; its result is also written to results/."""
    name = f"{data}-{arm}-seed{seed}"
    sized = SLICE_SETTINGS if data == "slice" and not args.quick else []
    # the arms are cut by time, so the recipe's schedule as it was measured here: plateaus, no decay at fixed epochs
    # (the recipe has decayed its last 5 of 21 since 2026-12-02, which a time budget would cut short)
    schedule = ["train.epochs=60", "train.decay_epochs=0"]
    base = [f"data.path={folder}", f"train.seed={seed}", "train.keep_epochs=0", *schedule, *sized, *(QUICK_MODEL if args.quick else []), *args.overrides]
    minutes = args.minutes
    result: dict = {"data": data, "arm": arm, "seed": seed, "minutes": minutes}
    began = time.perf_counter()
    if arm == "pretrained":
        share = minutes * args.pretrain_share
        more = [f"data.pretrain_text={monolingual}"] if monolingual else []
        config = load_config(args.config, [*base, "task=pretrain", f"output_dir={out / (name + '-mlm')}", f"train.max_minutes={share}", "train.epochs=1000", *more])
        print(f"{name}: pre-training for {share:g} of its {minutes:g} minutes")
        progress = train_pretraining(config, overwrite=True, progress_bar=not args.no_progress)
        spent = progress.seconds / 60
        history = json.loads((out / (name + "-mlm") / "log.jsonl").read_text().splitlines()[-1])
        result["pretraining"] = {"minutes": round(spent, 2), "epochs": progress.epoch, "best_epoch": progress.best_epoch, "valid": history["valid"]}
        base += [f"text_encoder.init_from={out / (name + '-mlm') / 'best.pt'}", f"text_encoder.frozen_steps={args.frozen_steps}"]
        minutes = max(minutes - spent, 0.05)
    config = load_config(args.config, [*base, f"output_dir={out / name}", f"train.max_minutes={minutes}"])
    print(f"{name}: training the translator for {minutes:.2f} minutes")
    progress = train_translation(config, overwrite=True, progress_bar=not args.no_progress)
    translator = Translator.from_checkpoint(out / name / "best.pt")
    test = translator.evaluate(read_parallel(folder, "test", SOURCE, TARGET), beam_size=5, batch_size=64, hypotheses_file=out / name / "test.beam5.en")
    result.update(
        translation={"minutes": round(progress.seconds / 60, 2), "epochs": progress.epoch, "best_epoch": progress.best_epoch, "stop_reason": progress.stop_reason},
        training_minutes=round(progress.seconds / 60 + result.get("pretraining", {}).get("minutes", 0.0), 2),  # what the arm trained, both stages
        wall_minutes=round((time.perf_counter() - began) / 60, 2),  # set-up (subword models, data) and testing included
        bleu_cased=test["bleu"],
        chrf=test["chrf"],
        bleu_signature=test["bleu_signature"],
    )
    (out / "results").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results" / f"{name}.json", result, indent=2)
    print(f"{name}: test BLEU {test['bleu']} (cased, beam 5) after {result['training_minutes']} minutes of training")
    return result


def head_figure(out: Path, seed: int, figure: str) -> dict:
    """The first seed's full-data encoders, head by head, on validation sentences -> heads.json, heads.png."""
    from attnkit.model import model_from_checkpoint
    from attnkit.checkpoint import load_checkpoint
    from attnkit.viz import plot_head_tables

    mlm_path, tuned_path, scratch_path = (out / folder / "best.pt" for folder in (f"full-pretrained-seed{seed}-mlm", f"full-pretrained-seed{seed}", f"full-scratch-seed{seed}"))
    if not all(path.is_file() for path in (mlm_path, tuned_path, scratch_path)):
        return {}
    mlm, pipeline = pretrained_from_checkpoint(mlm_path)
    encoders = {"pre-trained (masked LM)": (mlm.encoder, pipeline)}
    translators = {"fine-tuned from it": load_checkpoint(tuned_path), "trained from scratch": load_checkpoint(scratch_path)}
    for label, checkpoint in translators.items():
        encoders[label] = (model_from_checkpoint(checkpoint).eval().encoder_for("text"), TextPipeline.from_checkpoint(checkpoint))
    folder = Path(translators["fine-tuned from it"].config["data"]["path"])
    sentences = [source for source, _ in read_parallel(folder, "valid", SOURCE, TARGET)][:HEAD_SENTENCES]
    statistics = {label: encoder_head_statistics(encoder, text, sentences) for label, (encoder, text) in encoders.items()}
    write_json_atomic(out / "heads.json", {"sentences": len(sentences), "seed": seed, "encoders": statistics}, indent=1)
    tables = {f"{label}\n{statistic.replace('_', ' ')}": (stats[statistic], "Blues") for label, stats in statistics.items() for statistic in SHOWN}
    png = plot_head_tables(tables, out / "heads.png", title=f"What each encoder head attends to (Multi30k German, {len(sentences)} validation sentences; seed {seed})", per_row=len(SHOWN), value_range=(0.0, 1.0))
    if figure:
        shutil.copyfile(png, figure)
    return statistics


def summarise(out: Path, figure: str) -> dict:
    results = [json.loads(path.read_text()) for path in sorted((out / "results").glob("*.json"))]
    if not results:
        raise UserError(f"{out / 'results'} holds no arm's result: run the arms first")
    rows, comparison = [], {}
    for data in DATA:
        by_arm = {arm: {r["seed"]: r for r in results if r["data"] == data and r["arm"] == arm} for arm in ARMS}
        if not any(by_arm.values()):
            continue
        seeds = sorted(set(by_arm["scratch"]) & set(by_arm["pretrained"]))
        means = {arm: round(mean(by_arm[arm][s]["bleu_cased"] for s in seeds), 2) if seeds else None for arm in ARMS}
        gain = round(means["pretrained"] - means["scratch"], 2) if seeds else None
        comparison[data] = {"seeds": seeds, "mean_bleu_cased": means, "gain": gain, "target_gain": TARGET_GAIN[data], "met": gain is not None and gain >= TARGET_GAIN[data]}
        for arm in ARMS:
            for seed, r in sorted(by_arm[arm].items()):
                pre = r.get("pretraining", {})
                rows.append(
                    f"| {data} | {arm} | {seed} | {pre.get('minutes', '')} ({pre.get('epochs', '')}) | {pre.get('valid', {}).get('accuracy', '')} | "
                    f"{r['translation']['minutes']} ({r['translation']['epochs']}) | {r['bleu_cased']} | {r['chrf']} |"
                )
    table = [
        "| data | arm | seed | pre-training min (epochs) | masked accuracy % | translation min (epochs) | test BLEU (cased, beam 5) | chrF |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    write_text_atomic(out / "table.md", "\n".join(table) + "\n")
    print("\n".join(table))
    for data, c in comparison.items():
        print(f"{data}: pretrained {c['mean_bleu_cased']['pretrained']} vs scratch {c['mean_bleu_cased']['scratch']} (seeds {c['seeds']}): gain {c['gain']} (target >= {c['target_gain']}: {'met' if c['met'] else 'not met'})")
    heads = head_figure(out, min(r["seed"] for r in results), figure)
    return {"comparison": comparison, "arms": results, "heads": heads}


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    busy_before = busy_cores()
    out = Path(args.out or ROOT / "runs" / ("bench-pretrain-quick" if args.quick else "bench-pretrain"))
    if args.quick:
        args.minutes, args.slice = (0.6 if args.minutes == 60.0 else args.minutes), min(args.slice, QUICK["train"] // 4)
    if not 0 < args.pretrain_share < 1:
        raise UserError(f"--pretrain-share {args.pretrain_share}: a share between 0 and 1")
    if not args.summarise:
        out.mkdir(parents=True, exist_ok=True)
        folders = datasets(args, out)
        if args.prepare:
            return 0
        for data in args.data or DATA:
            for seed in args.seed or (1, 2):
                for arm in args.arm or ARMS:
                    run_arm(args, out, data, *folders[data], arm, seed)
    if args.no_summary:
        return 0
    summary = summarise(out, args.figure)
    # --summarise reads arms that other processes ran and that have ended: the load it samples is the machine's after
    # them, never the load they started under, so it is not given as busy_cores_before.
    load = {"busy_cores_after_arms": busy_before} if args.summarise else {}
    return print_result({"benchmark": "pretrain", "mode": "quick" if args.quick else "full", "minutes_per_arm": args.minutes,
                         "pretrain_share": args.pretrain_share, "frozen_steps": args.frozen_steps, "slice": args.slice,
                         "config": args.config, "overrides": args.overrides, "run_dir": str(out), **load, **summary},
                        None if args.summarise else busy_before)  # fmt: skip


if __name__ == "__main__":
    sys.exit(run_cli(main))
