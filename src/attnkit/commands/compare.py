"""Compare attention over image regions and over source words, for the same target words.

One image and one source sentence (the target defaults to the caption decoded from the image):

    attnkit compare --checkpoint runs/scenes_multitask/best.pt --image scene.png \\
        --source "un grand cercle rouge à gauche d' un petit carré bleu" --out runs/compare
    attnkit compare --caption-checkpoint runs/flickr8k/best.pt --translation-checkpoint runs/multi30k_de_en/best.pt \\
        --image photo.jpg --source "ein hund rennt über das gras ." --target "a dog runs across the grass ." --out runs/compare-real

writes ``comparison.png`` (per target word its image map; below them one matrix of
every word's weights over the source words), ``importance.png`` (each word's attention above its
importance maps: how much of its log-probability rests on each cell and each source word, by the
estimators ``--importance`` names: unless told otherwise through attention, one position hidden, and windows of
1 and 2 positions hidden, a photo's cells from each step's attention and a sentence's words at the input, as chosen
on validation scenes; docs/comparison.md), ``report.html`` (self-contained; hover or click a word; switch between
attention and importance) and ``statistics.json`` (entropy, peak, effective positions, erasure,
importance and its agreement with attention, per word and modality).

Localisation without annotations: four photos in a 2 x 2 mosaic (row-major) and their four source
sentences joined as one source, in the same order; the target describes input ``--own`` (default
the caption decoded from that photo alone):

    attnkit compare --checkpoint runs/bench-real-attention/joint/best.pt --own 2 \\
        --image a.jpg --image b.jpg --image c.jpg --image d.jpg \\
        --source "ein hund ..." --source "zwei kinder ..." --source "eine frau ..." --source "ein mann ..." --out runs/compare-mosaic

writes the same three files for the mosaic and the joined source; ``statistics.json`` adds
``localisation``: each target word's attention mass on its own photo's quadrant and on its own
sentence (chance is about a quarter), and whether its peak lies there (the pointing game).

Generated held-out scenes with ground truth (a model trained on scenes: French -> English):

    attnkit compare --checkpoint runs/scenes_multitask/best.pt --scenes 500 --seed 0 --out runs/compare-scenes

writes ``metrics.json`` (caption and translation quality, pointing game, in-box
mass, AER, attention statistics; in-distribution test scenes and the
compositional split separately; the importance maps scored as the attention is,
unless ``--no-importance``), ``distributions.png`` (entropy and peak weight
per modality), ``erasure.png`` (what removing the attention peak, or a random
position, costs each word), for a multi-head decoder ``heads.png`` (every
layer's and head's pointing and AER) and the comparison of the first test scene. A progress bar counts
the scenes on a terminal; docs/comparison.md gives the cost per scene.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from attnkit.cli import GivenOnce, add_device_arguments, check_output_folder, int_in_range, positive_int, refuse_replacing_inputs, utf8_argument, warn_overlong_sources, warn_slow_decoding
from attnkit.analysis import EXTRACTIONS
from attnkit.comparison import DEFAULT_EXTRACTION, AttentionComparer
from attnkit.data.images import MOSAIC_PHOTOS, open_rgb
from attnkit.errors import UserError
from attnkit.importance import WINDOWS, add_importance_arguments, settings_from_arguments
from attnkit.report import compare_scenes, write_comparison, write_mosaic_comparison

COMPARISON_FILES = ("comparison.png", "importance.png", "report.html", "statistics.json")  # what write_comparison writes in its folder (importance.png: not for a mosaic)
SCENE_FILES = ("metrics.json", "distributions.png", "erasure.png", "heads.png")  # what compare_scenes writes, beside example/ (a comparison); heads.png for a multi-head decoder
SCENE_SIZES = (8, 2048)  # smaller scenes have no room for their objects; larger ones only cost memory


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action=GivenOnce, help="a joint (multitask) checkpoint: it captions and translates")
    parser.add_argument("--caption-checkpoint", action=GivenOnce, help="instead of --checkpoint: a captioning checkpoint ...")
    parser.add_argument("--translation-checkpoint", action=GivenOnce, help="... and a translation checkpoint into the same language")
    parser.add_argument("--image", action="append", default=[], help=f"the image; given {MOSAIC_PHOTOS} times, the photos of a 2 x 2 mosaic (row-major)")
    parser.add_argument("--source", action="append", default=[], help="a source-language sentence about the image (one per --image)")
    parser.add_argument("--target", help="the target sentence forced through both (default: the caption decoded from the image)")
    parser.add_argument("--own", type=int_in_range(0, MOSAIC_PHOTOS - 1), default=None, help="a mosaic: which input (0-3) the target describes (default 0)")
    parser.add_argument("--scenes", type=positive_int, default=None, metavar="N", help="instead of --image/--source: evaluate on N generated held-out scenes per split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    parser.add_argument("--scene-size", type=int_in_range(*SCENE_SIZES), default=128, help="side of the generated scene images in pixels")
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size for decoding (default: the checkpoint's)")
    parser.add_argument(
        "--extraction", choices=EXTRACTIONS, default=DEFAULT_EXTRACTION,
        help=f"--scenes: a word's attention is that of the step that emits it, or of the step whose query has read it "
        f"(default {DEFAULT_EXTRACTION}, chosen on validation scenes); metrics.json holds both",
    )  # fmt: skip
    parser.add_argument(
        "--no-importance", action="store_true",
        help="leave out the importance maps (they cost forward passes per grid cell and per source word; a mosaic has none): for one image, importance.png and "
        "the report's view switch; with --scenes, their scores in metrics.json (about a sixth of the time per scene; the example scene keeps them)",
    )  # fmt: skip
    add_importance_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="--scenes: no progress bar over the scenes (without it, the bar shows on a terminal)")
    parser.add_argument("--out", required=True, help="output folder (created; files in it are replaced)")
    add_device_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    out = Path(args.out)
    # Everything the user can get wrong is checked before the models load and the work starts.
    settings = settings_from_arguments(args)
    for number, sentence in enumerate(args.source, 1):
        utf8_argument(sentence, f"--source {number}" if len(args.source) > 1 else "--source")
    if args.target:
        utf8_argument(args.target, "--target")
    if args.checkpoint and (args.caption_checkpoint or args.translation_checkpoint):
        raise UserError("give a joint checkpoint, or a captioning and a translation checkpoint, not both")
    if not args.checkpoint and not (args.caption_checkpoint and args.translation_checkpoint):
        raise UserError("give a joint checkpoint, or both a captioning and a translation checkpoint: --checkpoint, or --caption-checkpoint and --translation-checkpoint")
    if args.scenes is not None:
        if args.image or args.source or args.target or args.own is not None:
            raise UserError("--scenes evaluates generated scenes: leave out --image, --source, --target and --own")
        check_output_folder(out, "--out", files=SCENE_FILES, folders=["example"])
        check_output_folder(out / "example", "--out", files=COMPARISON_FILES)
        writes = [*(out / name for name in SCENE_FILES), *(out / "example" / name for name in COMPARISON_FILES)]
    else:
        if not args.image or not args.source:
            raise UserError("give --image and --source (or --scenes N)")
        if len(args.image) != len(args.source) or len(args.image) not in (1, MOSAIC_PHOTOS):
            raise UserError(f"give one --image and one --source, or {MOSAIC_PHOTOS} of each for a mosaic; got {len(args.image)} and {len(args.source)}")
        if args.no_importance and len(args.image) > 1:
            raise UserError("--no-importance is for one image: a mosaic comparison has no importance maps")
        if args.own is not None and len(args.image) == 1:  # --own 0 too: it is not silently dropped
            raise UserError(f"--own picks the described input of a mosaic: give {MOSAIC_PHOTOS} --image and --source, or leave --own out")
        check_output_folder(out, "--out", files=COMPARISON_FILES)
        writes = [out / name for name in COMPARISON_FILES]
    checkpoints = [path for path in (args.checkpoint, args.caption_checkpoint, args.translation_checkpoint) if path]
    refuse_replacing_inputs(writes, "--out", [*((f"the --image {image}", image) for image in args.image), *((f"the checkpoint {path}", path) for path in checkpoints)])
    images = [open_rgb(image) for image in args.image]  # an unreadable photo is named before the models load
    comparer = AttentionComparer.from_checkpoints(args.checkpoint, args.caption_checkpoint, args.translation_checkpoint, device=args.device, precision=args.precision)
    if args.scenes is not None:
        warn_slow_decoding(comparer.captioner, comparer.translator)  # it captions and translates every scene
    elif args.target is None:
        warn_slow_decoding(comparer.captioner)  # it decodes the caption to force (the forced passes run in fp32)
    windows_asked = not args.no_importance and WINDOWS in settings.estimators
    grid_size = comparer.captioner.model.encoder_for("image").config.grid_size if windows_asked else 0  # 0: the backbone's own
    if grid_size:  # windows larger than the grid are refused before any work
        settings.check_grid((grid_size, grid_size))
    importance = False if args.no_importance else settings
    if args.scenes is not None:
        outputs = compare_scenes(
            comparer, out, args.scenes, args.seed, args.scene_size, args.beam, extraction=args.extraction, importance=importance,
            progress=False if args.no_progress else None,  # None: shown where standard error is a terminal
        )  # fmt: skip
    elif len(images) == 1:
        warn_overlong_sources(comparer.translator, args.source, what="source sentence")  # a mosaic's joined source is never cut: too long is refused
        outputs = write_comparison(comparer, images[0], args.source[0], args.target, out, importance=importance)
    else:
        outputs = write_mosaic_comparison(comparer, images, args.source, args.target, args.own or 0, out)
    for path, what in outputs:
        print(f"{path}: {what}")
    return 0

