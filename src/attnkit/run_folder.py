"""A training run's folder: which files are the run's, who may write them, and what --overwrite removes.

A run writes exactly :data:`RUN_FILES`, with ``train.keep_epochs`` the epoch checkpoints
``epoch-<k>.pt`` (and the temporary files of their atomic writes), and with ``train.tensorboard`` the event
files in ``tensorboard/``; everything else in the folder belongs to the user and is never touched. One process at a
time writes a run folder: :meth:`RunFolder.claim` takes an exclusive lock (``flock`` on
``.attnkit.lock``, released by the kernel when the process ends, even on SIGKILL; forked loader workers do not
keep it), so a second training into the same folder gets a clear error instead of mixing two runs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import torch

from attnkit.errors import UserError
from attnkit.files import json_text, temporary_files, write_text_atomic
from attnkit.watch import EVENT_FILES, FOLDER as TENSORBOARD

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: runs are not locked
    fcntl = None

CHECKPOINTS = ("best.pt", "last.pt")
RUN_FILES = (*CHECKPOINTS, "config.yaml", "log.jsonl")
LOCK = ".attnkit.lock"
# flock's answers on a file system that takes no locks (NFS mounted nolock, Lustre without flock): the run goes on unlocked
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
EPOCH_CHECKPOINT = re.compile(r"epoch-(\d+)\.pt")  # train.keep_epochs: the weights after epoch <k>
EPOCH_CHECKPOINTS = "epoch-*.pt"  # the glob that finds them (and their temporaries)


_HELD_LOCKS: set[int] = set()  # descriptors of the locks this process holds


def _leave_locks_to_the_parent() -> None:
    """In a forked child (a DataLoader worker): its copies of the parent's lock descriptors are pointed at /dev/null.
    A flock belongs to the open file, which a fork shares, so the child's copy kept the folder locked after the
    parent's death until the child noticed it (a few seconds for loader workers); the child never writes the
    folder. dup2 rather than close, so that the child's file objects close a descriptor of their own."""
    if not _HELD_LOCKS:
        return
    nowhere = os.open(os.devnull, os.O_RDWR)
    for descriptor in _HELD_LOCKS:
        os.dup2(nowhere, descriptor)
    os.close(nowhere)
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_locks_to_the_parent)


def epoch_checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch}.pt"


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = None

    def holds_run(self) -> bool:
        """A run that can go on here: its last.pt."""
        return (self.path / "last.pt").exists()

    def checkpoint_files(self) -> list[Path]:
        """Any run's checkpoints here (best.pt, last.pt, epoch-<k>.pt): a folder whose last.pt was deleted still holds
        a run's best.pt, which a new run's first epoch would write over."""
        return [*(self.path / name for name in CHECKPOINTS if (self.path / name).exists()), *self.epoch_checkpoints().values()]

    def holds_checkpoints(self) -> bool:
        return bool(self.checkpoint_files())

    def standing_progress(self, name: str = "last.pt") -> dict:
        """The progress saved in the folder's last.pt (or ``name``: epoch, run_id, ...), read without loading the weights."""
        return self.standing_run(name)[1]

    def standing_run(self, name: str = "last.pt") -> tuple[dict, dict]:
        """The config and the progress saved in the folder's last.pt (or ``name``; each {} where missing), read without loading the weights."""
        path = self.path / name
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # the weights stay on disk
        except Exception:  # whatever a damaged file raises: the user decides what to do with it
            raise UserError(f"{path} cannot be read (damaged or not a checkpoint); pass --overwrite to replace it") from None
        config = payload.get("config") if isinstance(payload, dict) else None
        training = payload.get("training") if isinstance(payload, dict) else None
        progress = training.get("progress") if isinstance(training, dict) else None
        return (config if isinstance(config, dict) else {}), (progress if isinstance(progress, dict) else {})

    def owns(self, path: Path) -> bool:
        """Is ``path`` one of the files of the run in this folder (what --overwrite would replace)?"""
        return path.parent == self.path and (path.name in RUN_FILES or EPOCH_CHECKPOINT.fullmatch(path.name) is not None) and self.holds_run()

    def refuse_non_files(self) -> None:
        """A folder (or anything but a file) where one of the run's files goes: every write of it would fail."""
        for path in (self.path / name for name in RUN_FILES):
            if path.exists() and not path.is_file():
                raise UserError(f"output_dir {self.path}: {path} must be a file, and it is not; move it away")

    def refuse_existing(self, overwrite: bool) -> None:
        """The early check of a new run: a folder that holds a run, or a run's checkpoints, is kept unless ``overwrite``."""
        if self.holds_run() and not overwrite:
            raise UserError(
                f"{self.path} already holds a run; continue it with --resume {self.path / 'last.pt'}, "
                "replace it with --overwrite, or choose another output_dir"
            )
        if (kept := self.checkpoint_files()) and not overwrite:
            names = ", ".join(sorted(path.name for path in kept))
            raise UserError(f"{self.path} holds an earlier run's checkpoints ({names}); replace them with --overwrite, or choose another output_dir")
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"output_dir {self.path} is a file, not a folder")

    @contextlib.contextmanager
    def claim(self) -> Iterator["RunFolder"]:
        """Hold the folder's lock for the block; a folder another process is training into is an error."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise UserError(f"output_dir {self.path} is a file, not a folder") from None
        except OSError as error:
            raise UserError(f"cannot create the run folder {self.path}: {error.strerror}") from None
        if fcntl is None:
            yield self
            return
        handle = open(self.path / LOCK, "a+", encoding="utf-8")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno in NO_LOCKS:  # as where fcntl is missing, but said: leftover temporaries stay (one may be another run's)
                    print(
                        f"note: the file system of {self.path} takes no locks ({error.strerror}): nothing keeps a second "
                        "training from writing this folder at the same time",
                        file=sys.stderr,
                    )
                    yield self
                    return
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise UserError(f"{self.path} is being written by another training ({holder}); wait for it to end or choose another output_dir") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
            self._lock = handle
            _HELD_LOCKS.add(handle.fileno())
            self._remove_temporaries()
            yield self
        finally:
            self._lock = None
            _HELD_LOCKS.discard(handle.fileno())
            handle.close()  # closing releases the lock

    def epoch_checkpoints(self) -> dict[int, Path]:
        """The epoch checkpoints in the folder, by epoch."""
        found = (EPOCH_CHECKPOINT.fullmatch(path.name) for path in self.path.glob(EPOCH_CHECKPOINTS)) if self.path.is_dir() else ()
        return {int(match.group(1)): self.path / match.group(0) for match in found if match}

    def keep_last_epochs(self, count: int) -> None:
        """Remove the epoch checkpoints older than the newest ``count``."""
        epochs = sorted(self.epoch_checkpoints().items())
        for _, path in epochs[: max(len(epochs) - count, 0)]:
            path.unlink(missing_ok=True)

    def remove_run_files(self, keep: Collection[str] = (), rewound_to: int | None = None) -> list[Path]:
        """``--overwrite``: remove the run's own files (never anything else in the folder), but those named in ``keep``
        (already rewritten for the new run); returns what was removed. ``rewound_to``: the folder's own run goes on
        from that epoch again, so its epoch checkpoints up to it stay (the same weights, e.g. for ``attnkit average``),
        and so do its TensorBoard events (the writer drops those of the epochs redone: ``purge_step``)."""
        removed = []
        events = sorted((self.path / TENSORBOARD).glob(EVENT_FILES)) if rewound_to is None else []
        epochs = [path for epoch, path in self.epoch_checkpoints().items() if rewound_to is None or epoch > rewound_to]
        for path in [*(self.path / name for name in RUN_FILES), *epochs, *events]:
            if path.is_file() and path.name not in keep:
                path.unlink()
                removed.append(path)
        with contextlib.suppress(OSError):  # the events' folder goes too when nothing of the user's is left in it
            (self.path / TENSORBOARD).rmdir()
        return removed

    def _remove_temporaries(self) -> None:
        """Temporary files of writes that a killed process left behind (only the lock holder may remove them)."""
        for name in (*RUN_FILES, EPOCH_CHECKPOINTS):
            for leftover in temporary_files(self.path / name):
                leftover.unlink(missing_ok=True)

    def write_log(self, records: list[dict]) -> None:
        """log.jsonl as one JSON line per epoch, replaced whole (it is rebuilt from the checkpoint's history)."""
        write_text_atomic(self.path / "log.jsonl", "".join(json_text(record) + "\n" for record in records))
