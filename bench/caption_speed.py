"""Decoding speed: batched beam search over many images against the same model decoding one image at a time.

Run from the project root, with a captioning checkpoint trained on the Flickr8k subset::

    python bench/caption_speed.py --checkpoint runs/flickr8k/best.pt            # 490 test images
    python bench/caption_speed.py --checkpoint runs/flickr8k/best.pt --quick    # 128 images (about a minute)
    python bench/caption_speed.py --checkpoint runs/flickr8k/best.pt --device cuda   # on a GPU (default: the CPU)

Both sides decode the same test images with the same model, beam size and length
limit; the popular Show-Attend-Tell tutorial's beam search decodes one image at a
time, which is what the second side does (through attnkit's own beam search with a
batch of one). The frozen encoder's grid features come from the feature cache for
both sides (computed once beforehand, not timed), so the figure is the search's. It
also reports how many captions the two sides agree on (they should all agree: a
padded batch decodes like each image alone).

Human-readable lines first; the LAST line of stdout is one JSON object. Target from
the issue: batched >= 10x the captions per second of one at a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from attnkit.captioning import Captioner
from attnkit.data.captions import image_root, read_caption_split
from attnkit.distributed import resolve_device
from attnkit.interfaces import GridFeatures
from attnkit.errors import UserError, run_cli
from attnkit.search import search
from machine import add_device_argument, busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 10.0


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a captioning checkpoint with a frozen image encoder")
    parser.add_argument("--data", default=str(ROOT / "data" / "flickr8k"), help="prepared captioning dataset (its test split is decoded)")
    parser.add_argument("--cache", default=str(ROOT / "cache" / "features"), help="feature cache folder")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="decode 128 images instead of the whole test split")
    add_device_argument(parser)
    return parser


def decode(captioner: Captioner, features: torch.Tensor, beam: int, batch_size: int) -> tuple[list[list[int]], float]:
    """Token ids of the best caption per image, and the seconds the searches took."""
    vocab, found = captioner.pipeline.vocab, []
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(features), batch_size):
            encoded = captioner.model.encode(GridFeatures(features[start : start + batch_size].float()))
            found += [h[0].tokens for h in search(captioner.model.decoder, encoded, vocab.bos_index, vocab.eos_index, captioner.search, beam)]
    return found, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    device = resolve_device(args.device)
    busy_before = busy_cores()
    captioner = Captioner.from_checkpoint(args.checkpoint, device=str(device), cache_dir=args.cache)
    if captioner.cache is None:
        raise UserError("this benchmark needs a checkpoint with a frozen, pretrained image encoder (its features are cached)")
    items = read_caption_split(args.data, "test")[: 128 if args.quick else None]
    root = image_root(args.data)
    encoder = captioner.model.encoder_for("image")
    features = captioner.cache.get([root / item.image for item in items], lambda pixels: encoder.cacheable_features(pixels.to(device)))
    features = features.to(device)  # on the device before the clock starts, as the cache's features are computed before it
    print(f"caption_speed ({'quick' if args.quick else 'full'}): {len(items)} images, beam {args.beam}, on {device}, torch threads {torch.get_num_threads()}")
    if busy_before is not None and busy_before >= 0.25:
        print(f"note: other work kept {busy_before} core(s) busy just before the start; rerun on idle cores")

    decode(captioner, features[:4], args.beam, args.batch_size)  # warm-up
    batched, batched_seconds = decode(captioner, features, args.beam, args.batch_size)
    alone, alone_seconds = decode(captioner, features, args.beam, 1)
    batched_rate, alone_rate = len(items) / batched_seconds, len(items) / alone_seconds
    ratio = batched_rate / alone_rate
    agree = sum(a == b for a, b in zip(batched, alone))
    met = ratio >= TARGET_RATIO
    print(f"batched  : {batched_rate:8.1f} captions/s  (batches of {args.batch_size}, {batched_seconds:.1f} s)")
    print(f"one by one: {alone_rate:8.1f} captions/s  ({alone_seconds:.1f} s)")
    print(f"ratio    : {ratio:.1f}x (target >= {TARGET_RATIO:.0f}x: {'met' if met else 'NOT met'}); identical captions: {agree}/{len(items)}")
    result = {
        "benchmark": "caption_speed",
        "mode": "quick" if args.quick else "full",
        "device": str(device),
        "images": len(items),
        "beam_size": args.beam,
        "batch_size": args.batch_size,
        "batched_captions_per_s": round(batched_rate, 2),
        "one_at_a_time_captions_per_s": round(alone_rate, 2),
        "ratio": round(ratio, 2),
        "target": TARGET_RATIO,
        "met": met,
        "identical_captions": agree,
        "checkpoint": args.checkpoint,
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
