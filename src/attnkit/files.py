"""Atomic file writes: a file appears whole or not at all, and a failed write keeps the old one.

The bytes reach the disk before the rename (``fsync`` of the file) and the rename reaches
it after (``fsync`` of the folder), so even a power loss leaves the old file or the new
one, never an empty or partial one.

Every JSON the package writes goes through :func:`json_text` (or :func:`write_json_atomic`): strict JSON
(RFC 8259), which ``jq`` and ``JSON.parse`` read, with NaN and infinities written as null.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import secrets
from collections.abc import Collection, Iterator
from functools import lru_cache
from pathlib import Path

from attnkit.errors import UserError


@contextlib.contextmanager
def atomic_path(path: str | Path, durable: bool = True) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    ``durable=False`` skips the fsyncs, for files that are cheap to remake (a cache entry)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(path)
    try:
        yield temporary
        if durable:
            sync_to_disk(temporary)
        os.replace(temporary, path)
        if durable:
            sync_to_disk(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def temporary_name(path: Path) -> Path:
    """A fresh hidden name beside ``path`` for this process to write it under before the rename that puts it there."""
    return _temporary_name(path, f"{os.getpid()}-{secrets.token_hex(4)}")  # the pid alone repeats across containers sharing a folder


def _temporary_name(path: Path, writer: str) -> Path:
    """Where process ``writer`` writes ``path`` before the rename (keeps the suffix: savefig picks the format by it)."""
    return path.with_name(f".{path.stem}.{writer}.tmp{path.suffix}")


def temporary_files(path: str | Path, pid: int | None = None) -> list[Path]:
    """Temporary files of atomic writes of ``path`` (by process ``pid`` only, when given): writes in progress,
    or leftovers of writes a killed process never finished."""
    path = Path(path)
    return sorted(path.parent.glob(_temporary_name(path, "*" if pid is None else f"{pid}-*").name))


_TEMPORARY_NAME = re.compile(r"\.(?P<stem>.+)\.\d+-[0-9a-f]{8}\.tmp(?P<suffix>.*)")  # what temporary_name writes


def temporaries_in(folder: str | Path, names: Collection[str]) -> list[Path]:
    """Temporary files in ``folder`` of atomic writes of the files ``names`` (names in the folder), by any process:
    what :func:`temporary_files` lists for each, found in one listing of the folder (a folder of thousands of
    images would be listed once per image)."""
    found = []
    for entry in Path(folder).iterdir():
        match = _TEMPORARY_NAME.fullmatch(entry.name)
        if match and match["stem"] + match["suffix"] in names:
            found.append(entry)
    return sorted(found)


def sync_to_disk(path: str | Path) -> None:
    """Flush ``path`` to the disk: a file's bytes, or a folder's renames and removals; whoever wrote it need not
    have kept it open."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_torch_atomic(path: str | Path, obj, durable: bool = True) -> Path:
    """``torch.save(obj)`` to ``path`` atomically. Serialised in memory (one copy), then written through
    Python's own file: a full disk is then an OSError with its errno (ENOSPC), which the scripts report
    in one line (torch.save's own writer would turn it into a bare RuntimeError, "unexpected pos")."""
    import torch  # here, so that importing attnkit.files stays light

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(path, durable) as temporary, open(temporary, "wb") as handle:
        handle.write(buffer.getbuffer())
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path)


def save_image_atomic(image, path: str | Path) -> Path:
    """A PIL image to ``path`` atomically, in the format its suffix names: a half-written PNG never replaces a good one."""
    with atomic_path(path) as temporary:
        image.save(temporary)
    return Path(path)


def json_text(obj, indent: int | None = None) -> str:
    """``obj`` as strict JSON text: NaN and infinities become null (Python's ``json`` would write bare ``NaN``,
    which no other reader accepts), and ``allow_nan=False`` makes any non-finite number left an error here
    rather than a file that programs cannot read. Text stays as it is (UTF-8, not ``\\u`` escapes), but for
    bytes that are not UTF-8 (a file name's, which Python carries as lone surrogates): they are written as
    ``\\xff``, so the output is UTF-8 whatever the names."""
    return json.dumps(_finite(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def _finite(obj):
    """``obj`` with every non-finite float replaced by None and all text made UTF-8 (:func:`utf8_text`), mappings,
    lists and tuples walked through."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return utf8_text(obj)
    if isinstance(obj, dict):
        return {_finite(key): _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def utf8_text(text: str) -> str:
    """``text``, with any byte that was not UTF-8 (a lone surrogate, as Python decodes file names and arguments) as
    ``\\xNN``: text that encodes as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")  # the bytes the name was made of
        except UnicodeEncodeError:  # a surrogate no byte decodes to
            raw = text.encode("utf-8", "backslashreplace")
        return raw.decode("utf-8", "backslashreplace")


def write_json_atomic(path: str | Path, obj, indent: int | None = 2) -> Path:
    """``obj`` as strict JSON (:func:`json_text`) to ``path`` atomically, ending in a newline."""
    return write_text_atomic(path, json_text(obj, indent) + "\n")


@lru_cache(maxsize=8)
def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (remembered per path for the process: weights files do not change under a run)."""
    return content_digest(path)


def content_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read now."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def unreadable(what: str, error: OSError) -> UserError:
    """The one-line error for a file that could not be opened for reading (``what`` names it)."""
    if isinstance(error, FileNotFoundError):
        return UserError(f"{what}: file not found")
    if isinstance(error, IsADirectoryError):
        return UserError(f"{what}: is a folder, not a file")
    if isinstance(error, PermissionError):
        return UserError(f"{what}: permission denied (cannot read it)")
    return UserError(f"{what}: cannot read it ({error.strerror or error})")


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's contents, its line ends as they are and a leading byte-order mark left out; one clear
    UserError when it is missing, a folder, unreadable or not UTF-8.

    Read as bytes, not with ``Path.read_text``: its universal newlines made a lone "\r" inside a sentence a line
    break, which pulled two line-aligned files out of step (a split scored one reference off from there on).
    """
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise unreadable(str(path), error) from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
