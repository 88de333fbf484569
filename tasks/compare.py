"""`attnkit compare` as a script (`python tasks/compare.py --help`); the command is attnkit/commands/compare.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["compare", *sys.argv[1:]])
