"""What the dataset preparation scripts in ``data_scripts/`` share: where the raw data lies, one-line text."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_root(project_root: Path) -> Path:
    """``$ATTNKIT_DATA``, else ``../shared/data`` beside ``project_root`` (the checkout the script runs from)."""
    return Path(os.environ.get("ATTNKIT_DATA") or project_root.parent / "shared" / "data")


def clean(text: str) -> str:
    """One line of text: anything ``str.splitlines`` would break on becomes a space, then strip."""
    return " ".join(text.splitlines()).strip()
