"""Errors a user can cause (bad input, bad config, missing files).

Entry points in ``tasks/`` turn a :class:`UserError` into one line on stderr and
a non-zero exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


class UserError(Exception):
    """Something the user can fix: the message says what and how."""


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a task's ``main`` and map a :class:`UserError` to ``error: ...`` and exit code 2."""
    try:
        return int(main(argv) or 0)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
