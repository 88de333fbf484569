"""The `attnkit` command: its subcommands, `python -m attnkit`, the console script and the tasks/ wrappers."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.commands import COMMANDS, main
from attnkit.train import TrainingProgress
from conftest import ROOT


def attnkit(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, script] if script else [sys.executable, "-m", "attnkit"]
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_every_command_with_one_line_and_imports_no_torch():
    probe = "import sys; from attnkit.commands import main; code = main(['--help']); print('torch' in sys.modules); sys.exit(code)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[-1] == "False"  # `attnkit --help` answers at once: no command module (and no torch) is loaded
    for name in COMMANDS:
        assert sum(line.strip().startswith(f"{name} ") for line in lines) == 1, name


def test_every_command_is_a_module_with_its_parser_and_a_tasks_wrapper():
    wrappers = {path.stem for path in (ROOT / "tasks").glob("*.py")} - {"__init__"}
    assert wrappers == set(COMMANDS)
    for name in COMMANDS:
        module = importlib.import_module(f"attnkit.commands.{name}")
        assert module.get_args_parser().prog == f"attnkit {name}"
        assert callable(module.main)
        assert f'run(["{name}", *sys.argv[1:]])' in (ROOT / "tasks" / f"{name}.py").read_text()


def test_every_option_of_every_command_says_what_it_does():
    silent = [
        f"{name} {action.option_strings[0]}"
        for name in COMMANDS
        for action in importlib.import_module(f"attnkit.commands.{name}").get_args_parser()._actions
        if action.option_strings and not action.help
    ]
    assert silent == []


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"attnkit": "attnkit.commands:run"}
    installed = Path(sys.executable).parent / "attnkit"  # `make install` puts it beside the interpreter
    if not installed.exists():
        pytest.skip(f"attnkit is not installed beside {sys.executable} (make install does that)")
    done = subprocess.run([str(installed), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: attnkit COMMAND" in done.stdout


def test_help_with_a_command_prints_that_commands_help(capsys):
    expected = attnkit("train", "--help")
    assert expected.returncode == 0 and expected.stdout.startswith("usage: attnkit train")
    asked = attnkit("help", "train")
    assert (asked.returncode, asked.stdout) == (0, expected.stdout)
    assert main(["help"]) == 0 and capsys.readouterr().out.startswith("usage: attnkit COMMAND")
    assert main(["help", "tran"]) == 2  # an unknown command, as without help
    assert "did you mean 'train'?" in capsys.readouterr().err


@pytest.mark.parametrize("args", [[], ["tran"], ["--bogus"]])
def test_no_or_an_unknown_command_is_one_message_and_exit_2(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    if args:
        assert err.startswith(f"error: unknown command '{args[0]}'") and err.count("\n") == 1
        assert ("did you mean 'train'?" in err) == (args == ["tran"])
    else:
        assert "usage: attnkit COMMAND" in err


def test_version_and_a_command_through_python_m():
    assert attnkit("--version").stdout.strip().startswith("attnkit ")
    missing = attnkit("translate", "--checkpoint", "no/such/best.pt", "ein hund .")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr


def test_a_tasks_wrapper_runs_the_same_command():
    done = attnkit("--help", script="tasks/average.py")
    assert done.returncode == 0 and done.stdout.startswith("usage: attnkit average")
    wrong = attnkit("--beam", "0", script="tasks/translate.py")
    assert wrong.returncode == 2 and "attnkit translate: error:" in wrong.stderr


@pytest.mark.parametrize("argv", [["--evaluate", "0"], ["--scenes", "-3"]])
def test_demo_refuses_counts_below_one_before_it_trains(argv, capsys):
    """They failed only after both models had trained (no scenes to score, or none to train on)."""
    from attnkit.commands import demo

    with pytest.raises(SystemExit) as exit_:
        demo.main(argv)
    assert exit_.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_train_says_which_given_keys_its_model_does_not_read(monkeypatch, capsys, tmp_path):
    """A key set in the recipe or with --set that the model never reads (attnkit.config.unread_keys) changes nothing:
    training says so once, before it starts, and goes on."""
    from attnkit.commands import train

    trained = []
    monkeypatch.setattr(train, "train_translation", lambda config, **_: trained.append(config) or TrainingProgress(epoch=1))
    recipe = ROOT / "tasks" / "configs" / "tiny_transformer.yaml"
    assert train.main(["--config", str(recipe), "--set", "decoder.rnn=lstm", "--set", "train.epochs=1", "--set", f"output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "note: decoder.rnn is not read by this model (the transformer decoder family has no RNN cell); it changes nothing" in out
    assert out.count("note:") == 1 and len(trained) == 1 and trained[0].decoder.rnn == "lstm"


def test_train_reads_its_recipe_once(monkeypatch, capsys, tmp_path):
    """The run and the note on keys its model does not read come from one reading of the recipe: a file replaced or
    removed meanwhile (an editor saving it, a sweep rewriting it) cannot make them disagree, nor end in a traceback."""
    from attnkit.commands import train

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((ROOT / "tasks" / "configs" / "tiny_transformer.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    read_once = train.read_recipe

    def read_then_remove(path):
        values = read_once(path)
        values.setdefault("decoder", {})["rnn"] = "lstm"  # what the file said when it was read
        Path(path).unlink()  # gone before anything else could read it again
        return values

    trained = []
    monkeypatch.setattr(train, "read_recipe", read_then_remove)
    monkeypatch.setattr(train, "train_translation", lambda config, **_: trained.append(config) or TrainingProgress(epoch=1))
    assert train.main(["--config", str(recipe), "--set", "train.epochs=1", "--set", f"output_dir={tmp_path / 'run'}"]) == 0
    assert "note: decoder.rnn is not read by this model" in capsys.readouterr().out
    assert len(trained) == 1 and trained[0].decoder.rnn == "lstm"
