"""files.py: every JSON the package writes is strict JSON (no bare NaN or Infinity), through one helper."""

import ast
import json
import math
from pathlib import Path

import pytest

from attnkit.errors import UserError
from attnkit.files import json_text, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]


def strict(text: str):
    """json.loads as jq and JSON.parse read: NaN, Infinity and -Infinity are errors."""
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"bare {constant} in the JSON"))


def test_non_finite_numbers_are_written_as_null_at_any_depth(tmp_path):
    record = {"flip_share": math.nan, "drops": [1.5, math.inf, (-math.inf, 2)], "nested": {"peak": {"rho": float("nan")}}, "word": "cœur"}
    assert strict(json_text(record)) == {"flip_share": None, "drops": [1.5, None, [None, 2]], "nested": {"peak": {"rho": None}}, "word": "cœur"}
    path = write_json_atomic(tmp_path / "statistics.json", record)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n") and "cœur" in text and strict(text)["flip_share"] is None


def test_every_json_the_package_writes_goes_through_the_one_helper():
    """No json.dump / json.dumps in src/, tasks/ and data_scripts/ but files.py's and two that write no file."""
    not_written = {
        "src/attnkit/data/features.py": "json.dumps(identity, sort_keys=True)",  # hashed into the cache's key
        "src/attnkit/train.py": "json.loads(json.dumps(metrics))",  # plain Python values, in memory
    }
    found = []
    for folder in ("src", "tasks", "data_scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == "src/attnkit/files.py":
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                called = node.func if isinstance(node, ast.Call) else None
                if isinstance(called, ast.Attribute) and called.attr in ("dump", "dumps") and isinstance(called.value, ast.Name) and called.value.id == "json":
                    if not_written.get(name, "\0") not in lines[node.lineno - 1]:
                        found.append(f"{name}:{node.lineno}")
    assert not found, f"JSON written without attnkit.files.json_text: {found}"


def test_two_writers_with_one_process_id_write_to_different_temporaries(tmp_path):
    """Processes in separate PID namespaces (containers sharing a feature cache) can have the same id: with the id
    alone in the temporary's name, one's rename took the other's file away."""
    import os

    from attnkit.files import atomic_path, temporary_files

    with atomic_path(tmp_path / "x.pt") as one, atomic_path(tmp_path / "x.pt") as two:
        assert one != two and one.name.startswith(f".x.{os.getpid()}-") and one.name.endswith(".tmp.pt")
        one.write_bytes(b"1")
        two.write_bytes(b"2")
        assert temporary_files(tmp_path / "x.pt", os.getpid()) == sorted([one, two]) == temporary_files(tmp_path / "x.pt")
    assert (tmp_path / "x.pt").read_bytes() == b"1" and not temporary_files(tmp_path / "x.pt")  # the outer ended last


def test_an_image_written_atomically_keeps_the_old_file_when_the_write_fails(tmp_path):
    from PIL import Image

    from attnkit.files import save_image_atomic, temporary_files

    path = save_image_atomic(Image.new("RGB", (4, 4), "red"), tmp_path / "scene-0.png")
    assert Image.open(path).format == "PNG" and Image.open(path).getpixel((0, 0)) == (255, 0, 0)

    class CutShort:  # a write that dies half-way (a full disk, a kill)
        def save(self, target):
            Path(target).write_bytes(b"\x89PNG half")
            raise OSError("No space left on device")

    with pytest.raises(OSError):
        save_image_atomic(CutShort(), path)
    assert Image.open(path).getpixel((0, 0)) == (255, 0, 0) and not temporary_files(path)


def test_json_is_utf8_whatever_bytes_a_file_name_held():
    """Python carries a name's bytes that are not UTF-8 as lone surrogates; json.dumps wrote them out as they were,
    and the file was not UTF-8 (attnkit evaluate --source $'s\\xff.fr' > scores.json)."""
    text = json_text({"source": "s\udcff.fr", "k\udcfe": ["\ud800", "plain", "cœur"]})
    assert strict(text.encode("utf-8").decode("utf-8")) == {"source": "s\\xff.fr", "k\\xfe": ["\\ud800", "plain", "cœur"]}


def test_outputs_behind_a_dangling_link_or_in_latex_are_refused_before_any_work(tmp_path):
    """A link to a missing folder (an unmounted drive) passed the checks, and mkdir failed after the decoding with
    FileExistsError's traceback; a .pgf figure needs xelatex, which matplotlib looked for only when saving."""
    import argparse

    from attnkit.cli import check_output_file, figure_suffixes, seconds
    from attnkit.data.folder import read_dataset_info

    (tmp_path / "figures").symlink_to(tmp_path / "unmounted")
    with pytest.raises(UserError, match="figures is a link to .*unmounted, which does not exist"):
        check_output_file(tmp_path / "figures" / "a.png", "--attention-png", figure=True)
    assert ".pgf" not in figure_suffixes() and ".svg" in figure_suffixes()
    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        seconds("1e300")  # serve --timeout: a socket's limit is about 3e9 seconds
    with pytest.raises(UserError, match="relative to the current folder"):
        read_dataset_info("no/such/data")
