"""`attnkit evaluate` as a script (`python tasks/evaluate.py --help`); the command is attnkit/commands/evaluate.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["evaluate", *sys.argv[1:]])
