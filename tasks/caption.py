"""`attnkit caption` as a script (`python tasks/caption.py --help`); the command is attnkit/commands/caption.py."""

import sys

from attnkit.commands import run

if __name__ == "__main__":
    run(["caption", *sys.argv[1:]])
