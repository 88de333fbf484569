"""`attnkit demo` as a script (`python tasks/demo.py --help`); the command is attnkit/commands/demo.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["demo", *sys.argv[1:]])
