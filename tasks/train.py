"""`attnkit train` as a script (`python tasks/train.py --help`); the command is attnkit/commands/train.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["train", *sys.argv[1:]])
