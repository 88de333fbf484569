"""Score a checkpoint on a split of its dataset or on any data; prints the scores as one JSON object.

Translation (sacreBLEU BLEU and chrF):

    attnkit evaluate --checkpoint runs/demo/best.pt --split test
    attnkit evaluate --checkpoint CK --source test.de --reference test.en --beam 5

Captioning (BLEU-1..4, CIDEr-D, METEOR when Java is there, NLTK BLEU-4):

    attnkit evaluate --checkpoint runs/flickr8k/best.pt --split test --beam 5
    attnkit evaluate --checkpoint CK --images photos/ --captions Flickr8k.token.txt

``--split`` reads the prepared dataset the checkpoint was trained on (or
``--data DIR``). ``--source``/``--reference`` take any raw, untokenised parallel
text, one sentence per line; ``--images``/``--captions`` any folder of images with
a caption file in the Flickr8k format (``image#k<TAB>caption``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from attnkit.captioning import TASK as CAPTIONING, Captioner
from attnkit.checkpoint import load_checkpoint
from attnkit.data.captions import CaptionedImage, image_root, read_caption_split, read_flickr8k_captions
from attnkit.cli import add_device_arguments, check_input_file, check_output_file, check_output_folder, input_lines, non_negative_int, positive_int, refuse_replacing_inputs, warn_overlong_sources, warn_slow_decoding
from attnkit.data.text import read_parallel
from attnkit.distributed import PRECISION_NAMES
from attnkit.errors import UserError
from attnkit.files import json_text
from attnkit.model import MULTITASK
from attnkit.translation import TASK as TRANSLATION, Translator

# The options of one task only, by task: (option, its name in the parsed arguments).
TASK_OPTIONS = {
    TRANSLATION: (("--source", "source"), ("--reference", "reference"), ("--output", "output"), ("--replace-unk", "replace_unk")),
    CAPTIONING: (("--images", "images"), ("--captions", "captions"), ("--cache", "cache")),
}
TASKS = {"caption": CAPTIONING, "translate": TRANSLATION}  # --task's choices
DOES = {CAPTIONING: "captions", TRANSLATION: "translates"}
DATA_OPTIONS = {CAPTIONING: ("--images", "--captions"), TRANSLATION: ("--source", "--reference")}  # data to score, beside --split


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, action="append", help="a checkpoint; several captioning checkpoints of one recipe: an ensemble")
    parser.add_argument("--split", help="split of the prepared dataset: train, valid or test")
    parser.add_argument("--data", help="prepared dataset folder (default: the one in the checkpoint's config)")
    parser.add_argument("--source", metavar="FILE", help="translation: raw source sentences, one per line")
    parser.add_argument("--reference", metavar="FILE", help="translation: raw reference translations, line-aligned with --source")
    parser.add_argument("--images", metavar="DIR", help="captioning: folder of the images named in --captions")
    parser.add_argument("--captions", metavar="FILE", help="captioning: reference captions, Flickr8k format (image#k<TAB>caption)")
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size (default: the checkpoint's search.beam_size)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="inputs decoded together in one batched search")
    parser.add_argument("--limit", type=non_negative_int, default=0, help="score only the first N pairs or images (0: all)")
    parser.add_argument("--output", metavar="FILE", help="translation: also write the translations here, one per line")
    parser.add_argument("--replace-unk", action="store_true", help="translation: the source word the attention peaks on in place of each <unk>")
    parser.add_argument("--cache", metavar="DIR", help="captioning: feature cache folder for a frozen encoder (default: none)")
    parser.add_argument("--task", choices=tuple(TASKS), help="a joint (multitask) checkpoint: which task to score (needed with --split; other data names its task; another checkpoint does only its own)")
    add_device_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    names, args.checkpoint = args.checkpoint, args.checkpoint[0]  # the first decides the task; the others join an ensemble
    checkpoint = load_checkpoint(args.checkpoint)
    task = chosen_task(args, checkpoint.task)
    if len(names) > 1 and task != CAPTIONING:
        raise UserError(f"several --checkpoint decode as an ensemble, which attnkit evaluate does for captioning; {args.checkpoint} {DOES[TRANSLATION]}")
    result = evaluate_translation(args, checkpoint) if task == TRANSLATION else evaluate_captioning(args, checkpoint, names[1:])
    print(json_text({"checkpoint": names[0] if len(names) == 1 else names, **result}))
    return 0


def given_options(args: argparse.Namespace, task: str) -> list[str]:
    """The options of ``task`` alone that were given."""
    return [option for option, name in TASK_OPTIONS[task] if getattr(args, name)]


def other_task_options(wrong: list[str], task: str, checkpoint_task: str) -> str:
    """The message for options of ``task`` given with a checkpoint of ``checkpoint_task`` alone: leave them out, and
    when they named data to score, the checkpoint's own options for that."""
    message = f"{'/'.join(wrong)} {'is' if len(wrong) == 1 else 'are'} for {task} checkpoints; this one {DOES[checkpoint_task]}: leave {'it' if len(wrong) == 1 else 'them'} out"
    return message + (f" (its own data to score: {'/'.join(DATA_OPTIONS[checkpoint_task])})" if set(wrong) & set(DATA_OPTIONS[task]) else "")


def chosen_task(args: argparse.Namespace, checkpoint_task: str) -> str:
    """The task to score: the checkpoint's, or for a joint checkpoint the one that --task or the options ask for.
    A request the checkpoint cannot do, or options of the other task, is one clear error (never silently ignored)."""
    asked = TASKS.get(args.task)
    if checkpoint_task in DOES:
        if asked is not None and asked != checkpoint_task:
            raise UserError(f"--task {args.task}: {args.checkpoint} is a {checkpoint_task} checkpoint, not a joint one; it only {DOES[checkpoint_task]} (leave --task out)")
        return checkpoint_task
    if checkpoint_task != MULTITASK:
        raise UserError(f"{args.checkpoint} is a '{checkpoint_task}' checkpoint; attnkit evaluate scores {TRANSLATION}, {CAPTIONING} and {MULTITASK} checkpoints")
    by_options = [task for task in TASK_OPTIONS if given_options(args, task)]  # a joint model does both: --task or the options say which
    if asked is not None and set(by_options) - {asked}:
        other = TRANSLATION if asked == CAPTIONING else CAPTIONING
        raise UserError(f"--task {args.task} does not go with {', '.join(given_options(args, other))} (options of {other}): this joint checkpoint scores one task at a time")
    if len(by_options) > 1:
        raise UserError(
            f"{', '.join(given_options(args, TRANSLATION))} ({TRANSLATION}) and {', '.join(given_options(args, CAPTIONING))} ({CAPTIONING}) do not go together: "
            "this joint checkpoint scores one task at a time; give the options of one"
        )
    task = asked or (by_options[0] if by_options else None)
    if task is None:
        raise UserError("this joint checkpoint captions and translates: add --task caption or --task translate")
    return task


def check_paths(args: argparse.Namespace) -> None:
    """Inputs that cannot be read and outputs that cannot be written: a clear error before any data is read
    or the model is built (after the checks that say which options go with the checkpoint's task)."""
    for option, path in (("--source", args.source), ("--reference", args.reference), ("--captions", args.captions)):
        if path:
            check_input_file(path, option)
    if args.images and not Path(args.images).is_dir():
        raise UserError(f"--images {args.images}: {'is a file, not a folder' if Path(args.images).exists() else 'folder not found'}")
    if args.output:
        check_output_file(args.output, "--output")
        read = [("the checkpoint", args.checkpoint), ("the --source file", args.source), ("the --reference file", args.reference)]
        refuse_replacing_inputs([args.output], "--output", [(what, path) for what, path in read if path])
    if args.cache:
        check_output_folder(args.cache, "--cache", writable=False)  # a full cache may be read-only


def evaluate_translation(args: argparse.Namespace, checkpoint) -> dict:
    if wrong := given_options(args, CAPTIONING):
        raise UserError(other_task_options(wrong, CAPTIONING, TRANSLATION))
    if bool(args.source) != bool(args.reference):
        raise UserError("--source and --reference go together")
    if bool(args.split) == bool(args.source):
        raise UserError("give either --split NAME or --source FILE --reference FILE")
    check_paths(args)
    config = checkpoint.config
    if args.split:
        data = args.data or config["data"].get("text_path") or config["data"]["path"]  # a joint model's text is in text_path
        languages = (config["data"]["source_lang"], config["data"]["target_lang"])
        if args.output:  # the split's own files, which the translations must not replace
            split_files = [Path(data) / "dataset.json", *(Path(data) / f"{args.split}.{language}" for language in languages)]
            refuse_replacing_inputs([args.output], "--output", [(f"a file of the dataset ({path.name})", path) for path in split_files])
        pairs = read_parallel(data, args.split, *languages)
        what = {"data": data, "split": args.split}
    else:
        sources, references = list(input_lines(args.source, "--source")), list(input_lines(args.reference, "--reference"))
        if len(sources) != len(references):
            raise UserError(f"{args.source} has {len(sources)} lines but {args.reference} has {len(references)}")
        pairs = list(zip(sources, references))
        what = {"source": args.source, "reference": args.reference}
    if args.limit > 0:
        pairs = pairs[: args.limit]
    translator = Translator.from_checkpoint(checkpoint, device=args.device, precision=args.precision)
    warn_slow_decoding(translator)
    warn_overlong_sources(translator, (source for source, _ in pairs))  # scored all the same, as attnkit translate translates them
    scores = translator.evaluate(pairs, beam_size=args.beam, batch_size=args.batch_size, hypotheses_file=args.output, replace_unknown=args.replace_unk)
    return {**what, "precision": PRECISION_NAMES[translator.precision], **scores}


def evaluate_captioning(args: argparse.Namespace, checkpoint, ensemble: Sequence[str] = ()) -> dict:
    """``ensemble``: further checkpoints that decode with ``checkpoint`` (:meth:`Captioner.from_checkpoints`)."""
    if wrong := given_options(args, TRANSLATION):
        raise UserError(other_task_options(wrong, TRANSLATION, CAPTIONING))
    if bool(args.images) != bool(args.captions):
        raise UserError("--images and --captions go together")
    if bool(args.split) == bool(args.images):
        raise UserError("give either --split NAME or --images DIR --captions FILE")
    check_paths(args)
    if args.split:
        data = args.data or checkpoint.config["data"]["path"]
        items, root = read_caption_split(data, args.split), image_root(data)
        what = {"data": data, "split": args.split}
    else:
        root = Path(args.images)  # a folder: checked by check_paths
        items = [CaptionedImage(image, tuple(texts)) for image, texts in read_flickr8k_captions(args.captions).items()]
        what = {"image_folder": args.images, "captions": args.captions}  # "images" is the scores' count of them
    if args.limit > 0:
        items = items[: args.limit]
    captioner = Captioner.from_checkpoints([checkpoint, *ensemble], device=args.device, cache_dir=args.cache, precision=args.precision)
    warn_slow_decoding(captioner)
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731  (stdout is the JSON)
    return {**what, "precision": PRECISION_NAMES[captioner.precision], **captioner.evaluate(items, root, beam_size=args.beam, batch_size=args.batch_size, log=log)}

