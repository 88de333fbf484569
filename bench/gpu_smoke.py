"""GPU smoke run: each recipe trains a few hundred steps on CUDA with mixed precision; prints tokens/s and memory.

    python bench/gpu_smoke.py                          # CUDA, precision auto (bf16 where supported), 300 steps per recipe
    python bench/gpu_smoke.py --device cpu --tiny      # the same path on a CPU with tiny models (what the tests run)

Runs on embedded data only, so it works on a machine that has nothing but this
checkout: the translation recipe (tasks/configs/multi30k_de_en.yaml's model) on the
Tatoeba corpus in data/, the captioning recipe (flickr8k.yaml's frozen EfficientNet-
Lite0 + Show-Attend-Tell decoder) and the joint recipe (scenes_multitask.yaml) on
generated scenes, and the same three with their Transformer recipes' models
(multi30k_de_en_transformer.yaml, flickr8k_transformer.yaml, scenes_transformer.yaml). Each goes through the task's own ``prepare`` (data, feature cache,
model) and the shared Trainer, epoch after epoch until ``--steps`` optimizer steps;
validation is not run. Reports per recipe: steps, target tokens/s of the last epoch,
peak CUDA memory allocated and reserved.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnkit.captioning import prepare_captioning
from attnkit.config import load_config
from attnkit.data.scenes import write_scene_dataset
from attnkit.distributed import Distributed, resolve_device
from attnkit.errors import UserError, run_cli
from attnkit.multitask import prepare_multitask
from attnkit.train import CheckpointContents, RunContext, Trainer
from attnkit.translation import prepare_translation
from machine import busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "text_encoder.embedding_size=16", "text_encoder.hidden_size=8", "decoder.embedding_size=16", "decoder.hidden_size=16",
    "decoder.attention_size=8", "image_encoder.backbone=resnet18", "image_encoder.weights=none", "image_encoder.image_size=32",
    "image_encoder.grid_size=2", "image_encoder.blocks=0", "image_encoder.memory_size=16", "train.batch_size=8",
]  # fmt: skip
TINY_TRANSFORMER = ["text_encoder.hidden_size=16", "text_encoder.heads=2", "text_encoder.feedforward_size=32", "decoder.heads=2", "decoder.feedforward_size=32"]


RECIPES = ("translation", "captioning", "multitask", "translation_transformer", "captioning_transformer", "multitask_transformer")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    parser.add_argument("--precision", default="auto", help="auto | fp32 | bf16 | fp16")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per recipe (whole epochs until at least this many)")
    parser.add_argument("--scenes", type=int, default=1000, help="generated training scenes for the captioning and joint recipes")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (a path check, not a measurement)")
    return parser


def recipe_configs(args: argparse.Namespace, scenes: Path, cache: Path) -> dict:
    common = [f"train.device={args.device}", f"train.precision={args.precision}", f"data.feature_cache={cache}", "output_dir="]
    if args.tiny:
        common += TINY
    text = [f"data.path={ROOT / 'data' / 'tatoeba-fr-en'}"]
    captions = [f"data.path={scenes / 'captions'}"]
    joint = [f"data.path={scenes / 'captions'}", f"data.text_path={scenes / 'text'}"]
    if args.tiny:  # the joint model's two memories must agree with TINY's sizes
        joint += ["text_encoder.rnn=none", "text_encoder.embedding_size=16"]
    transformer = [*common, *TINY_TRANSFORMER] if args.tiny else common
    return {
        "translation": (prepare_translation, load_config(ROOT / "tasks/configs/multi30k_de_en.yaml", [*text, *common])),
        "captioning": (prepare_captioning, load_config(ROOT / "tasks/configs/flickr8k.yaml", [*captions, *common])),
        "multitask": (prepare_multitask, load_config(ROOT / "tasks/configs/scenes_multitask.yaml", [*joint, *common])),
        # The Transformer recipes' models on the same data (the subword recipe's tokenizer makes its pieces on Tatoeba).
        "translation_transformer": (prepare_translation, load_config(ROOT / "tasks/configs/multi30k_de_en_transformer.yaml", [*text, *transformer, "data.tokenizer.vocab_size=1000"])),
        "captioning_transformer": (prepare_captioning, load_config(ROOT / "tasks/configs/flickr8k_transformer.yaml", [*captions, *transformer])),
        "multitask_transformer": (prepare_multitask, load_config(ROOT / "tasks/configs/scenes_transformer.yaml", [*joint, *transformer])),
    }


def never_validated(model) -> dict:
    raise AssertionError("the smoke run trains only")


def run_recipe(name: str, prepare, config, device: torch.device, steps: int, work: Path) -> dict:
    context = RunContext(Distributed(), device, print)
    torch.manual_seed(config.train.seed)
    setup = prepare(config, None, context)
    contents = CheckpointContents(name, {}, setup.vocabularies)
    trainer = Trainer(
        setup.model, setup.objective, setup.dataset, setup.collate, never_validated, setup.config.train, work / name, contents,
        progress_bar=False, parameter_groups=setup.parameter_groups, batches=setup.batches, distributed=Distributed(), device=device,
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    epoch, stats, started = 0, {}, time.perf_counter()
    while trainer.progress.step < steps:
        epoch += 1
        stats = trainer.train_epoch(epoch)
        print(f"{name}: epoch {epoch}, step {trainer.progress.step}: loss {stats['train_loss']}, {stats['train_tokens_per_s']:.0f} tok/s")
    result = {
        "steps": trainer.progress.step,
        "epochs": epoch,
        "tokens_per_s_last_epoch": stats["train_tokens_per_s"],
        "train_loss_last_epoch": stats["train_loss"],
        "seconds": round(time.perf_counter() - started, 1),
        "precision": str(trainer.dtype).removeprefix("torch."),
    }
    if device.type == "cuda":
        result["peak_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        result["peak_memory_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 2)
    return result


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    device = resolve_device(args.device)
    chosen = [name.strip() for name in args.recipes.split(",")]
    busy = busy_cores()
    results = {}
    with tempfile.TemporaryDirectory(prefix="attnkit-gpu-smoke-") as folder:
        work = Path(folder)
        scene_count = 16 if args.tiny else args.scenes
        scenes = write_scene_dataset(work / "scenes", {"train": scene_count, "valid": 4}, seed=0, size=32 if args.tiny else 128)
        configs = recipe_configs(args, scenes, work / "cache")
        unknown = sorted(set(chosen) - set(configs))
        if unknown:
            raise UserError(f"unknown recipe {', '.join(unknown)}; choose from {', '.join(configs)}")
        for name in chosen:
            prepare, config = configs[name]
            results[name] = run_recipe(name, prepare, config, device, 2 if args.tiny else args.steps, work)
    return print_result({"benchmark": "gpu_smoke", "device": str(device), "tiny": args.tiny, "recipes": results}, busy)


if __name__ == "__main__":
    sys.exit(run_cli(main))
