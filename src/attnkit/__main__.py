"""``python -m attnkit COMMAND ...``: the same as the ``attnkit`` command."""

from attnkit.commands import run

run()
