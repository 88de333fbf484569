"""Errors a user can cause (bad input, bad config, missing files).

Entry points in ``tasks/`` turn a :class:`UserError` into one line on stderr and
a non-zero exit code; anything else is a bug and keeps its traceback. Two
conditions of the machine, not of the code, are reported the same way: a full
disk (or a write refused: permissions, read-only file system), an allocation that
fails (memory), and a closed stdout (``... | head``), which ends the run quietly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import signal
import sys
from collections.abc import Callable, Sequence

BROKEN_PIPE_EXIT = 141  # what a shell reports for a process ended by SIGPIPE (128 + 13)

# OSErrors that say what the machine lets us do, never what the code got wrong; the hint says what to do.
ENVIRONMENT_ERRORS = {
    errno.ENOSPC: "free some space or write elsewhere",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free some space or write elsewhere",  # disk quota exceeded (POSIX only)
    errno.EACCES: "check the permissions or write elsewhere",
    errno.EPERM: "check the permissions or write elsewhere",  # e.g. replacing another user's file in a sticky folder (/tmp)
    errno.EROFS: "write elsewhere",
    errno.ENAMETOOLONG: "give a shorter name",  # a path component over the file system's 255 bytes
}


class UserError(Exception):
    """Something the user can fix: the message says what and how."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty), for a
    one-line error that quotes a library's own words."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class Stopped(KeyboardInterrupt):
    """A stop signal met as Ctrl-C is: SIGTERM (``kill``, ``timeout``, a service manager, torchrun stopping a job)
    or SIGHUP (the terminal closed). Raised where the program is, so every ``finally`` runs: a write under way
    removes its temporary file, a run folder's lock is let go. Only SIGKILL still ends a command with no say."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Stopped` (the console script calls it once, in the main thread). A signal
    the caller ignores stays ignored: ``nohup attnkit train ...`` must outlive its terminal."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    for name in ("SIGTERM", "SIGHUP"):  # SIGHUP: POSIX only
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, stop)


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a task's ``main``; map a :class:`UserError` (or a full disk, ...) to ``error: ...`` and exit code 2."""
    try:
        code = int(main(argv) or 0)
        sys.stdout.flush()  # so a closed pipe shows here, not in the interpreter's flush at exit
        return code
    except UserError as error:
        _say_error(unwrapped_message(error))
        return 2
    except BrokenPipeError:
        if not _stdout_closed():  # another pipe (a worker, a subprocess): that is a bug to see
            raise
        _discard_stdout()
        return BROKEN_PIPE_EXIT
    except OSError as error:
        if error.errno not in ENVIRONMENT_ERRORS:
            raise
        _say_error(describe_os_error(error))
        return 2
    except (MemoryError, RuntimeError) as error:
        if not out_of_memory(error):
            raise
        _say_error(f"not enough memory ({first_line(error)[:200]}); make the model's sizes, the batch or the beam smaller")
        return 2
    except KeyboardInterrupt as interruption:
        signum = getattr(interruption, "signum", signal.SIGINT)
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print("interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum  # what a shell reports for a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM


def _say_error(text: str) -> None:
    """``error: text`` on standard error, in one write (the ranks of a torchrun job share the terminal, and two
    prints each could run together on one line). A rank other than 0 says which it is: each rank meets an error in
    the data or the config itself, and a rank's own (its GPU) is its alone."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    who = f" (rank {rank} of {world})" if world not in ("", "1") and rank not in ("", "0") else ""
    sys.stderr.write(f"error{who}: {text}\n")
    sys.stderr.flush()


# How torch's DataLoader re-raises an error of a worker process: the same type, its message the worker's traceback.
_WORKER_ERROR = re.compile(r"Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback \(most recent call last\):\n")
_QUALIFIED_NAME = re.compile(r"[A-Za-z_][\w.]*")


def unwrapped_message(error: BaseException) -> str:
    """An error's message, as it was raised: for a UserError raised in a DataLoader worker (an unreadable photo
    while training), the original one line from the end of the worker's traceback that torch puts in its place."""
    text = str(error)
    if not _WORKER_ERROR.match(text):
        return text
    last = text.rstrip().splitlines()[-1]  # "attnkit.data.images.ImageError: photo.jpg: file not found"
    name, separator, message = last.partition(": ")
    return message if separator and _QUALIFIED_NAME.fullmatch(name) else last


def out_of_memory(error: BaseException) -> bool:
    """Did an allocation fail: Python's MemoryError, torch's OutOfMemoryError (CUDA), or its CPU allocator's error?"""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error)


def describe_os_error(error: OSError) -> str:
    """``No space left on device: runs/x/last.pt (free some space or write elsewhere)``: one line."""
    paths = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    hint = ENVIRONMENT_ERRORS.get(error.errno)
    return (error.strerror or str(error)) + (f": {paths}" if paths else "") + (f" ({hint})" if hint else "")


def _stdout_closed() -> bool:
    """Is stdout a pipe whose reader has gone? Where that cannot be told, assume so, as the Python docs do."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no stdout, or a replaced one without a descriptor
        return True
    if not hasattr(select, "poll"):  # Windows
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _discard_stdout() -> None:
    """Point stdout at devnull: the output still buffered would fail again when Python flushes it at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    finally:
        os.close(devnull)
