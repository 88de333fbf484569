"""`attnkit average` as a script (`python tasks/average.py --help`); the command is attnkit/commands/average.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["average", *sys.argv[1:]])
