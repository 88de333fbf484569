"""Take a folder larger than one device call to a warm GPU machine, in parts.

One call to the lent GPU machine carries at most 64 MiB, the working tree included, and the machine keeps what a
call wrote outside the checkout for as long as it stays warm (30 s after each call). So a larger folder (the 6,276
Flickr8k photos: 177 MB) travels in parts: ``split`` hard-links its files into ``.stage/NAME-1`` ... ``-K``
(git-ignored) here; each device call carries one part and ``receive`` moves it into place there; the call that
uses the folder first runs ``check``, which names any part that has not arrived::

    .stage/flickr8k-1/  part.json  files/...    one device call each, made one right after the other
    .stage/flickr8k-2/  part.json  files/...    ----> /tmp/attnkit-shared/data/flickr8k/...
    .stage/flickr8k-3/  part.json  files/...          (+ .staged/: what arrived, for check)

    python bench/device_stage.py split ../shared/data/flickr8k       # here: the parts, and the calls to make
    python3 bench/device_stage.py receive .stage/flickr8k-1            # there, in the call carrying .stage/flickr8k-1
    python3 bench/device_stage.py check /tmp/attnkit-shared/data/flickr8k   # there: every part arrived (exit 1 if not)
    python bench/device_stage.py clean                                 # here, afterwards: .stage/ goes

A part holds at most ``--part-mib`` MiB: by default 64 MiB less the working tree that travels with every call and
1 MiB to spare. Standard library only: it runs on the GPU machine's own Python before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / ".stage"  # git-ignored
DESTINATION = Path("/tmp/attnkit-shared/data")  # outside the checkout: a call's copy of the tree does not touch it
CALL_LIMIT = 64 * 2**20  # what one device call carries, the working tree included
SPARE = 2**20
BLOCK = 4096  # sizes are counted as disk blocks (what du counts), whichever way the call's 64 MiB is measured
RECORD = ".staged"  # in the destination: each received part's part.json, which check reads


class StageError(Exception):
    """A mistake the user can mend: printed as one line, exit status 1."""


def working_tree_bytes(root: Path = ROOT) -> int:
    """The bytes every device call carries before any part: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True)
    if listed.returncode != 0:  # the device tool carries a git checkout's files; outside one there is nothing to size
        raise StageError(f"{root} is not a git checkout (git ls-files: {listed.stderr.decode().strip() or 'failed'}); split the data from the project's checkout")
    return sum(on_disk((root / name).stat().st_size) for name in listed.stdout.decode().split("\0") if name and (root / name).is_file())


def on_disk(size: int) -> int:
    """``size`` bytes rounded up to whole disk blocks."""
    return -(-size // BLOCK) * BLOCK


def plan_parts(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """The files (relative paths, in sorted order) of each part: filled in order, each part at most ``limit`` bytes
    (``sizes``: as on disk)."""
    too_large = [name for name, size in sizes.items() if size > limit]
    if too_large:
        raise StageError(f"{too_large[0]} is {sizes[too_large[0]] / 2**20:.1f} MiB, more than one part may hold ({limit / 2**20:.1f} MiB)")
    parts = _fill(sizes, limit)
    # As few parts, of even sizes: a part closes above total / K only when the next file would pass the cap, so
    # filled to total / K + the largest file no more than K parts are made (and no 4 MiB last one).
    return _fill(sizes, min(limit, -(-sum(sizes.values()) // len(parts)) + max(sizes.values())))


def _fill(sizes: dict[str, int], cap: int) -> list[list[str]]:
    parts: list[list[str]] = []
    filled = 0
    for name in sorted(sizes):
        if not parts or filled + sizes[name] > cap:
            parts.append([])
            filled = 0
        parts[-1].append(name)
        filled += sizes[name]
    return parts


def split(source: Path, name: str, limit: int, stage: Path = STAGE) -> list[Path]:
    """Hard-link (else copy) the files under ``source`` into the parts ``stage/name-1`` ... and return their folders."""
    if not source.is_dir():
        raise StageError(f"{source} is not a folder")
    files = sorted(path for path in source.rglob("*") if path.is_file())
    if not files:
        raise StageError(f"{source} holds no files")
    sizes = {path.relative_to(source).as_posix(): path.stat().st_size for path in files}
    parts = plan_parts({name: on_disk(size) for name, size in sizes.items()}, limit - SPARE // 4)  # part.json's room: a quarter MiB
    for old in stage.glob(f"{name}-*"):  # an earlier split's parts would mix with these
        shutil.rmtree(old)
    folders = []
    for number, names in enumerate(parts, 1):
        folder = stage / f"{name}-{number}"
        for relative in names:
            target = folder / "files" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source / relative, target)
            except OSError:  # another file system, or links refused: a copy travels the same
                shutil.copyfile(source / relative, target)
        part = {"name": name, "part": number, "parts": len(parts), "files": {relative: sizes[relative] for relative in names}}
        (folder / "part.json").write_text(json.dumps(part))
        folders.append(folder)
    return folders


def receive(part_folder: Path, destination: Path | None = None) -> Path:
    """Move one part's files into ``destination`` (default /tmp/attnkit-shared/data/NAME) and record that it arrived."""
    info_file = part_folder / "part.json"
    if not info_file.is_file():
        raise StageError(f"{part_folder} is not a part (no part.json): carry the folder bench/device_stage.py split made")
    part = json.loads(info_file.read_text())
    destination = destination or DESTINATION / part["name"]
    for relative, size in part["files"].items():
        source, target = part_folder / "files" / relative, destination / relative
        if not source.is_file() and target.is_file() and target.stat().st_size == size:
            continue  # this part was received before (a call repeated)
        if not source.is_file() or source.stat().st_size != size:
            raise StageError(f"{part_folder}: {relative} is missing or of another size than split recorded: split again here and carry the new parts")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source, target)
    record = destination / RECORD
    record.mkdir(parents=True, exist_ok=True)
    (record / f"part-{part['part']}.json").write_text(json.dumps(part))
    return destination


def missing_parts(destination: Path) -> tuple[int, list[int]]:
    """(the number of parts, those whose files are not all in ``destination``)."""
    received = sorted((destination / RECORD).glob("part-*.json"))
    if not received:
        raise StageError(f"no part has arrived in {destination}: make the device calls bench/device_stage.py split printed")
    parts = [json.loads(path.read_text()) for path in received]
    total = parts[0]["parts"]
    complete = {
        part["part"] for part in parts
        if all((destination / relative).is_file() and (destination / relative).stat().st_size == size for relative, size in part["files"].items())
    }  # fmt: skip
    return total, [number for number in range(1, total + 1) if number not in complete]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    split_verb = verbs.add_parser("split", help="here: the folder's files as parts under .stage/")
    split_verb.add_argument("source", type=Path)
    split_verb.add_argument("--name", default="", help="the parts' name (default: the folder's)")
    split_verb.add_argument("--part-mib", type=float, default=0.0, help="at most this many MiB a part (default: 64 less the working tree, less 1)")
    receive_verb = verbs.add_parser("receive", help="there: move a carried part into place")
    receive_verb.add_argument("part", type=Path)
    receive_verb.add_argument("--to", type=Path, default=None, help=f"destination (default {DESTINATION}/NAME)")
    check_verb = verbs.add_parser("check", help="there: exit 1, naming them, unless every part arrived")
    check_verb.add_argument("destination", type=Path)
    verbs.add_parser("clean", help="here: remove .stage/")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        if args.verb == "split":
            tree = working_tree_bytes()
            limit = int(args.part_mib * 2**20) if args.part_mib else CALL_LIMIT - tree - SPARE
            if limit <= SPARE:
                raise StageError(f"--part-mib {args.part_mib}: a part must hold more than 1 MiB" if args.part_mib else f"the working tree ({tree / 2**20:.1f} MiB) leaves no room for a part")
            name = args.name or args.source.resolve().name
            folders = split(args.source, name, limit)
            part_sizes = [sum(on_disk(path.stat().st_size) for path in folder.rglob("*") if path.is_file()) for folder in folders]
            print(
                f"{args.source}: {sum(part_sizes) / 2**20:.1f} MiB in {len(folders)} parts of {max(part_sizes) / 2**20:.1f} MiB at most "
                f"(a part's limit {limit / 2**20:.1f} MiB: the working tree takes {tree / 2**20:.1f} of a call's 64)"
            )
            print("device calls, one right after the other (the machine goes back 30 s after a call):")
            for folder in folders:
                relative = folder.relative_to(ROOT)
                print(f'  carry ["{relative}"]  command: python3 bench/device_stage.py receive {relative}')
        elif args.verb == "receive":
            destination = receive(args.part, args.to)
            total, missing = missing_parts(destination)
            print(f"{args.part} received into {destination}; {total - len(missing)} of {total} parts there" + (f", still to come: {', '.join(map(str, missing))}" if missing else ""))
        elif args.verb == "check":
            total, missing = missing_parts(args.destination)
            if missing:
                which = f"part {missing[0]} of {total} has" if len(missing) == 1 else f"parts {', '.join(map(str, missing))} of {total} have"
                raise StageError(f"{args.destination}: {which} not arrived: make the device call (receive) of each first")
            print(f"{args.destination}: all {total} parts arrived")
        else:
            shutil.rmtree(STAGE, ignore_errors=True)
            print(f"{STAGE} removed")
    except (StageError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
