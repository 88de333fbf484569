"""What every prepared dataset folder has: a ``dataset.json`` that says its task, splits and origin."""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path

from attnkit.errors import UserError
from attnkit.files import read_text_file, sync_to_disk, temporaries_in, temporary_name, write_json_atomic

INFO_FILE = "dataset.json"


class DatasetWrite:
    """The files of one or more dataset folders, written under hidden names beside the old ones and put in place
    together when all are written (:func:`writing_datasets`).

    A preparation cut short (Ctrl-C, a full disk, an error) leaves the folders as they were, the old dataset whole
    and readable. Only the swap at the end (the old dataset.json files removed, one rename per file, the new ones
    written) holds a folder that no reader takes, never one whose new files sit beside the old ones under the old
    dataset.json (a new train.fr beside the old train.en would pair the wrong sentences). A preparation killed
    outright (SIGKILL) leaves its hidden files; the next one of the same folder removes them after its swap."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []  # (hidden name, written whole; the name it takes at the swap)
        self._infos: list[tuple[Path, Mapping[str, object]]] = []

    def write_text(self, final: str | Path, text: str) -> None:
        """``text`` (UTF-8) for the file that becomes ``final`` at the swap."""
        with self._staging(final) as staged:
            staged.write_text(text, encoding="utf-8")

    def save_image(self, final: str | Path, image) -> None:
        """A PIL image for the file ``final``, in the format its suffix names (the hidden name keeps the suffix)."""
        with self._staging(final) as staged:
            image.save(staged)

    def info(self, folder: str | Path, info: Mapping[str, object]) -> None:
        """``folder``'s dataset.json, written at the swap after every file; folders nested in another are given first."""
        self._infos.append((Path(folder), dict(info)))

    @contextlib.contextmanager
    def _staging(self, final: str | Path) -> Iterator[Path]:
        final = Path(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = temporary_name(final)
        try:
            yield staged
            sync_to_disk(staged)  # its bytes on the disk before any rename can make it the dataset's
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        self._staged.append((staged, final))  # only a file written whole joins the swap

    def _swap(self) -> None:
        for folder, _ in reversed(self._infos):  # the outermost first: none of them is read while its files change
            if (folder / INFO_FILE).exists():
                (folder / INFO_FILE).unlink()
                sync_to_disk(folder)  # the old dataset.json gone on the disk before any new file takes its name
        written = defaultdict(set)
        for staged, final in self._staged:
            os.replace(staged, final)
            written[final.parent].add(final.name)
        for folder in written:
            sync_to_disk(folder)
        for folder, info in self._infos:
            write_dataset_info(folder, info)
            written[folder].add(INFO_FILE)
        for folder, names in written.items():  # what a killed preparation left of these files; best effort
            with contextlib.suppress(OSError):
                for leftover in temporaries_in(folder, names):
                    leftover.unlink(missing_ok=True)
        self._staged.clear()  # all in place: nothing left for _discard to remove

    def _discard(self) -> None:
        for staged, _ in self._staged:
            staged.unlink(missing_ok=True)


@contextlib.contextmanager
def writing_datasets(into: DatasetWrite | None = None) -> Iterator[DatasetWrite]:
    """A :class:`DatasetWrite` whose files are put in place when the block ends without an error, and removed when
    it ends with one. Given ``into`` (a write that a caller holds open), the files join that write instead and are
    put in place with the caller's: one swap for a folder and the datasets nested in it."""
    if into is not None:
        yield into
        return
    write = DatasetWrite()
    try:
        yield write
        write._swap()
    finally:
        write._discard()  # what a failed block or swap left staged


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
