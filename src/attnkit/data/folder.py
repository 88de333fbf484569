"""What every prepared dataset folder has: a ``dataset.json`` that says its task, splits and origin."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from attnkit.errors import UserError
from attnkit.files import write_json_atomic

INFO_FILE = "dataset.json"


def write_dataset_info(folder: Path, info: Mapping[str, object]) -> None:
    """Written last by the writers, so a folder with a dataset.json is complete."""
    write_json_atomic(folder / INFO_FILE, info)


def read_dataset_info(folder: str | Path, task: str | None = None) -> dict:
    """The folder's dataset.json; with ``task``, an error unless the folder holds that kind of dataset."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"data folder not found: {folder} (prepare one with data_scripts/, see docs/data.md)")
    info_path = folder / INFO_FILE
    if not info_path.is_file():
        raise UserError(f"{folder} is not a prepared dataset: it has no {INFO_FILE}")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"{info_path} is not valid JSON: {error}") from None
    if task is not None and info.get("task") != task:
        raise UserError(f"{folder} holds a '{info.get('task')}' dataset, not a {task} dataset")
    return info
