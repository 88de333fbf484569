"""Bad input to the scripts in tasks/: one `error:` line on stderr, a non-zero exit code, no traceback,
and output paths checked before any work; translate.py streams its input batch by batch."""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import io
import os
import random
import sys
from pathlib import Path

import pytest

from attnkit import cli
from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.data.text import write_parallel_dataset
from attnkit.errors import UserError, run_cli
from attnkit.translation import Translator
from conftest import ROOT, reverse_pair
from attnkit.commands import caption, compare, evaluate, train, translate

TINY = ["--config", str(ROOT / "tasks/configs/tiny.yaml"), "--no-progress", "--set", "train.epochs=1", "--set", "data.tokenizer.lowercase=false"]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """One tiny translator (reversal task, a: b c ... h), trained once for the whole file."""
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("bad-input")
    splits = {"train": [reverse_pair(rng) for _ in range(200)], "valid": [reverse_pair(rng) for _ in range(10)], "test": [reverse_pair(rng) for _ in range(10)]}
    data = write_parallel_dataset(folder / "data", ("src", "tgt"), splits)
    settings = [f"data.path={data}", f"output_dir={folder / 'run'}", "train.valid_max_examples=10"]
    assert run_cli(train.main, [*TINY, *(a for s in settings for a in ("--set", s))]) == 0
    return str(folder / "run" / "best.pt")


@pytest.fixture(scope="session")
def checkpoints(checkpoint, tmp_path_factory):
    """By task: the translator, and the same file labelled as a captioning and as a joint checkpoint (evaluate.py
    reads the task to know which options apply, and checks them and the paths before it builds a model)."""
    relabelled = tmp_path_factory.mktemp("relabelled")
    for task in ("captioning", "multitask"):
        save_checkpoint(relabelled / f"{task}.pt", dataclasses.replace(load_checkpoint(checkpoint), task=task))
    return {"translation": checkpoint, "captioning": str(relabelled / "captioning.pt"), "multitask": str(relabelled / "multitask.pt")}


@pytest.fixture
def files(tmp_path):
    """Paths of every kind the cases need, by name."""
    (tmp_path / "good.txt").write_text("a b\nc d e\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("a b\nc d \xe9\n".encode("latin-1"))  # line 2 is not UTF-8
    (tmp_path / "locked.txt").write_text("a b\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("not a folder\n", encoding="utf-8")
    (tmp_path / "folder").mkdir()
    (tmp_path / "scenes-out").mkdir()
    (tmp_path / "scenes-out" / "example").write_text("a file where a folder goes\n", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"")  # never read: the checks before it fail first
    names = {"good": "good.txt", "latin1": "latin1.txt", "locked": "locked.txt", "a_file": "a-file", "folder": "folder", "scenes_out": "scenes-out", "missing": "missing.txt"}
    return {key: str(tmp_path / name) for key, name in names.items()} | {"tmp": tmp_path}


def outcome(main, argv, capsys) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a script run as from the command line (argparse exits with SystemExit)."""
    try:
        code = run_cli(main, argv)
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error(code: int, err: str, expected: str) -> None:
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code != 0, err
    assert len(errors) == 1, err
    assert expected in errors[0], err
    assert "Traceback" not in err, err


@pytest.fixture
def no_permission(monkeypatch, files):
    """Make locked.txt unreadable, also when the tests run as root (who may read any file)."""
    locked = files["locked"]
    os.chmod(locked, 0)
    real_open = builtins.open

    def guarded_open(path, *args, **kwargs):
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cli, "open", guarded_open, raising=False)  # the module's inputs go through its `open`
    yield
    os.chmod(locked, 0o644)


# ------------------------------------------------------------------ 1. inputs that cannot be read

UNREADABLE = [
    ("translate", ["--input", "{missing}"], "--input {missing}: file not found"),
    ("translate", ["--input", "{folder}"], "is a folder, not a file"),
    ("translate", ["--input", "{latin1}"], "line 2: not UTF-8 text"),
    ("translate", ["--input", "{locked}"], "permission denied"),
    ("translate", ["--input", "{a_file}/x.txt"], "cannot read it"),
    ("translate", ["<stdin>", "\xff\n"], "standard input, line 1: not UTF-8 text"),
    ("translate", ["<stdin>", "a b\n\xff\n"], "standard input, line 2: not UTF-8 text"),
    ("translate", ["<stdin-surrogateescape>", "a b\nje \xff\n"], "standard input, line 2: not UTF-8 text"),
    ("translate", ["je \udcff suis"], "sentence 1 is not UTF-8 text"),  # a byte that is not UTF-8 in an argument
    ("compare", ["--image", "{tmp}/image.png", "--source", "un \udcff", "--out", "{folder}/o"], "--source is not UTF-8 text"),
    ("compare", ["--image", "{tmp}/image.png", "--source", "a b", "--target", "\udcff", "--out", "{folder}/o"], "--target is not UTF-8 text"),
    ("evaluate", ["--source", "{missing}", "--reference", "{good}"], "--source {missing}: file not found"),
    ("evaluate", ["--source", "{good}", "--reference", "{folder}"], "--reference {folder}: is a folder"),
    ("evaluate", ["--source", "{latin1}", "--reference", "{good}"], "--source {latin1}, line 2: not UTF-8 text"),
    ("evaluate", ["--source", "{good}", "--reference", "{locked}"], "permission denied"),
    ("evaluate-captioning", ["--images", "{folder}", "--captions", "{missing}"], "--captions {missing}: file not found"),
    ("evaluate-captioning", ["--images", "{folder}", "--captions", "{locked}"], "--captions {locked}: permission denied"),
    ("evaluate-captioning", ["--images", "{folder}", "--captions", "{folder}"], "--captions {folder}: is a folder"),
    ("evaluate-captioning", ["--images", "{missing}", "--captions", "{good}"], "--images {missing}: folder not found"),
    ("evaluate-captioning", ["--images", "{a_file}", "--captions", "{good}"], "is a file, not a folder"),
    ("compare", ["--image", "{missing}", "--source", "a b", "--out", "{folder}"], "file not found"),
    ("compare", ["--image", "{folder}", "--source", "a b", "--out", "{folder}/out"], "is a directory"),
]  # fmt: skip

SCRIPTS = {"translate": translate.main, "evaluate": evaluate.main, "caption": caption.main, "compare": compare.main}


def script_and_checkpoint(name: str, checkpoints: dict) -> tuple:
    """``evaluate-captioning``: evaluate.py with a captioning checkpoint (``-multitask``: a joint one); any other name: the script with the translator."""
    script, _, task = name.partition("-")
    return SCRIPTS[script], checkpoints[task or "translation"]


def expand(argv: list[str], files: dict) -> list[str]:
    return [arg.format(**files) for arg in argv]


@pytest.mark.parametrize("script, argv, message", UNREADABLE, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(UNREADABLE)])
def test_unreadable_inputs_are_one_clear_error(script, argv, message, checkpoints, files, no_permission, capsys, monkeypatch):
    if argv[0].startswith("<stdin"):  # as `printf '\xff\n' | PYTHONIOENCODING=utf-8:strict python tasks/translate.py ...`
        errors = "surrogateescape" if argv[0] == "<stdin-surrogateescape>" else "strict"  # surrogateescape: Python's own in a UTF-8 or C locale
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(argv[1].encode("latin-1")), encoding="utf-8", errors=errors))
        argv = []
    main, checkpoint = script_and_checkpoint(script, checkpoints)
    code, _, err = outcome(main, ["--checkpoint", checkpoint, *expand(argv, files)], capsys)
    assert_one_error(code, err, message.format(**files))


# ------------------------------------------------------------------ 2. outputs of the wrong kind, found before any work

UNWRITABLE = [
    ("translate", ["--attention-png", "{folder}", "a b"], "--attention-png {folder}: is a folder"),
    ("translate", ["--attention-png", "{tmp}/out.xyz", "a b"], "unknown image format .xyz"),
    ("translate", ["--attention-png", "{tmp}/out", "a b"], "unknown image format (no suffix)"),
    ("translate", ["--attention-png", "{a_file}/out.png", "a b"], "{a_file} is a file, not a folder"),
    ("caption", ["--attention-png", "{folder}", "{tmp}/image.png"], "--attention-png {folder}: is a folder"),
    ("caption", ["--attention-png", "{tmp}/overlay.xyz", "{tmp}/image.png"], "unknown image format .xyz"),
    ("caption", ["--attention-png", "{tmp}/o.png", "{tmp}/image.png", "{tmp}/image.png", "{tmp}/image.png"], "{tmp}/o-3.png: is a folder"),
    ("caption", ["--cache", "{a_file}", "{tmp}/image.png"], "--cache {a_file}: is a file, not a folder"),
    ("compare", ["--out", "{a_file}", "--image", "{tmp}/image.png", "--source", "a b"], "--out {a_file}: is a file, not a folder"),
    ("compare", ["--out", "{a_file}/sub", "--image", "{tmp}/image.png", "--source", "a b"], "{a_file} is a file, not a folder"),
    ("compare", ["--out", "{scenes_out}", "--scenes", "2"], "example must be a folder"),
    ("evaluate", ["--source", "{good}", "--reference", "{good}", "--output", "{folder}"], "--output {folder}: is a folder"),
    ("evaluate", ["--source", "{good}", "--reference", "{latin1}", "--output", "{latin1}"], "is the --reference file"),
    ("caption", ["--attention-png", "{tmp}/image.png", "{tmp}/image.png"], "--attention-png: {tmp}/image.png is the image {tmp}/image.png"),
    ("caption", ["--attention-png", "{tmp}/p.png", "{tmp}/image.png", "{tmp}/p-2.png"], "--attention-png: {tmp}/p-2.png is the image {tmp}/p-2.png"),
    ("compare", ["--out", "{tmp}", "--image", "{tmp}/comparison.png", "--source", "a b"], "--out: {tmp}/comparison.png is the --image {tmp}/comparison.png"),
    ("translate", ["--input", "{tmp}/attn-3.png", "--attention-png", "{tmp}/attn.png"], "would write {tmp}/attn-3.png, the --input file, over it"),
    ("evaluate-captioning", ["--split", "test", "--cache", "{a_file}"], "--cache {a_file}: is a file, not a folder"),
]  # fmt: skip


@pytest.mark.parametrize("script, argv, message", UNWRITABLE, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(UNWRITABLE)])
def test_bad_output_paths_fail_before_any_work(script, argv, message, checkpoints, files, capsys):
    (files["tmp"] / "o-3.png").mkdir()
    before = {path: path.read_bytes() for path in files["tmp"].rglob("*") if path.is_file()}
    # The translation checkpoint is the wrong kind for caption.py and compare.py: that the message is about
    # the path shows the path was checked first, before the model loads.
    main, checkpoint = script_and_checkpoint(script, checkpoints)
    code, out, err = outcome(main, ["--checkpoint", checkpoint, *expand(argv, files)], capsys)
    assert_one_error(code, err, message.format(**files))
    assert out == ""  # nothing decoded
    assert {path: path.read_bytes() for path in files["tmp"].rglob("*") if path.is_file()} == before  # nothing written or lost


def test_a_numbered_figure_path_that_is_a_folder_stops_the_run_with_one_error(checkpoint, tmp_path, capsys):
    """Sentences given as arguments: every OUT-<n>.png is checked before decoding (it had been found only when its
    figure came, after the first sentences were decoded). Sentences read from a file: as they come."""
    (tmp_path / "attn-2.png").mkdir()
    code, out, err = outcome(translate.main, ["--checkpoint", checkpoint, "--attention-png", str(tmp_path / "attn.png"), "a b", "c d"], capsys)
    assert_one_error(code, err, "attn-2.png: is a folder")
    assert out == "" and not (tmp_path / "attn-1.png").exists()
    (tmp_path / "in.txt").write_text("a b\nc d\n")
    code, out, err = outcome(translate.main, ["--checkpoint", checkpoint, "--attention-png", str(tmp_path / "attn.png"), "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_error(code, err, "attn-2.png: is a folder")
    assert len(out.splitlines()) == 2 and (tmp_path / "attn-1.png").stat().st_size > 0



def test_evaluate_never_writes_its_translations_over_the_checkpoint_or_the_split_it_reads(checkpoint, tmp_path, capsys):
    data = load_checkpoint(checkpoint).config["data"]["path"]
    kept = tmp_path / "kept.pt"
    kept.write_bytes(open(checkpoint, "rb").read())
    cases = [
        (["--checkpoint", str(kept), "--split", "test", "--output", str(kept)], f"--output: {kept} is the checkpoint"),
        (["--checkpoint", checkpoint, "--split", "test", "--output", f"{data}/test.tgt"], "is a file of the dataset (test.tgt)"),
        (["--checkpoint", checkpoint, "--split", "test", "--data", data, "--output", f"{data}/dataset.json"], "is a file of the dataset (dataset.json)"),
    ]
    before = {path.name: path.read_bytes() for path in [kept, *sorted(Path(data).iterdir())]}
    for argv, message in cases:
        code, out, err = outcome(evaluate.main, argv, capsys)
        assert_one_error(code, err, message)
        assert out == ""
    assert {path.name: path.read_bytes() for path in [kept, *sorted(Path(data).iterdir())]} == before

# ------------------------------------------------------------------ 2b. options the checkpoint or the other options cannot honour, never ignored

CONFLICTS = [
    ("evaluate", ["--task", "caption", "--split", "test"], "--task caption: {translation} is a translation checkpoint, not a joint one; it only translates"),
    ("evaluate-captioning", ["--task", "translate", "--split", "test"], "--task translate: {captioning} is a captioning checkpoint, not a joint one; it only captions"),
    ("evaluate-multitask", ["--task", "caption", "--source", "{good}", "--reference", "{good}"], "--task caption does not go with --source, --reference (options of translation)"),
    ("evaluate-multitask", ["--task", "translate", "--split", "test", "--cache", "{folder}"], "--task translate does not go with --cache (options of captioning)"),
    ("evaluate-multitask", ["--source", "{good}", "--reference", "{good}", "--images", "{folder}"], "--source, --reference (translation) and --images (captioning) do not go together"),
    ("evaluate", ["--split", "test", "--cache", "{folder}"], "--cache is for captioning checkpoints; this one translates: leave it out"),
    ("evaluate", ["--images", "{folder}", "--captions", "{good}"], "are for captioning checkpoints; this one translates: leave them out (its own data to score: --source/--reference)"),
    ("translate", ["--checkpoint", "{good}", "a b"], "argument --checkpoint: given more than once: this command takes one"),  # B alone was used
    ("compare", ["--checkpoint", "{good}", "--scenes", "2", "--out", "{tmp}/out"], "argument --checkpoint: given more than once"),
    ("compare", ["--own", "0", "--image", "{tmp}/image.png", "--source", "a b", "--out", "{tmp}/out"], "--own picks the described input of a mosaic"),
    ("compare", ["--own", "1", "--scenes", "2", "--out", "{tmp}/out"], "leave out --image, --source, --target and --own"),
]  # fmt: skip


@pytest.mark.parametrize("script, argv, message", CONFLICTS, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(CONFLICTS)])
def test_options_that_would_be_ignored_are_one_clear_error(script, argv, message, checkpoints, files, capsys):
    main, checkpoint = script_and_checkpoint(script, checkpoints)
    code, out, err = outcome(main, ["--checkpoint", checkpoint, *expand(argv, files)], capsys)
    assert_one_error(code, err, message.format(**files, **checkpoints))
    assert out == "" and not (files["tmp"] / "out").exists()


# ------------------------------------------------------------------ 3. numbers out of range

NUMBERS = [
    ("translate", ["--beam", "-1", "a"], "argument --beam: must be at least 1, got -1"),
    ("translate", ["--beam", "0", "a"], "argument --beam: must be at least 1, got 0"),
    ("translate", ["--beam", "two", "a"], "argument --beam: expected a whole number, got 'two'"),
    ("translate", ["--batch-size", "0", "a"], "argument --batch-size: must be at least 1"),
    ("translate", ["--n-best", "0", "a"], "argument --n-best: must be at least 1"),
    ("translate", ["--n-best", "3", "--beam", "2", "a"], "--n-best 3 is more than --beam 2"),
    ("caption", ["--beam", "0", "x.png"], "argument --beam: must be at least 1"),
    ("caption", ["--batch-size", "-2", "x.png"], "argument --batch-size: must be at least 1"),
    ("evaluate", ["--split", "test", "--beam", "0"], "argument --beam: must be at least 1"),
    ("evaluate", ["--split", "test", "--batch-size", "0"], "argument --batch-size: must be at least 1"),
    ("evaluate", ["--split", "test", "--limit", "-1"], "argument --limit: must be at least 0"),
    ("compare", ["--scenes", "2", "--scene-size", "0", "--out", "x"], "argument --scene-size: must be between 8 and 2048, got 0"),
    ("compare", ["--scenes", "2", "--scene-size", "-5", "--out", "x"], "argument --scene-size: must be between 8 and 2048"),
    ("compare", ["--scenes", "2", "--scene-size", "4", "--out", "x"], "argument --scene-size: must be between 8 and 2048"),
    ("compare", ["--scenes", "-1", "--out", "x"], "argument --scenes: must be at least 1, got -1"),
    ("compare", ["--scenes", "0", "--out", "x"], "argument --scenes: must be at least 1, got 0"),  # was "give --image and --source (or --scenes N)"
    ("compare", ["--scenes", "2", "--beam", "0", "--out", "x"], "argument --beam: must be at least 1"),
    ("translate", ["--beam", "100000", "a"], "the beam 100,000 is wider than the "),  # gigabytes a sentence, refused before any decoding
    ("evaluate", ["--split", "test", "--beam", "100000"], "the beam 100,000 is wider than the "),
]  # fmt: skip


@pytest.mark.parametrize("script, argv, message", NUMBERS, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(NUMBERS)])
def test_numbers_out_of_range_are_one_clear_error(script, argv, message, checkpoint, capsys):
    code, out, err = outcome(SCRIPTS[script], ["--checkpoint", checkpoint, *argv], capsys)
    assert_one_error(code, err, message)
    assert out == ""


def test_beam_for_refuses_what_argparse_would_and_keeps_the_checkpoint_default():
    args = argparse.Namespace(beam=None, n_best=1, batch_size=8)
    assert cli.beam_for(args, 4) == 4
    assert cli.beam_for(argparse.Namespace(beam=None, n_best=6, batch_size=8), 4) == 6
    for beam, n_best, batch_size in ((0, 1, 8), (-1, 1, 8), (2, 0, 8), (2, 3, 8), (2, 1, 0)):
        with pytest.raises(UserError):
            cli.beam_for(argparse.Namespace(beam=beam, n_best=n_best, batch_size=batch_size), 4)


# ------------------------------------------------------------------ 4. translate.py streams, in input order


class CountingStdin:
    """Standard input that counts the lines read so far."""

    encoding = "utf-8"

    def __init__(self, lines: list[str]):
        self.lines, self.read = lines, 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.read == len(self.lines):
            raise StopIteration
        self.read += 1
        return self.lines[self.read - 1] + "\n"


class RecordingStdout(io.StringIO):
    """Standard output that notes how many input lines had been read when it was first written to;
    with ``close_after``, it behaves as a pipe whose reader (``head -N``) left after that many lines."""

    def __init__(self, stdin: CountingStdin, close_after: int | None = None):
        super().__init__()
        self.stdin, self.close_after, self.read_at_first_output = stdin, close_after, None

    def write(self, text: str) -> int:
        if self.close_after is not None and self.getvalue().count("\n") >= self.close_after:
            raise BrokenPipeError(32, "Broken pipe")
        if self.read_at_first_output is None and text:
            self.read_at_first_output = self.stdin.read
        return super().write(text)


def sentences(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [reverse_pair(rng, 1, 7)[0] for _ in range(count)]


def test_translate_prints_each_batch_before_reading_on_and_keeps_the_input_order(checkpoint, monkeypatch, capsys):
    lines = sentences(40)
    lines[5] = ""  # untranslatable: an empty output line in its place
    stdin = CountingStdin(lines)
    stdout = RecordingStdout(stdin)
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert translate.main(["--checkpoint", checkpoint, "--batch-size", "4", "--beam", "2", "--n-best", "2"]) == 1
    assert stdout.read_at_first_output == 4  # the first batch was printed before the fifth line was read
    assert stdin.read == len(lines)

    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    results = [nbest for start in range(0, len(lines), 4) for nbest in translator.translate(lines[start : start + 4], beam_size=2, n_best=2)]
    expected = []
    for number, nbest in enumerate(results, 1):
        expected += [""] if nbest[0].error else [f"{number}\t{t.score:.4f}\t{t.text}" for t in nbest]
    assert stdout.getvalue().splitlines() == expected  # every sentence's outputs, in input order
    assert "sentence 6: empty sentence" in capsys.readouterr().err


def test_translate_streams_a_file_and_names_figures_by_sentence(checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in sentences(5)), encoding="utf-8")
    png = tmp_path / "attn.png"
    assert translate.main(["--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"), "--batch-size", "2", "--attention-png", str(png)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert sorted(p.name for p in tmp_path.glob("attn*")) == [f"attn-{n}.png" for n in range(1, 6)]
    one = tmp_path / "one"
    one.mkdir()
    assert translate.main(["--checkpoint", checkpoint, "--batch-size", "1", "--attention-png", str(one / "attn.png"), "a b c"]) == 0
    assert [p.name for p in one.iterdir()] == ["attn.png"]  # a single sentence: no number


# ------------------------------------------------------------------ 5. a closed stdout (`| head -1`)


def test_a_closed_stdout_stops_reading_and_is_left_to_run_cli(checkpoint, monkeypatch):
    stdin = CountingStdin(sentences(200))
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", RecordingStdout(stdin, close_after=1))
    with pytest.raises(BrokenPipeError):  # not caught, not turned into an error message: run_cli exits quietly on it
        translate.main(["--checkpoint", checkpoint, "--batch-size", "8"])
    assert stdin.read == 8  # it stopped after the first batch


def test_the_library_widens_the_checkpoint_s_beam_to_n_best_as_the_commands_do(checkpoint):
    """Translator.translate(n_best=K) past the checkpoint's beam was a bare ValueError from beam_search; the commands
    widen the beam to --n-best (cli.beam_for), and so does the library now."""
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    k = translator.search.beam_size + 1
    (outputs,) = translator.translate(sentences(1), n_best=k)
    explicit = translator.translate(sentences(1), beam_size=k, n_best=k)[0]
    assert len(outputs) == k and [(t.text, t.score) for t in outputs] == [(t.text, t.score) for t in explicit]
