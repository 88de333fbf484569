"""What each offline image backbone costs a captioner: the features computed once per photo, and every epoch after.

Run from the project root::

    python bench/backbones.py                    # efficientnet_lite0, 1, 2 on 128 Flickr8k training photos
    python bench/backbones.py --quick            # 32 photos (well under a minute)
    python bench/backbones.py --backbones efficientnet_lite2 --photos 256

Each backbone is the captioning recipe's image encoder (``tasks/configs/flickr8k.yaml``: its last
``--trainable-blocks`` blocks fine-tuned, cells projected to 512) at the resolution its ImageNet weights were trained
at, one cell per position of its map there (EfficientNet-Lite0 224 px, 7 x 7; Lite1 240 px, 8 x 8; Lite2 260 px, 9 x 9).
What a training run pays for it, measured on the same photos:

1. ``prefix_ms_per_photo``: the frozen blocks, once per photo (the feature cache keeps their map);
2. ``cache_kb_per_photo``: that map in the cache (float16);
3. ``epoch_ms_per_photo``: what every training step pays per photo from the cached map on: the fine-tuned blocks
   and the projection, forward and backward (the decoder's cost grows with the cells: ``cells``);
4. ``parameters``: the backbone's, and the fine-tuned share of them.

Which backbone gives better captions is measured by training, e.g.
``python bench/image_memory.py --candidate "lite2: image_encoder.backbone=efficientnet_lite2 image_encoder.image_size=260 image_encoder.grid_size=9"``.
Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from attnkit.cli import positive_int
from attnkit.config import ImageEncoderConfig
from attnkit.data.captions import image_root, read_caption_split
from attnkit.data.images import load_image
from attnkit.encoders import efficientnet_lite
from attnkit.encoders.image import ImageEncoder
from attnkit.errors import UserError, run_cli
from attnkit.interfaces import GridFeatures
from machine import busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_scripts import prepare_flickr8k  # noqa: E402  (the project root is not on sys.path for bench/ scripts)

RECIPE_TRAINABLE_BLOCKS = 2  # tasks/configs/flickr8k.yaml's image_encoder.trainable_blocks
RECIPE_MEMORY_SIZE = 512
BATCH = 32


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbones", default=",".join(efficientnet_lite.VARIANTS), help="backbone names, separated by commas")
    parser.add_argument("--photos", type=positive_int, default=128, help="Flickr8k training photos to time on")
    parser.add_argument("--trainable-blocks", type=positive_int, default=RECIPE_TRAINABLE_BLOCKS, help="the fine-tuned last blocks (the recipe's: 2)")
    parser.add_argument("--data", help="data root holding flickr8k/ (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--quick", action="store_true", help="32 photos")
    return parser


def native_encoder(name: str, trainable_blocks: int) -> ImageEncoder:
    """The recipe's encoder on ``name`` at its ImageNet resolution, one cell per position of its map there (grid 0)."""
    resolution = efficientnet_lite.VARIANTS[name].resolution
    config = ImageEncoderConfig(backbone=name, image_size=resolution, grid_size=0, trainable_blocks=trainable_blocks, memory_size=RECIPE_MEMORY_SIZE)
    return ImageEncoder(config)


def milliseconds_per_photo(work, photos: int) -> float:
    """The best of three timed passes of ``work()`` (after one warm-up), per photo."""
    work()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return 1000 * best / photos


def measure(name: str, pixels: torch.Tensor, trainable_blocks: int) -> dict:
    encoder = native_encoder(name, trainable_blocks)
    batches = pixels.split(BATCH)

    def prefix() -> list[torch.Tensor]:
        return [encoder.frozen_features(batch) for batch in batches]  # (B, C', H', W') each

    cached = [features.half() for features in prefix()]  # what the feature cache stores

    def epoch_step() -> None:
        for features in cached:
            memory = encoder(GridFeatures(features)).memory  # (B, L, 512)
            memory.square().mean().backward()  # any loss: the backward pass is what is timed
        encoder.zero_grad(set_to_none=True)

    trainable = sum(p.numel() for p in encoder.backbone.parameters() if p.requires_grad)
    return {
        "image_size": encoder.config.image_size,
        "cells": encoder(GridFeatures(cached[0][:1])).memory.shape[1],  # L of (1, L, 512)
        "cached_map": list(cached[0].shape[1:]),
        "prefix_ms_per_photo": round(milliseconds_per_photo(prefix, len(pixels)), 1),
        "cache_kb_per_photo": round(cached[0][0].numel() * 2 / 1000, 1),
        "epoch_ms_per_photo": round(milliseconds_per_photo(epoch_step, len(pixels)), 1),
        "parameters": sum(p.numel() for p in encoder.backbone.parameters()),
        "fine_tuned_parameters": trainable,
    }


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    names = [name.strip() for name in args.backbones.split(",") if name.strip()]
    unknown = [name for name in names if name not in efficientnet_lite.VARIANTS]
    if not names or unknown:
        raise UserError(f"--backbones: {', '.join(unknown) or 'none given'}; choose among {', '.join(efficientnet_lite.VARIANTS)}")
    photos = 32 if args.quick else args.photos
    dataset = ROOT / "data" / "flickr8k"
    if not (dataset / "dataset.json").is_file():
        prepare_flickr8k.main(["--out", str(dataset)] + (["--data", args.data] if args.data else []))
    files = [image_root(dataset) / item.image for item in read_caption_split(dataset, "train")[:photos]]
    busy_before = busy_cores()
    results = {}
    for name in names:
        resolution = efficientnet_lite.VARIANTS[name].resolution
        pixels = torch.stack([load_image(path, resolution, efficientnet_lite.NORMALIZATION) for path in files])  # (N, 3, R, R)
        results[name] = found = measure(name, pixels, args.trainable_blocks)
        print(
            f"{name} at {found['image_size']} px, {found['cells']} cells: frozen blocks {found['prefix_ms_per_photo']} ms a photo once "
            f"({found['cache_kb_per_photo']} kB cached), fine-tuned blocks {found['epoch_ms_per_photo']} ms a photo every epoch, "
            f"{found['parameters']:,} parameters ({found['fine_tuned_parameters']:,} fine-tuned)"
        )
    return print_result({"benchmark": "backbones", "photos": len(files), "trainable_blocks": args.trainable_blocks, "backbones": results}, busy_before)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
