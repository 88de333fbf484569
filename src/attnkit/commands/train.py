"""Train a model from a recipe.

    attnkit train --config tasks/configs/multi30k_de_en.yaml [--set train.epochs=10 ...]
    attnkit train --config tasks/configs/flickr8k.yaml
    attnkit train --config tasks/configs/scenes_multitask.yaml     # one decoder, both tasks
    attnkit train --config tasks/configs/tiny_pretrain.yaml        # masked-LM pre-training of a Transformer text encoder
    attnkit train --resume runs/multi30k_de_en/last.pt [--set train.epochs=20]

Checkpoints (best.pt, last.pt), the resolved config.yaml and log.jsonl (one
JSON line per epoch) go to the run folder, ``runs/<name>`` unless
``output_dir`` is set; --resume goes on in the checkpoint's folder. Several
processes (GPUs or CPU ranks): ``torchrun --nproc_per_node N -m attnkit train ...`` (or ``tasks/train.py``).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from pathlib import Path

from attnkit.captioning import TASK as CAPTIONING, train_captioning
from attnkit.checkpoint import load_checkpoint
from attnkit.config import ExperimentConfig, apply_overrides, from_dict, read_recipe, recipe_keys, unread_given
from attnkit.distributed import Distributed
from attnkit.errors import UserError
from attnkit.multitask import TASK as MULTITASK, train_multitask
from attnkit.pretraining import TASK as PRETRAIN, train_pretraining
from attnkit.translation import TASK as TRANSLATION, train_translation


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="recipe YAML (tasks/configs/NAME.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. decoder.hidden_size=512")
    parser.add_argument("--resume", metavar="CHECKPOINT", help="continue the run saved in this last.pt, in its folder (its config, plus --set overrides)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the run in the output folder (its checkpoints, config.yaml and log.jsonl; other files stay)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (e.g. in logs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    resume, set_by_recipe = None, []
    if args.resume:
        if args.config:
            raise UserError("give either --config (a new run) or --resume (its saved config is used), not both")
        resume = load_checkpoint(args.resume)
        # A resumed run writes beside the checkpoint it continues (a copied run folder goes on in the copy),
        # unless --set output_dir says otherwise.
        values = {**copy.deepcopy(resume.config), "output_dir": str(Path(args.resume).parent)}
    elif args.config:
        values = read_recipe(args.config)  # read once: the keys it sets are told from the same text the run is built from
        set_by_recipe = recipe_keys(values)  # before the overrides go in
    else:
        raise UserError("give --config tasks/configs/NAME.yaml for a new run or --resume CHECKPOINT to continue one")
    config = from_dict(ExperimentConfig, apply_overrides(values, args.overrides))
    given = [*set_by_recipe, *(override.partition("=")[0].strip() for override in args.overrides)]
    if Distributed.from_environment().is_main:
        for key, why in unread_given(config, given).items():  # set, and without effect: say so rather than train as if it had one
            print(f"note: {key} is not read by this model ({why}); it changes nothing")
    trainers = {TRANSLATION: train_translation, CAPTIONING: train_captioning, MULTITASK: train_multitask, PRETRAIN: train_pretraining}
    if config.task not in trainers:
        raise UserError(f"unknown task '{config.task}'; available: {', '.join(trainers)}")
    progress = trainers[config.task](config, resume=resume, overwrite=args.overwrite, progress_bar=not args.no_progress)
    if Distributed.from_environment().is_main:
        print(f"done after {progress.epoch} epochs; best validation score {progress.best_score:.2f}; checkpoints in {config.run_dir}")
    return 0

