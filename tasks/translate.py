"""`attnkit translate` as a script (`python tasks/translate.py --help`); the command is attnkit/commands/translate.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["translate", *sys.argv[1:]])
