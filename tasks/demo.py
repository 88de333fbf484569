"""The embedded demo: train a small French -> English translator, use it, show its attention.

    make demo                  # or: python tasks/demo.py [--set train.epochs=3 ...]

Everything runs on the committed Tatoeba subset (data/tatoeba-fr-en) and is
written under runs/demo/ (a previous demo run there is replaced):
best.pt / last.pt checkpoints, log.jsonl, translations.txt, attention.png and
test_scores.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attnkit.config import load_config
from attnkit.data.text import read_parallel, resolve_languages
from attnkit.errors import run_cli
from attnkit.files import write_text_atomic
from attnkit.translation import Translator, train_translation
from attnkit.viz import plot_attention_matrix
from attnkit.vocab import EOS

ROOT = Path(__file__).resolve().parents[1]
SHOWN = 8  # test sentences printed


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "tasks/configs/demo.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    config = load_config(args.config, args.overrides)
    run_dir = config.run_dir
    started = time.perf_counter()
    source_lang, target_lang = resolve_languages(config.data.path, config.data.source_lang, config.data.target_lang)
    print(f"1/3 training a {source_lang}->{target_lang} translator on {config.data.path} ({run_dir} is replaced)")
    train_translation(config, overwrite=True, progress_bar=not args.no_progress)

    translator = Translator.from_checkpoint(run_dir / "best.pt")
    test_pairs = read_parallel(config.data.path, "test", source_lang, target_lang)
    shown = test_pairs[:SHOWN]
    print(f"\n2/3 translating {len(shown)} test sentences (beam {config.search.beam_size})")
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

    print(f"3/3 scoring all {len(test_pairs)} test sentences")
    scores = translator.evaluate(test_pairs)
    write_text_atomic(run_dir / "test_scores.json", json.dumps(scores, indent=2) + "\n")
    print(f"test BLEU {scores['bleu']}  chrF {scores['chrf']}  ({scores['bleu_signature']})")
    print(f"\ndone in {time.perf_counter() - started:.0f} s. Outputs:")
    for name, what in [
        ("best.pt", "checkpoint (try: python tasks/translate.py --checkpoint runs/demo/best.pt \"je suis content .\")"),
        ("log.jsonl", "one JSON line per epoch"),
        ("translations.txt", "the sentences above"),
        (attention_png.name, "source x output attention of one translation"),
        ("test_scores.json", "BLEU and chrF on the test split"),
    ]:
        print(f"  {run_dir / name}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
