"""The ``attnkit`` command: one subcommand per use of the package.

    attnkit --help                       # the commands, one line each
    attnkit train --config tasks/configs/multi30k_de_en.yaml
    attnkit translate --checkpoint runs/multi30k_de_en/best.pt "ein hund rennt ."
    attnkit caption --help               # each command's own options (also: attnkit help caption)

Each subcommand is the module of the same name here (its ``get_args_parser`` and ``main``);
``tasks/NAME.py`` runs the same module, so ``python tasks/train.py`` and ``torchrun ... tasks/train.py``
keep working. A command's module is imported only when it runs: ``attnkit --help`` starts at once.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

# name -> what it does (the line `attnkit --help` shows); the module attnkit.commands.<name> runs it
COMMANDS = {
    "train": "train a model from a recipe (tasks/configs/NAME.yaml), or resume a run from its last.pt",
    "translate": "translate sentences with a checkpoint (arguments, a file or standard input)",
    "caption": "caption images with a checkpoint; per-word attention overlays",
    "compare": "a photo's and a sentence's attention and importance side by side: figures, report.html, statistics",
    "evaluate": "score a checkpoint on a split: BLEU and chrF, or BLEU-4, CIDEr-D and METEOR",
    "average": "average the weights of a model's last checkpoints into one",
    "demo": "train on the embedded data, translate, caption generated scenes and compare the two attentions",
    "serve": "a local web page to try a model: drop a photo, type a sentence, see the caption, translation and attention",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "\n".join(
        [
            "usage: attnkit COMMAND [options]     (attnkit COMMAND --help, or attnkit help COMMAND: its options)",
            "",
            "One attention decoder for translation and image captioning, and tools to compare the two attentions.",
            "",
            "commands:",
            *lines,
            "",
            "also: python -m attnkit COMMAND ..., or python tasks/COMMAND.py ... in a checkout",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``attnkit COMMAND [options]``; the exit code of the command (2 for an unknown one)."""
    from attnkit.errors import run_cli

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    name, rest = args[0], args[1:]
    if name == "help" and rest:  # `attnkit help train` is `attnkit train --help`
        return main([rest[0], "--help"])
    if name in ("-h", "--help", "help"):
        print(usage())
        return 0
    if name == "--version":
        from attnkit import __version__

        print(f"attnkit {__version__}")
        return 0
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"error: unknown command '{name}'{hint}; commands: {', '.join(COMMANDS)} (attnkit --help)", file=sys.stderr)
        return 2
    command = importlib.import_module(f"{__name__}.{name}")
    return run_cli(command.main, rest)


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script (and ``tasks/NAME.py``): exit with the command's code; a rank of a several-process
    ``attnkit train`` ends without the interpreter's teardown (:func:`attnkit.distributed.end_process`)."""
    from attnkit.errors import stop_on_signals

    stop_on_signals()  # SIGTERM and SIGHUP stop a command as Ctrl-C does: what it was writing is cleaned up
    code = main(argv)
    from attnkit.distributed import end_process

    end_process(code)
