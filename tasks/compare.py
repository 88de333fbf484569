"""Compare attention over image regions and over source words, for the same target words.

One image and one source sentence (the target defaults to the caption decoded from the image):

    python tasks/compare.py --checkpoint runs/scenes_multitask/best.pt --image scene.png \\
        --source "un grand cercle rouge à gauche d' un petit carré bleu" --out runs/compare
    python tasks/compare.py --caption-checkpoint runs/flickr8k/best.pt --translation-checkpoint runs/multi30k_de_en/best.pt \\
        --image photo.jpg --source "ein hund rennt über das gras ." --target "a dog runs across the grass ." --out runs/compare-real

writes ``comparison.png`` (per target word: its image map above its source-word
bars), ``report.html`` (self-contained; hover or click a word) and
``statistics.json`` (entropy, peak, effective positions per word and modality).

Generated held-out scenes with ground truth (a model trained on scenes: French -> English):

    python tasks/compare.py --checkpoint runs/scenes_multitask/best.pt --scenes 500 --seed 0 --out runs/compare-scenes

writes ``metrics.json`` (caption and translation quality, pointing game, in-box
mass, AER, attention statistics; in-distribution test scenes and the
compositional split separately), ``distributions.png`` (entropy and peak weight
per modality) and the comparison of the first test scene.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from attnkit.comparison import AttentionComparer, evaluate_scenes
from attnkit.data.images import open_rgb
from attnkit.data.scenes import generate_scenes
from attnkit.errors import UserError, run_cli
from attnkit.files import write_text_atomic
from attnkit.report import write_report
from attnkit.viz import plot_cross_modal, plot_distributions

SCENE_SPLITS = ("test", "compositional")  # in-distribution held-out scenes, then unseen colour-shape pairs


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a joint (multitask) checkpoint: it captions and translates")
    parser.add_argument("--caption-checkpoint", help="instead of --checkpoint: a captioning checkpoint ...")
    parser.add_argument("--translation-checkpoint", help="... and a translation checkpoint into the same language")
    parser.add_argument("--image", help="the image")
    parser.add_argument("--source", help="a source-language sentence about the image")
    parser.add_argument("--target", help="the target sentence forced through both (default: the caption decoded from the image)")
    parser.add_argument("--scenes", type=int, default=0, metavar="N", help="instead of --image/--source: evaluate on N generated held-out scenes per split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    parser.add_argument("--scene-size", type=int, default=128, help="side of the generated scene images in pixels")
    parser.add_argument("--beam", type=int, default=None, help="beam size for decoding (default: the checkpoint's)")
    parser.add_argument("--out", required=True, help="output folder (created; files in it are replaced)")
    parser.add_argument("--device", default="auto")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    comparer = AttentionComparer.from_checkpoints(args.checkpoint, args.caption_checkpoint, args.translation_checkpoint, device=args.device)
    out = Path(args.out)
    if args.scenes:
        if args.image or args.source or args.target:
            raise UserError("--scenes evaluates generated scenes: leave out --image, --source and --target")
        outputs = compare_scenes(comparer, out, args.scenes, args.seed, args.scene_size, args.beam)
    else:
        if not args.image or not args.source:
            raise UserError("give --image and --source (or --scenes N)")
        image = open_rgb(args.image)
        outputs = write_comparison(comparer, image, args.source, args.target, out)
    for path, what in outputs:
        print(f"{path}: {what}")
    return 0


def write_comparison(comparer: AttentionComparer, image, source: str, target: str | None, out: Path, title: str = "") -> list[tuple[Path, str]]:
    """The PNG, HTML report and statistics JSON of one image + sentence."""
    comparison = comparer.compare([image], [source], None if target is None else [target])[0]
    statistics = comparison.statistics()
    sentence = " ".join(comparison.target_words[:-1])
    out.mkdir(parents=True, exist_ok=True)
    png = plot_cross_modal(image, comparison, out / "comparison.png", title=title or sentence)
    html = write_report(out / "report.html", image, comparison, statistics)
    record = {"target": sentence, "target_given": target is not None, "source_words": comparison.source_words, "grid": list(comparison.grid), **statistics}
    stats = write_text_atomic(out / "statistics.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"target: {sentence}\nimage attention: {statistics['image']}\ntext attention:  {statistics['text']}")
    return [(png, "each target word's attention over the image (top) and over the source words (bottom)"), (html, "interactive report"), (stats, "statistics")]


def compare_scenes(comparer: AttentionComparer, out: Path, count: int, seed: int = 0, size: int = 128, beam: int | None = None) -> list[tuple[Path, str]]:
    """Metrics JSON and distribution plots on ``count`` generated scenes per split, and the comparison of one scene."""
    if comparer.translator.pipeline.source_lang != "fr" or comparer.translator.pipeline.target_lang != "en":
        raise UserError("generated scenes are described in French and English: this needs a French -> English model trained on scenes")
    if count < 1:
        raise UserError("--scenes must be at least 1")
    metrics: dict = {"seed": seed, "scene_size": size}
    distributions = {}
    for split in SCENE_SPLITS:
        scenes = generate_scenes(count, seed, split, size)
        result = evaluate_scenes(comparer, scenes, beam_size=beam)
        distributions[split] = result.pop("distributions")
        metrics[split] = result
        grounding = result["grounding"]
        print(
            f"{split}: caption BLEU-4 {result['captioning']['bleu4']}, exact {result['captioning']['exact_match']}%; "
            f"translation BLEU {result['translation']['bleu']}; pointing {grounding['pointing_hit_rate']}%, "
            f"in-box mass {grounding['in_box_mass']}, AER {grounding['aer']}"
        )
    out.mkdir(parents=True, exist_ok=True)
    metrics_json = write_text_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    series = {
        f"{statistic.replace('_', ' ')}": {f"{modality} ({split})": distributions[split][f"{modality}_{statistic}"] for split in SCENE_SPLITS for modality in ("image", "text")}
        for statistic in ("normalised_entropy", "peak")
    }
    plot = plot_distributions(series, out / "distributions.png", title=f"attention per target word, {count} scenes per split")
    example = generate_scenes(1, seed, "test", size)[0]
    sentence = example.sentences[0]
    outputs = [(metrics_json, "quality, grounding and attention statistics per split"), (plot, "entropy and peak weight per modality")]
    outputs += write_comparison(comparer, example.image(), sentence.french_text, sentence.english_text, out / "example")
    return outputs


if __name__ == "__main__":
    sys.exit(run_cli(main))
