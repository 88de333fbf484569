"""`attnkit serve` as a script (`python tasks/serve.py --help`); the command is attnkit/commands/serve.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["serve", *sys.argv[1:]])
