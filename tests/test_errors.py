"""errors.run_cli, which turns what a user (or the machine) caused into one ``error:`` line.

(Named test_config_*: the file belongs with the config's own tests, the commonest source of UserErrors.)
"""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.errors import BROKEN_PIPE_EXIT, UserError, run_cli

SRC = Path(__file__).resolve().parents[1] / "src"


def _raising(error: BaseException):
    def main(argv):
        raise error

    return main


def test_a_user_error_is_one_line_and_exit_code_2(capsys):
    assert run_cli(_raising(UserError("config key train.batch_size must be at least 1, got 0"))) == 2
    assert capsys.readouterr().err == "error: config key train.batch_size must be at least 1, got 0\n"
    assert run_cli(lambda argv: None) == 0 and run_cli(lambda argv: 3) == 3


@pytest.mark.parametrize(
    "code, text, hint",
    [
        (errno.ENOSPC, "No space left on device", "free some space"),
        (getattr(errno, "EDQUOT", errno.ENOSPC), "Disk quota exceeded", "free some space"),
        (errno.EACCES, "Permission denied", "check the permissions"),
        (errno.EPERM, "Operation not permitted", "check the permissions"),  # another user's file in a sticky folder
        (errno.EROFS, "Read-only file system", "write elsewhere"),
        (errno.ENAMETOOLONG, "File name too long", "give a shorter name"),  # had been a traceback in every command
    ],
)
def test_a_full_disk_or_a_refused_write_is_one_line_and_exit_code_2(code, text, hint, capsys):
    assert run_cli(_raising(OSError(code, text, "runs/demo/last.pt"))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {text}: runs/demo/last.pt ({hint}") and err.count("\n") == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_real_full_device(capsys):
    def main(argv):
        with open("/dev/full", "w") as handle:
            handle.write("x" * 100_000)

    assert run_cli(main) == 2
    assert capsys.readouterr().err.startswith("error: No space left on device")


@pytest.mark.parametrize("error", [OSError(errno.ENOENT, "No such file or directory", "x"), OSError("no errno"), ValueError("a bug"), KeyError("k")])
def test_other_exceptions_keep_their_traceback(error):
    with pytest.raises(type(error)):
        run_cli(_raising(error))


def _pipe_stdout(monkeypatch, reader_open: bool):
    read, write = os.pipe()
    if not reader_open:
        os.close(read)
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    return stdout, (read if reader_open else None)


def test_a_closed_stdout_ends_the_run_quietly(monkeypatch, capsys):
    stdout, _ = _pipe_stdout(monkeypatch, reader_open=False)

    def main(argv):
        for i in range(100_000):
            print(i)  # ... | head -1: the reader has gone

    try:
        assert run_cli(main) == BROKEN_PIPE_EXIT
        print("still buffered", file=stdout)
        stdout.flush()  # stdout now points at devnull: the interpreter's last flush cannot fail again
    finally:
        stdout.close()
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_keeps_its_traceback(monkeypatch):
    stdout, read = _pipe_stdout(monkeypatch, reader_open=True)
    try:
        with pytest.raises(BrokenPipeError):
            run_cli(_raising(BrokenPipeError(errno.EPIPE, "Broken pipe")))  # e.g. a data loader worker's pipe
    finally:
        stdout.close()
        os.close(read)


def test_piped_into_head_exits_141_with_nothing_on_stderr():
    script = "import sys\nfrom attnkit.errors import run_cli\nsys.exit(run_cli(lambda argv: [print(i) for i in range(200_000)] and 0))\n"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout.readline() == b"0\n"
    process.stdout.close()  # what head does after its first line
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == BROKEN_PIPE_EXIT
    assert stderr == b""


def test_an_allocation_that_fails_is_one_message_and_other_runtime_errors_stay_bugs(capsys):
    import torch

    def allocates(argv):
        torch.empty(10**15, dtype=torch.uint8)  # a petabyte: the CPU allocator refuses it at once

    assert run_cli(allocates, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not enough memory (") and "make the model's sizes, the batch or the beam smaller" in err and err.count("\n") == 1

    def out_of_gpu_memory(argv):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert run_cli(out_of_gpu_memory, []) == 2 and "CUDA out of memory" in capsys.readouterr().err

    def a_bug(argv):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        run_cli(a_bug, [])


def test_a_resume_that_runs_out_of_memory_is_not_called_a_damaged_checkpoint(small_toy_data, tmp_path, monkeypatch):
    import torch

    from attnkit import train as train_module
    from attnkit.checkpoint import load_checkpoint
    from attnkit.config import ExperimentConfig, apply_overrides, from_dict
    from attnkit.translation import train_translation
    from test_train import toy_config

    quiet = dict(progress_bar=False, log=lambda _: None)
    train_translation(toy_config(small_toy_data, tmp_path, "train.epochs=1"), **quiet)
    last = load_checkpoint(tmp_path / "last.pt")

    def full_gpu(optimizer, state):  # Adam's saved state moving onto a GPU that has no room for it
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train_module, "load_optimizer_state", full_gpu)
    with pytest.raises(torch.OutOfMemoryError):
        train_translation(from_dict(ExperimentConfig, apply_overrides(last.config, ["train.epochs=2"])), resume=last, **quiet)


def test_a_user_error_raised_in_a_loader_worker_is_its_own_one_line(capsys):
    """torch's DataLoader re-raises a worker's error with the worker's whole traceback as its message; an unreadable
    training photo printed 'error: Caught ImageError in DataLoader worker process 0.' and the traceback after it."""
    import torch

    from attnkit.data.images import ImageError

    class Photos(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            raise ImageError("photos/nope.jpg: file not found")

    def main(argv):
        for _ in torch.utils.data.DataLoader(Photos(), num_workers=1):
            pass

    assert run_cli(main) == 2
    assert capsys.readouterr().err == "error: photos/nope.jpg: file not found\n"


def test_under_torchrun_a_rank_other_than_0_says_which_it_is(capsys, monkeypatch):
    """Every rank of a torchrun job printed the same line, and two prints (text, then the newline) ran together."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_cli(_raising(UserError("checkpoint path is a directory"))) == 2
    assert capsys.readouterr().err == "error (rank 1 of 2): checkpoint path is a directory\n"
    monkeypatch.setenv("RANK", "0")
    assert run_cli(_raising(UserError("checkpoint path is a directory"))) == 2
    assert capsys.readouterr().err == "error: checkpoint path is a directory\n"


def test_too_few_examples_for_the_processes_is_said_as_such():
    from attnkit.train import too_few_examples

    assert too_few_examples(0, 1).startswith("no usable training examples")
    assert too_few_examples(1, 2) == "1 usable training examples for 2 processes: each process needs at least one (train with fewer processes, or on more data)"


STOPPED_MID_WRITE = """
import os, signal, sys
from attnkit.errors import run_cli, stop_on_signals
from attnkit.files import atomic_path

def main(argv):
    with atomic_path(sys.argv[1]) as temporary:
        temporary.write_text("half of it")
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # as kill, timeout or a closed terminal would
        temporary.write_text("all of it")

if sys.argv[3] == "nohup":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
stop_on_signals()
sys.exit(run_cli(main))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_is_met_as_ctrl_c_and_a_write_under_way_leaves_nothing(tmp_path, name):
    """A killed `attnkit average` (or any command mid-write) left its temporary file beside --out."""
    out = tmp_path / "averaged.pt"
    result = subprocess.run([sys.executable, "-c", STOPPED_MID_WRITE, str(out), name, "-"], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert (result.returncode, result.stderr) == (128 + getattr(__import__("signal"), name), f"stopped by {name}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_hangup_the_caller_ignores_stays_ignored(tmp_path):
    """`nohup attnkit train ...` must outlive its terminal."""
    out = tmp_path / "averaged.pt"
    result = subprocess.run([sys.executable, "-c", STOPPED_MID_WRITE, str(out), "SIGHUP", "nohup"], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert (result.returncode, result.stderr) == (0, "")
    assert out.read_text() == "all of it" and [path.name for path in tmp_path.iterdir()] == ["averaged.pt"]
