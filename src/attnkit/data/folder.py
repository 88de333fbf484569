"""What every prepared dataset folder has: a ``dataset.json`` that says its task, splits and origin."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from attnkit.errors import UserError
from attnkit.files import read_text_file, write_json_atomic

INFO_FILE = "dataset.json"


def begin_dataset(folder: Path) -> None:
    """Before a writer writes a folder's first file: the folder made, and an earlier dataset.json removed. A write cut
    short (Ctrl-C, a full disk) then leaves a folder no reader takes, never one whose new files sit beside the old
    ones' under the old dataset.json (a new train.fr beside the old train.en would pair the wrong sentences)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / INFO_FILE).unlink(missing_ok=True)


def write_dataset_info(folder: Path, info: Mapping[str, object]) -> None:
    """Written last by the writers, so a folder with a dataset.json is complete."""
    write_json_atomic(folder / INFO_FILE, info)


def read_dataset_info(folder: str | Path, task: str | None = None) -> dict:
    """The folder's dataset.json; with ``task``, an error unless the folder holds that kind of dataset."""
    folder = Path(folder)
    if not folder.is_dir():
        where = "" if folder.is_absolute() else f", relative to the current folder {Path.cwd()} (recipes name their data relative to the project root: run from there)"
        raise UserError(f"data folder not found: {folder}{where} (prepare one with data_scripts/, see docs/data.md)")
    info_path = folder / INFO_FILE
    if not info_path.is_file():
        raise UserError(f"{folder} is not a prepared dataset: it has no {INFO_FILE}")
    try:
        info = json.loads(read_text_file(info_path))
    except json.JSONDecodeError as error:
        raise UserError(f"{info_path} is not valid JSON: {error}") from None
    if not isinstance(info, dict):
        raise UserError(f"{info_path} must hold a JSON object (task, splits ...), not {type(info).__name__}")
    if task is not None and info.get("task") != task:
        raise UserError(f"{folder} holds a '{info.get('task')}' dataset, not a {task} dataset")
    return info


def check_split_listed(folder: Path, info: Mapping[str, object], split: str) -> None:
    """An error unless the folder's dataset.json lists ``split`` (where it lists splits): a split file it does not
    list is left over from an earlier preparation of the folder, not part of this one."""
    listed = info.get("splits")
    if isinstance(listed, Mapping) and split not in listed:
        raise UserError(f"{folder} has no split '{split}': its {INFO_FILE} lists {', '.join(map(str, listed)) or 'none'}")
