"""The embedded demo: one decoder core, two tasks. Train a small French -> English translator and a
small captioner of generated images, use both, show their attention.

    make demo                  # or: python tasks/demo.py [--set train.epochs=3 ...] [--caption-set train.epochs=2 ...]

Everything runs on embedded data (the committed Tatoeba subset data/tatoeba-fr-en
and images generated on the spot) and is written under runs/demo/ (a previous
demo run there is replaced): best.pt / last.pt checkpoints, log.jsonl,
translations.txt, attention.png, test_scores.json; captioner/ with its
checkpoints, captions.txt and caption-attention-<n>.png overlays.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attnkit.captioning import Captioner, train_captioning
from attnkit.config import load_config
from attnkit.data.captions import image_root, read_caption_split
from attnkit.data.images import open_rgb
from attnkit.data.shapes import write_shape_dataset
from attnkit.data.text import read_parallel, resolve_languages
from attnkit.errors import run_cli
from attnkit.files import write_text_atomic
from attnkit.translation import Translator, train_translation
from attnkit.viz import plot_attention_matrix, plot_image_attention
from attnkit.vocab import EOS

ROOT = Path(__file__).resolve().parents[1]
SHOWN = 8  # test sentences printed
CAPTIONED = 4  # generated test images captioned


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/demo.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--caption-config", default=str(ROOT / "tasks/configs/demo_captions.yaml"))
    parser.add_argument("--caption-set", dest="caption_overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    config = load_config(args.config, args.overrides)
    run_dir = config.run_dir
    started = time.perf_counter()
    source_lang, target_lang = resolve_languages(config.data.path, config.data.source_lang, config.data.target_lang)
    print(f"1/4 training a {source_lang}->{target_lang} translator on {config.data.path} ({run_dir} is replaced)")
    train_translation(config, overwrite=True, progress_bar=not args.no_progress)

    translator = Translator.from_checkpoint(run_dir / "best.pt")
    test_pairs = read_parallel(config.data.path, "test", source_lang, target_lang)
    shown = test_pairs[:SHOWN]
    print(f"\n2/4 translating {len(shown)} test sentences (beam {config.search.beam_size})")
    results = translator.translate([source for source, _ in shown])
    lines = []
    for (source, reference), (best, *_) in zip(shown, results):
        lines += [f"{source_lang}:  {source}", f"out: {best.text}", f"ref: {reference}", ""]
    print("\n".join(lines))
    write_text_atomic(run_dir / "translations.txt", "\n".join(lines))

    example = max((r[0] for r in results if not r[0].error), key=lambda t: len(t.source_words))
    attention_png = plot_attention_matrix(
        example.attention, example.source_words, example.words + ([EOS] if example.finished else []), run_dir / "attention.png", title=example.text
    )

    print(f"3/4 scoring all {len(test_pairs)} test sentences")
    scores = translator.evaluate(test_pairs)
    write_text_atomic(run_dir / "test_scores.json", json.dumps(scores, indent=2) + "\n")
    print(f"test BLEU {scores['bleu']}  chrF {scores['chrf']}  ({scores['bleu_signature']})")

    caption_outputs = caption_generated_images(args, run_dir)
    print(f"\ndone in {time.perf_counter() - started:.0f} s. Outputs:")
    for name, what in [
        ("best.pt", "checkpoint (try: python tasks/translate.py --checkpoint runs/demo/best.pt \"je suis content .\")"),
        ("log.jsonl", "one JSON line per epoch"),
        ("translations.txt", "the sentences above"),
        (attention_png.name, "source x output attention of one translation"),
        ("test_scores.json", "BLEU and chrF on the test split"),
    ]:
        print(f"  {run_dir / name}: {what}")
    for path, what in caption_outputs:
        print(f"  {path}: {what}")
    return 0


def caption_generated_images(args: argparse.Namespace, run_dir: Path) -> list[tuple[Path, str]]:
    """Step 4: the same decoder core on images: generate shapes, train a captioner, caption a few, draw the overlays."""
    shapes = write_shape_dataset(run_dir / "shapes", per_combination=3, seed=0)
    config = load_config(args.caption_config, [f"data.path={shapes}", f"output_dir={run_dir / 'captioner'}", *args.caption_overrides])
    items = read_caption_split(shapes, "test")
    print(f"\n4/4 captioning generated images: training a {config.decoder.style} {config.decoder.rnn} decoder on frozen {config.image_encoder.backbone} features")
    train_captioning(config, overwrite=True, progress_bar=not args.no_progress)
    captioner = Captioner.from_checkpoint(config.run_dir / "best.pt", cache_dir=config.data.feature_cache or None)
    shown = items[:: max(1, len(items) // CAPTIONED)][:CAPTIONED]
    root = image_root(shapes)
    results = captioner.caption([root / item.image for item in shown])
    lines, outputs = [], []
    for number, (item, (best, *_)) in enumerate(zip(shown, results), 1):
        lines += [f"image: {item.image}", f"out:   {best.text}", f"ref:   {item.captions[0]}", ""]
        words = best.words + ([EOS] if best.finished else [])
        png = plot_image_attention(open_rgb(root / item.image), words, best.attention, best.grid, config.run_dir / f"caption-attention-{number}.png", best.text)
        outputs.append((png, f"attention over the {best.grid[0]}x{best.grid[1]} grid for each word of '{best.text}'"))
    print("\n".join(lines))
    captions_txt = write_text_atomic(config.run_dir / "captions.txt", "\n".join(lines))
    example = root / shown[0].image
    checkpoint = (config.run_dir / "best.pt", f"captioning checkpoint (try: python tasks/caption.py --checkpoint {config.run_dir / 'best.pt'} {example})")
    return [checkpoint, (captions_txt, "the captions above"), *outputs]


if __name__ == "__main__":
    sys.exit(run_cli(main))
