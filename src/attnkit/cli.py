"""Pieces shared by the scripts in tasks/: option types, search options, input files read lazily with
clear errors, the warning for source sentences cut to what a translator reads, output paths checked before any
work starts, numbered output paths."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from attnkit.config import DECODING_PRECISIONS, widened_beam
from attnkit.errors import UserError
from attnkit.files import unreadable

if TYPE_CHECKING:  # attnkit.translation imports torch and the models: not for every script's option parsing
    from attnkit.captioning import Captioner
    from attnkit.translation import Translator

T = TypeVar("T")


# ---------------------------------------------------------------- option types (argparse names the option in its message)


def int_in_range(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=``: an integer >= ``minimum`` (and <= ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            wanted = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's fallback message says "invalid int value"
    return parse


positive_int = int_in_range(1)
non_negative_int = int_in_range(0)


class GivenOnce(argparse.Action):
    """``action=`` of an option that takes one value: given twice it is an error, where argparse would keep the last
    in silence (``translate --checkpoint A --checkpoint B`` translated with B alone, as if it were an ensemble)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, self.dest, self.default) is not self.default:
            raise argparse.ArgumentError(self, "given more than once: this command takes one")
        setattr(namespace, self.dest, values)


def positive_number(text: str) -> float:
    """An argparse ``type=``: a finite number greater than 0 (``inf`` and ``nan`` are refused: no limit is endless)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def seconds(text: str) -> float:
    """An argparse ``type=``: a positive number of seconds up to a year (a socket refuses a timeout past about
    3e9 seconds: each request would end in socketserver's OverflowError)."""
    value = positive_number(text)
    if value > YEAR_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {YEAR_SECONDS:,} seconds (a year), got {text}")
    return value


YEAR_SECONDS = 365 * 24 * 3600


# ---------------------------------------------------------------- search options


def add_search_arguments(parser: argparse.ArgumentParser, batch_size: int) -> None:
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size (default: the checkpoint's search.beam_size; 1 = greedy)")
    parser.add_argument("--n-best", type=positive_int, default=1, help="print this many outputs per input")
    parser.add_argument("--batch-size", type=positive_int, default=batch_size, help="inputs decoded together in one batched search")
    add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--precision``: where a command that loads checkpoints decodes, and in what."""
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one, else the CPU) | cpu | cuda | cuda:N")
    parser.add_argument(
        "--precision",
        choices=DECODING_PRECISIONS,
        default="checkpoint",
        help="autocast to decode under: checkpoint (default: its train.precision, as its validation decoded) | fp32 | bf16",
    )


def warn_slow_decoding(*decoders: "Translator | Captioner | None") -> None:
    """One line on stderr when a model decodes in a precision this machine runs far slower than fp32 (bf16 on an x86
    CPU without bf16 instructions: :func:`attnkit.distributed.slow_precision_warning`)."""
    from attnkit.distributed import slow_precision_warning

    said = {slow_precision_warning(d.device, d.precision, decoding=True) for d in decoders if d is not None}
    for warning in sorted(said - {None}):
        print(warning, file=sys.stderr)


def beam_for(args: argparse.Namespace, checkpoint_beam: int) -> int:
    """The beam size to use; a clear error for impossible --beam / --n-best / --batch-size values."""
    if args.beam is not None and args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    if args.n_best < 1:
        raise UserError(f"--n-best must be at least 1, got {args.n_best}")
    if args.beam is not None and args.n_best > args.beam:
        raise UserError(f"--n-best {args.n_best} is more than --beam {args.beam}: a beam of K keeps at most K outputs")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    return widened_beam(args.beam, checkpoint_beam, args.n_best)  # --beam is at least 1 here


# ---------------------------------------------------------------- inputs


@contextlib.contextmanager
def _searchable(what: str) -> Iterator[None]:
    """``Path.exists()`` and friends raise PermissionError when a folder on the way cannot be searched."""
    try:
        yield
    except PermissionError as error:
        raise UserError(f"{what}: permission denied ({error.filename or 'a folder on the way'})") from None


def check_input_file(path: str | Path, option: str) -> None:
    """A clear error now when ``path`` cannot be opened for reading (missing, a folder, no permission)."""
    with _searchable(f"{option} {path}"):
        _check_input_file(Path(path), f"{option} {path}")


def _check_input_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise UserError(f"{what}: is a folder, not a file")
    if path.exists() and not path.is_file():
        return  # a fifo or a device (/dev/stdin): opening it to try would take what it holds
    try:
        open(path, "rb").close()
    except OSError as error:
        raise unreadable(what, error) from None


def input_lines(path: str | Path, option: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, without line ends, read lazily.

    The file is opened now, so a missing, unreadable or folder path fails before any
    work; a line that is not UTF-8 fails when it is reached, naming the line. Lines
    end at "\\n" only (as :func:`attnkit.data.text.read_lines`): a stray \\r, \\x0b or
    \\u2028 inside a sentence does not split it.
    """
    what = f"{option} {path}"
    with _searchable(what):
        if Path(path).is_dir():  # open() of a folder fails only on some systems
            raise UserError(f"{what}: is a folder, not a file")
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise unreadable(what, error) from None
    return _closing_lines(handle, what)


def _closing_lines(handle, what: str) -> Iterator[str]:
    with handle:
        yield from _decoded_lines(handle, what)


def _decoded_lines(handle, what: str) -> Iterator[str]:
    """The lines of binary ``handle``, decoded as UTF-8 strictly (a line that is not is an error naming it)."""
    number = 0
    while True:
        try:
            raw = handle.readline()
        except OSError as error:
            raise UserError(f"{what}: cannot read it ({error.strerror or error})") from None
        if not raw:
            return
        number += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UserError(f"{what}, line {number}: not UTF-8 text ({error.reason} at byte {error.start + 1} of the line)") from None
        if number == 1 and line.startswith("\ufeff"):  # a byte-order mark is no part of the first sentence
            line = line[1:]
        yield _strip_line_end(line)


def stdin_lines() -> Iterator[str]:
    """The lines of standard input, without line ends, read lazily, as UTF-8 whatever the locale says: Python's
    own decoding of standard input lets bytes that are not UTF-8 through as lone surrogates (errors=surrogateescape
    in a UTF-8 or C locale), which broke the figures and the JSON later instead of failing here."""
    stream = sys.stdin
    if stream is None:
        raise UserError("no standard input to read sentences from; give them as arguments or with --input FILE")
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        return _decoded_lines(binary, "standard input")
    return (_strip_line_end(utf8_argument(line, "standard input")) for line in stream)  # a text stream of its own (a test's)


def utf8_argument(text: str, what: str) -> str:
    """``text`` from the command line (or another text stream), refused when it holds bytes that are not UTF-8:
    Python passes them on as lone surrogates, which a figure or a JSON file cannot hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UserError(f"{what} is not UTF-8 text (character {error.start + 1} of {len(text)}); give UTF-8 text") from None
    return text


def _strip_line_end(line: str) -> str:
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of up to ``size`` items, reading ``items`` only as far as the list being built."""
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


# ---------------------------------------------------------------- source sentences a translator reads only the start of

LISTED = 10  # sentence numbers a warning names before it says "and N more"


def warn_cut_sources(numbers: Sequence[int], translator: Translator, what: str = "sentence") -> None:
    """One warning on stderr for the source sentences ``numbers`` (from 1), longer than the tokens
    (data.max_source_length: words, or a subword model's pieces) ``translator`` reads: it reads only their first ones."""
    if not numbers:
        return
    limit, unit = translator.pipeline.max_source_length, translator.pipeline.source_unit
    listed = ", ".join(map(str, numbers[:LISTED])) + (f" and {len(numbers) - LISTED} more" if len(numbers) > LISTED else "")
    subject = f"{what} {listed} has" if len(numbers) == 1 else f"{what}s {listed} have"
    print(f"warning: {subject} more than {limit} {unit}; only the first {limit} were read", file=sys.stderr)


def warn_overlong_sources(translator: Translator, sentences: Iterable[str], what: str = "sentence") -> None:
    """:func:`warn_cut_sources` for those of ``sentences`` that ``translator`` cuts (more words than its pipeline's
    max_source_length), for a script that learns of the cut from no ``Translation.truncated``."""
    overlong = [number for number, sentence in enumerate(sentences, 1) if translator.is_cut(sentence)]
    warn_cut_sources(overlong, translator, what)


# ---------------------------------------------------------------- outputs (checked before any work starts)


def figure_suffixes() -> list[str]:
    """Suffixes matplotlib can save a figure as (``.png``, ``.pdf``, ``.svg`` ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # pgf is LaTeX code that matplotlib writes by running xelatex, which it may not find only after the decoding
    return sorted(f".{suffix}" for suffix in FigureCanvasAgg.get_supported_filetypes() if suffix != "pgf")


def _check_folder_for(path: Path, what: str, writable: bool) -> None:
    """``path`` is a folder, or can be created as one: its nearest existing ancestor is a (writable) folder."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a link to a folder not there (an unmounted drive): mkdir would fail after the work
            raise UserError(f"{what}: {existing} is a link to {os.readlink(existing)}, which does not exist")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{what}: {existing} is a file, not a folder")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what}: no permission to write in {existing}")


def check_output_file(path: str | Path, option: str, figure: bool = False) -> None:
    """A clear error now when ``path`` cannot be written as a file: a folder, a device or fifo, inside a file,
    no permission, or (``figure``) a suffix matplotlib cannot save."""
    with _searchable(f"{option} {path}"):
        _check_output_file(Path(path), f"{option} {path}", figure)


def _check_output_file(path: Path, what: str, figure: bool) -> None:
    if path.is_dir():
        example = path / ("attention.png" if figure else "output.txt")
        raise UserError(f"{what}: is a folder; give a file name (e.g. {example})")
    if path.exists() and not path.is_file():
        raise UserError(f"{what}: exists and is not a regular file")
    if figure:
        suffixes = figure_suffixes()
        if path.suffix.lower() not in suffixes:
            raise UserError(f"{what}: unknown image format {path.suffix or '(no suffix)'}; end the name with one of {', '.join(suffixes)}")
    _check_folder_for(path.parent, what, writable=True)  # written beside it, then renamed over it


def check_output_folder(path: str | Path, option: str, files: Iterable[str] = (), folders: Iterable[str] = (), writable: bool = True) -> None:
    """A clear error now when ``path`` cannot be (or become) a folder holding ``files`` and ``folders``
    (names relative to it); ``writable=False`` for a folder that may only be read (a full feature cache)."""
    with _searchable(f"{option} {path}"):
        _check_output_folder(Path(path), f"{option} {path}", files, folders, writable)


def _check_output_folder(path: Path, what: str, files: Iterable[str], folders: Iterable[str], writable: bool) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"{what}: is a file, not a folder; give a folder (it is created when missing)")
    _check_folder_for(path, what, writable)
    for name in files:
        if (path / name).is_dir() or ((path / name).exists() and not (path / name).is_file()):
            raise UserError(f"{what}: {path / name} must be a file, and it is not; move it away")
    for name in folders:
        if (path / name).exists() and not (path / name).is_dir():
            raise UserError(f"{what}: {path / name} must be a folder, and it is a file; move it away")


def same_file(a: str | Path, b: str | Path) -> bool:
    """One file under two names (a relative and an absolute path, a link), or one path for a file not there yet."""
    a, b = Path(a), Path(b)
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()


def refuse_replacing_inputs(outputs: Iterable[str | Path], option: str, inputs: Iterable[tuple[str, str | Path]]) -> None:
    """A clear error now when one of the ``outputs`` (paths that ``option`` makes) is one of the ``inputs``
    ((what, path) pairs: an image to caption, the checkpoint, a split file): writing it would replace what is read."""
    inputs = list(inputs)
    for output in outputs:
        for what, path in inputs:
            if same_file(output, path):
                raise UserError(f"{option}: {output} is {what}; writing it would replace it, so write it elsewhere")


def numbered_path(path: str | Path, number: int, several: bool) -> Path:
    """``OUT.png`` for a single input, ``OUT-<number>.png`` when there are several."""
    path = Path(path)
    return path.with_name(f"{path.stem}-{number}{path.suffix or '.png'}") if several else path


def is_numbered_like(path: str | Path, out: str | Path) -> bool:
    """Is ``path`` one of the files :func:`numbered_path` can make of ``out`` (``OUT.png`` or ``OUT-<n>.png``)?"""
    path, out = Path(path), Path(out)
    numbered = re.fullmatch(rf"{re.escape(out.stem)}(-[1-9][0-9]*)?{re.escape(out.suffix or '.png')}", path.name)
    return (bool(numbered) and same_file(path.parent, out.parent)) or same_file(path, out)
