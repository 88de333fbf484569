"""Training speed of translation recipes side by side: target tokens/s on the same data, machine and threads.

Run from the project root::

    python bench/recipe_speed.py                  # the Multi30k RNN (subword) and Transformer recipes, 6,400 pairs each
    python bench/recipe_speed.py --pairs 1280     # a smoke check (seconds)
    python bench/recipe_speed.py --config tasks/configs/multi30k_de_en_subword.yaml --config my.yaml
    python bench/recipe_speed.py --set train.precision=bf16      # an override for every recipe
    python bench/recipe_speed.py --device cuda    # on a GPU (default: the CPU)

Each recipe is set up as ``attnkit train`` sets it up (its sentencepiece models, vocabularies and
model, from ``data/multi30k-de-en``, prepared from ``../shared/data`` when missing), then the real
``Trainer.train_epoch`` is timed on the same ``--pairs`` training pairs (a seeded sample; the
recipe's own batch size, bucketing, dropout, label smoothing and optimiser) after a warm-up of a few
batches. Recipes run one after the other in this process, never side by side. Tokens are target
tokens (subwords + ``<eos>``, as ``LossOutput.tokens`` counts them) — the two recipes' sentencepiece
models are trained alike on the same text, so their token counts agree to within a few per mille.

It also reports each recipe's matrix-multiply FLOPs per target token (``torch.utils.flop_counter``):
tokens/s times it is the arithmetic rate the trainer sustains, against ``calibration.matmul_gflops``.
Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnkit.config import load_config, to_dict
from attnkit.data.batching import BatchLimit
from attnkit.data.text import ParallelTextDataset
from attnkit.distributed import Distributed, choose_threads, resolve_device
from attnkit.errors import UserError, run_cli
from attnkit.model import count_parameters
from attnkit.train import CheckpointContents, RunContext, Trainer
from attnkit.translation import TASK, prepare_translation
from machine import add_device_argument, busy_cores, print_result, project_path
from multi30k import SOURCE, TARGET, ensure_dataset
from train_speed import flops_per_token

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("tasks/configs/multi30k_de_en_subword.yaml", "tasks/configs/multi30k_de_en_transformer.yaml")
WARMUP_BATCHES = 4


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", dest="configs", action="append", default=[], help=f"a translation recipe (repeat; default: {', '.join(RECIPES)})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override (every recipe)")
    parser.add_argument("--pairs", type=int, default=6400, help="training pairs timed per recipe (one epoch over them)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: every core this process may use)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample of pairs and of the weights")
    parser.add_argument("--data", default="", help="data root holding multi30k/ (default $ATTNKIT_DATA, else ../shared/data)")
    add_device_argument(parser)
    return parser


def _never_validates(model):
    raise AssertionError("the benchmark times train_epoch only; validation must not run")


def measure(
    config_path: str, dataset_folder: Path, pairs: int, seed: int, scratch: Path, overrides: list[str] = (), device: torch.device = torch.device("cpu")
) -> dict:
    """Set the recipe up as training does, then time one epoch over ``pairs`` of its training pairs on ``device``."""
    settings = [f"data.path={dataset_folder}", f"output_dir={scratch / 'run'}", f"train.device={device}", f"train.seed={seed}", *overrides]
    config = load_config(config_path, settings)
    torch.manual_seed(seed)
    setup = prepare_translation(config, None, RunContext(Distributed.from_environment(), device, log=lambda *_: None))
    full = setup.dataset
    chosen = random.Random(seed).sample(range(len(full)), min(pairs, len(full)))
    sample = ParallelTextDataset([full.source_ids[i] for i in chosen], [full.target_ids[i] for i in chosen])
    warm = ParallelTextDataset(sample.source_ids[: WARMUP_BATCHES * config.train.batch_size], sample.target_ids[: WARMUP_BATCHES * config.train.batch_size])
    contents = CheckpointContents(TASK, to_dict(setup.config), setup.vocabularies, setup.subword_models)

    def trainer(data: ParallelTextDataset, folder: str) -> Trainer:
        return Trainer(setup.model, setup.objective, data, setup.collate, _never_validates, setup.config.train, scratch / folder, contents, progress_bar=False)

    trainer(warm, "warmup").train_epoch(1)  # allocator, thread pool and kernels warm, on the same path
    timed = trainer(sample, "timed")
    tokens = sum(len(target) - 1 for target in sample.target_ids)  # subwords + <eos>, as LossOutput.tokens
    started = time.perf_counter()
    reported = timed.train_epoch(1)["train_tokens_per_s"]
    seconds = time.perf_counter() - started
    flops = flops_per_token(setup.model, setup.objective, sample)
    timed.batches.set_epoch(1)  # the timed epoch's batches again: their padded size (rows x longest target)
    padded = [len(batch) * max(len(sample.target_ids[i]) for i in batch) for batch in timed.batches]
    return {
        "config": project_path(config_path),
        "family": setup.config.decoder.family,
        "precision": setup.config.train.precision,
        "parameters": count_parameters(setup.model),
        "batch_size": config.train.batch_size,
        "batches": str(BatchLimit.of(config.train)),
        "steps": len(padded),
        "padded_target_tokens_per_batch": round(sum(padded) / len(padded), 1),
        "pairs": len(sample),
        "target_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "trainer_tokens_per_s": round(reported, 1),
        "matmul_flops_per_token": round(flops),
        "sustained_gflops": round(flops * tokens / seconds / 1e9, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.pairs < 64:
        raise UserError(f"--pairs must be at least 64, got {args.pairs}")
    device = resolve_device(args.device)
    busy_before = busy_cores()
    torch.set_num_threads(choose_threads(args.threads))
    dataset = ROOT / "data" / f"multi30k-{SOURCE}-{TARGET}"
    ensure_dataset(dataset, args.data)
    results = []
    with tempfile.TemporaryDirectory(prefix="attnkit-recipe-speed-") as scratch:
        for index, config_path in enumerate(args.configs or [str(ROOT / recipe) for recipe in RECIPES]):
            result = measure(config_path, dataset, args.pairs, args.seed, Path(scratch) / str(index), args.overrides, device)
            print(
                f"{result['config']}: {result['tokens_per_s']:,.0f} target tokens/s ({result['pairs']} pairs, {result['seconds']} s; "
                f"{result['parameters']:,} parameters, {result['matmul_flops_per_token'] / 1e6:.1f} MFLOP per token, {result['sustained_gflops']} GFLOP/s; "
                f"batches of {result['batches']}: {result['steps']}, {result['padded_target_tokens_per_batch']:,.0f} padded target tokens each)"
            )
            results.append(result)
    first = results[0]["tokens_per_s"]
    for result in results[1:]:
        result["relative_to_first"] = round(result["tokens_per_s"] / first, 3)
    return print_result(
        {"benchmark": "recipe_speed", "device": str(device), "threads": torch.get_num_threads(), "seed": args.seed, "overrides": args.overrides, "results": results},
        busy_before,
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
