"""The README and docs/ say what works: every command in a ```sh block parses with its own command's parser
(its recipe loads with its --set values, the repository files it names exist), every option a ```text
synopsis names exists, every relative link (and its #anchor) leads somewhere, and the blocks marked
``<!-- test: run -->`` run as written."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnkit.commands import COMMANDS
from attnkit.config import load_config
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- test: run -->"
SCRIPT_FOLDERS = ("tasks", "bench", "data_scripts")
SEPARATORS = {"|", "||", "&&", ";"}  # a shell line's commands
REDIRECTS = {">", ">>", "<", "2>"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    run: bool  # marked to run as written

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    blocks, lines = [], page.read_text().splitlines()
    number = 0
    while number < len(lines):
        fence = lines[number]
        if fence.startswith("```"):
            end = next(i for i in range(number + 1, len(lines)) if lines[i].startswith("```"))
            before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
            blocks.append(Block(page, number + 1, fence[3:].strip(), "\n".join(lines[number + 1 : end]), before.strip() == RUN_MARK))
            number = end
        number += 1
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """Each command of a block's shell lines as its words: continuations joined, comments, pipes and redirects cut."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        command, redirected = [], False
        for word in [*lexer, ";"]:
            if word in SEPARATORS:
                if command:
                    commands.append(command)
                command, redirected = [], False
            elif word in REDIRECTS:
                redirected = True  # the rest of this command says where its output goes
            elif not redirected:
                command.append(word)
    return commands


def attnkit_call(words: list[str]) -> tuple[str, list[str]] | None:
    """(command, its arguments) when these words run an attnkit command (attnkit, python -m attnkit, torchrun -m attnkit, tasks/NAME.py)."""
    if words[0] == "attnkit":
        return words[1], words[2:]
    for at in range(len(words) - 2):
        if words[at : at + 2] == ["-m", "attnkit"]:
            return words[at + 2], words[at + 3 :]
    script = next((word for word in words[1:] if word.endswith(".py")), None)
    if script and script.startswith("tasks/"):
        return Path(script).stem, words[words.index(script) + 1 :]
    return None


def parse(parser: argparse.ArgumentParser, args: list[str], where: str) -> argparse.Namespace:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: {' '.join(args)}\n{errors.getvalue()}")


def script_parser(path: str, monkeypatch) -> argparse.ArgumentParser:
    monkeypatch.syspath_prepend(str(ROOT / Path(path).parent))
    return importlib.import_module(Path(path).stem).get_args_parser()


SH_BLOCKS = [block for page in PAGES for block in code_blocks(page) if block.language == "sh"]
TEXT_BLOCKS = [block for page in PAGES for block in code_blocks(page) if block.language == "text"]


@pytest.mark.parametrize("block", SH_BLOCKS, ids=str)
def test_each_command_of_a_sh_block_parses_and_its_recipe_loads(block, monkeypatch):
    checked = 0
    for words in shell_commands(block.text):
        where = f"{block}: {' '.join(words)}"
        call = attnkit_call(words)
        if call:
            name, args = call
            assert name in COMMANDS, f"{where}: no command '{name}'"
            options = parse(importlib.import_module(f"attnkit.commands.{name}").get_args_parser(), args, where)
            if getattr(options, "config", None) and name == "train":
                load_config(ROOT / options.config, options.overrides)  # a stale key or value fails here
            checked += 1
        elif words[0] in ("python", "python3") and words[1].endswith(".py"):
            assert words[1].split("/")[0] in SCRIPT_FOLDERS and (ROOT / words[1]).is_file(), f"{where}: no such script"
            parse(script_parser(words[1], monkeypatch), words[2:], where)
            checked += 1
        elif words[0] == "bash":
            assert (ROOT / words[1]).is_file(), f"{where}: no such script"
            checked += 1
    assert checked, f"{block}: a sh block with no command attnkit or a script runs; mark it text"


@pytest.mark.parametrize("block", TEXT_BLOCKS, ids=str)
def test_a_synopsis_names_commands_and_options_that_exist(block):
    lines = block.text.replace("\\\n", " ").replace("[", " ").replace("]", " ").splitlines()
    commands = [line for line in lines if line.split()[:1] in (["attnkit"], ["torchrun"], ["python"])]  # not the layout's tree, nor printed output
    for words in shell_commands("\n".join(commands)):
        call = attnkit_call(words)
        if not call:
            continue
        name, args = call
        assert name in COMMANDS, f"{block}: no command '{name}'"
        known = importlib.import_module(f"attnkit.commands.{name}").get_args_parser()._option_string_actions
        for option in (arg.split("=")[0] for arg in args if arg.startswith("--")):
            assert option in known, f"{block}: attnkit {name} has no option {option}"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_and_their_anchors_lead_somewhere(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: link to {target}: no such file"
        if fragment:
            headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", linked.read_text(), flags=re.S), flags=re.M)
            assert fragment in {anchor(h) for h in headings}, f"{page.name}: link to {target}: no such heading"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert not re.search(r"\b[Ii]ssue \d", readme)  # no session history in user documentation
    for name in COMMANDS:
        assert f"attnkit {name}" in readme or name == "demo", name  # each use is shown (the demo through make demo)


def test_the_compare_example_uses_the_scene_it_names():
    """The README compares scene-0.png with its own French description, which the demo's scenes determine."""
    from attnkit.data.scenes import generate_scenes

    (scene,) = generate_scenes(1, seed=0, split="test")  # the demo's scene-0.png
    assert f'--source "{scene.sentences[0].french_text}"' in (ROOT / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("block", [block for block in SH_BLOCKS if block.run], ids=str)
def test_the_marked_blocks_run_as_written(block, tmp_path):
    for folder in ("tasks", "data"):  # a scratch project: the recipes and embedded data, its own runs/
        (tmp_path / folder).symlink_to(ROOT / folder)
    for words in shell_commands(block.text):
        name, args = attnkit_call(words)
        done = subprocess.run([sys.executable, "-m", "attnkit", name, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{block}: {' '.join(words)}\n{done.stderr[-2000:]}"
        assert done.stdout.strip(), f"{block}: {' '.join(words)} printed nothing"
