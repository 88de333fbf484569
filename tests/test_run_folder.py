"""Runs that lose nothing: --overwrite removes only the run's files, one process per folder, resume writes where it should."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os

import pytest

from attnkit.checkpoint import load_checkpoint
from attnkit.config import ExperimentConfig, apply_overrides, from_dict
from attnkit.errors import UserError
from attnkit.run_folder import LOCK, RunFolder
from attnkit.translation import train_translation
from test_train import toy_config

QUIET = dict(progress_bar=False, log=lambda _: None)


def quick(toy_data, run_dir, *more):
    return toy_config(toy_data, run_dir, "train.epochs=1", "train.valid_max_examples=8", *more)


def resumed_config(checkpoint, *overrides):
    return from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(checkpoint.config), list(overrides)))


def logged_epochs(run_dir):
    return [json.loads(line)["epoch"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_overwrite_removes_the_runs_files_and_keeps_the_users(toy_data, tmp_path):
    train_translation(quick(toy_data, tmp_path), **QUIET)
    (tmp_path / "my-notes.txt").write_text("keep")
    (tmp_path / "plots").mkdir()
    (tmp_path / ".last.4242.tmp.pt").write_bytes(b"half a checkpoint")  # left by a killed write
    first = (tmp_path / "last.pt").read_bytes()
    train_translation(quick(toy_data, tmp_path, "train.seed=7"), overwrite=True, **QUIET)
    assert (tmp_path / "my-notes.txt").read_text() == "keep" and (tmp_path / "plots").is_dir()
    assert (tmp_path / "last.pt").read_bytes() != first and logged_epochs(tmp_path) == [1]
    assert not list(tmp_path.glob(".last.*.tmp.pt"))


@pytest.mark.parametrize("mistake", ["data.path=MISSING", "data.max_source_length=1", "train.valid_max_examples=0 data.path=NO_VALID"])
def test_a_bad_config_with_overwrite_removes_nothing(toy_data, tmp_path, mistake):
    """A missing data folder, a training set the length limits empty, an empty validation split."""
    import shutil

    no_valid = tmp_path / "no-valid"
    shutil.copytree(toy_data, no_valid)
    (no_valid / "valid.src").write_text("")
    (no_valid / "valid.tgt").write_text("")
    overrides = mistake.replace("MISSING", str(tmp_path / "nope")).replace("NO_VALID", str(no_valid)).split()
    run = tmp_path / "run"
    train_translation(quick(toy_data, run), **QUIET)
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    with pytest.raises(UserError):
        train_translation(quick(toy_data, run, *overrides), overwrite=True, **QUIET)
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before


def test_resume_over_another_run_with_overwrite_replaces_all_of_its_files(toy_data, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train_translation(quick(toy_data, a), **QUIET)
    train_translation(toy_config(toy_data, b, "train.epochs=2", "train.valid_max_examples=8"), **QUIET)
    last_a = load_checkpoint(a / "last.pt")
    train_translation(resumed_config(last_a, f"output_dir={b}", "train.epochs=2"), resume=last_a, overwrite=True, **QUIET)
    run_a = last_a.training["progress"]["run_id"]
    assert load_checkpoint(b / "last.pt").training["progress"]["run_id"] == run_a
    assert load_checkpoint(b / "best.pt").training["progress"]["run_id"] == run_a  # b's own best.pt is gone
    assert logged_epochs(b) == [1, 2]


def _hold_lock(folder, ready, release):
    with RunFolder(folder).claim():
        ready.set()
        release.wait(30)



def _hold_lock_beside_a_forked_worker(folder, worker_pid):
    import time

    with RunFolder(folder).claim():
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))  # as a DataLoader worker is started
        worker.start()
        worker_pid.put(worker.pid)
        time.sleep(60)


def _reap(process, timeout: float) -> None:
    """Wait for ``process`` to end by polling its exit status: ``join`` waits on a pipe that a forked grandchild
    still holds open, so it would sit out its whole timeout."""
    import time

    deadline = time.monotonic() + timeout
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.exitcode is not None, f"process {process.pid} did not end within {timeout} s"


def test_a_killed_trainings_forked_workers_do_not_keep_its_folder_locked(tmp_path):
    """A flock belongs to the open file, which a fork shares: the workers' copies held the lock until they saw their
    parent gone (about 5 s for DataLoader workers), and a run restarted at once was refused."""
    import signal

    context = multiprocessing.get_context("spawn")
    worker_pid = context.Queue()
    holder = context.Process(target=_hold_lock_beside_a_forked_worker, args=(str(tmp_path), worker_pid))
    holder.start()
    worker = worker_pid.get(timeout=60)
    try:
        os.kill(holder.pid, signal.SIGKILL)
        _reap(holder, 30)
        os.kill(worker, 0)  # the worker lives on
        with RunFolder(tmp_path).claim():
            pass
    finally:
        os.kill(worker, signal.SIGKILL)

def test_a_folder_another_process_trains_into_is_refused(toy_data, tmp_path):
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(UserError, match="being written by another training"):
            train_translation(quick(toy_data, tmp_path), **QUIET)
        assert not (tmp_path / "last.pt").exists() and not (tmp_path / "config.yaml").exists()
    finally:
        release.set()
        holder.join(30)
    train_translation(quick(toy_data, tmp_path), **QUIET)  # the lock ends with its process
    assert (tmp_path / LOCK).exists() and (tmp_path / "last.pt").exists()


def test_resume_refuses_another_runs_folder_and_a_rewind_without_overwrite(toy_data, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train_translation(quick(toy_data, a), **QUIET)
    epoch_one = load_checkpoint(a / "last.pt")
    train_translation(resumed_config(epoch_one, "train.epochs=2"), resume=epoch_one, **QUIET)
    train_translation(quick(toy_data, b), **QUIET)
    with pytest.raises(UserError, match="holds another run"):
        train_translation(resumed_config(epoch_one, f"output_dir={b}", "train.epochs=4"), resume=epoch_one, **QUIET)
    assert load_checkpoint(b / "last.pt").training["progress"]["epoch"] == 1  # b untouched
    with pytest.raises(UserError, match="rewind"):  # a is at epoch 2: going on from epoch 1 would rewind it
        train_translation(resumed_config(epoch_one, "train.epochs=4"), resume=epoch_one, **QUIET)
    assert load_checkpoint(a / "last.pt").training["progress"]["epoch"] == 2 and logged_epochs(a) == [1, 2]



def test_a_run_resumed_into_a_new_folder_brings_its_best_epoch(toy_data, tmp_path):
    """The resumed epoch is not the best: the folder got no best.pt, and none at all if no later epoch beat the score."""
    a = tmp_path / "a"
    train_translation(quick(toy_data, a), **QUIET)
    epoch_one = load_checkpoint(a / "last.pt")
    train_translation(resumed_config(epoch_one, "train.epochs=2", "train.lr=10", "train.patience=0"), resume=epoch_one, **QUIET)  # a rate that wrecks epoch 2: not the best
    epoch_two = load_checkpoint(a / "last.pt")
    assert (epoch_two.training["progress"]["epoch"], epoch_two.training["progress"]["best_epoch"]) == (2, 1)
    lines = []
    for folder in (tmp_path / "b", tmp_path / "c"):
        if folder.name == "c":  # a damaged best.pt beside the checkpoint is not brought, and said so
            (a / "best.pt").write_bytes(b"not a checkpoint")
        train_translation(resumed_config(epoch_two, f"output_dir={folder}"), resume=epoch_two, progress_bar=False, log=lines.append)
    best = load_checkpoint(tmp_path / "b" / "best.pt")
    assert best.training["progress"]["epoch"] == 1 and best.training["progress"]["run_id"] == epoch_two.training["progress"]["run_id"]
    assert any(line.startswith("best.pt (epoch 1) brought from") for line in lines)
    assert not (tmp_path / "c" / "best.pt").exists() and (tmp_path / "c" / "last.pt").exists()
    assert any("no best.pt of this run's best epoch (1)" in line for line in lines)


def test_resuming_weights_without_training_state_is_refused_before_any_work(toy_data, tmp_path):
    """An epoch-<k>.pt (or attnkit average's mean) was said to be "another run" in its own folder, and elsewhere
    refused only after the data was read and the model built."""
    train_translation(quick(toy_data, tmp_path, "train.keep_epochs=1"), **QUIET)
    exported = load_checkpoint(tmp_path / "epoch-1.pt")
    assert not exported.training
    for folder in (tmp_path, tmp_path / "elsewhere"):
        lines = []
        with pytest.raises(UserError, match="epoch-1.pt holds no training state .*resume from the run's last.pt"):
            train_translation(resumed_config(exported, f"output_dir={folder}", "train.epochs=2"), resume=exported, progress_bar=False, log=lines.append)
        assert not any("training pairs" in line for line in lines)
    assert not (tmp_path / "elsewhere").exists() and logged_epochs(tmp_path) == [1]


def test_a_resume_that_empties_the_languages_cannot_turn_the_direction_round(toy_data, tmp_path):
    """An emptied data.source_lang counts as "filled in by training", and dataset.json then filled it in the other way
    round: the run went on with the checkpoint's vocabularies on the wrong sides."""
    train_translation(quick(toy_data, tmp_path, "data.source_lang=tgt", "data.target_lang=src"), **QUIET)
    last = load_checkpoint(tmp_path / "last.pt")
    with pytest.raises(UserError, match="changes the checkpoint's model .*data.source_lang"):
        train_translation(resumed_config(last, "train.epochs=2", "data.source_lang=", "data.target_lang="), resume=last, **QUIET)
    assert logged_epochs(tmp_path) == [1] and load_checkpoint(tmp_path / "last.pt").config["data"]["source_lang"] == "tgt"

def test_rewinding_with_overwrite_rewrites_the_log_to_the_resumed_epoch(toy_data, tmp_path):
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.valid_max_examples=8", "train.patience=0"), **QUIET)
    first = load_checkpoint(tmp_path / "last.pt")
    train_translation(resumed_config(first, "train.epochs=3"), resume=first, **QUIET)
    assert logged_epochs(tmp_path) == [1, 2, 3]
    train_translation(resumed_config(first, "train.epochs=3"), resume=first, overwrite=True, **QUIET)  # epoch 2 again, then 3
    assert logged_epochs(tmp_path) == [1, 2, 3]


def test_rewinding_with_overwrite_keeps_the_run_s_own_epoch_checkpoints_up_to_the_epoch_resumed(toy_data, tmp_path):
    """A rewind (--overwrite of the folder's own run, from an earlier epoch) removed every epoch-<k>.pt: those up to
    the epoch resumed hold the same weights as before (what attnkit average reads); only the later ones go."""
    lines = []
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.valid_max_examples=8", "train.patience=0", "train.keep_epochs=5"), **QUIET)
    first = load_checkpoint(tmp_path / "last.pt")
    train_translation(resumed_config(first, "train.epochs=4"), resume=first, **QUIET)
    before = {k: (tmp_path / f"epoch-{k}.pt").read_bytes() for k in (1, 2)}
    assert sorted(RunFolder(tmp_path).epoch_checkpoints()) == [1, 2, 3, 4]
    train_translation(resumed_config(first, "train.epochs=3"), resume=first, overwrite=True, progress_bar=False, log=lines.append)
    assert sorted(RunFolder(tmp_path).epoch_checkpoints()) == [1, 2, 3]  # epoch 3 trained again; epoch 4's went
    assert all((tmp_path / f"epoch-{k}.pt").read_bytes() == before[k] for k in (1, 2))
    (removed,) = [line for line in lines if line.startswith("--overwrite: removed")]
    assert "epoch-3.pt" in removed and "epoch-4.pt" in removed and "epoch-1.pt" not in removed and "epoch-2.pt" not in removed


def test_overwriting_another_run_still_removes_all_its_epoch_checkpoints(toy_data, tmp_path):
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.valid_max_examples=8", "train.keep_epochs=5"), **QUIET)
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=1", "train.valid_max_examples=8", "train.keep_epochs=5", "train.seed=3"), overwrite=True, **QUIET)
    assert sorted(RunFolder(tmp_path).epoch_checkpoints()) == [1]


def test_a_kill_while_rewinding_with_overwrite_leaves_a_run_to_resume(toy_data, tmp_path, monkeypatch):
    """--overwrite removed last.pt and best.pt (the checkpoint being resumed among them) before it wrote the resumed
    state: a kill in between left no checkpoint at all."""
    import attnkit.train as train_module

    train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.valid_max_examples=8"), **QUIET)
    first = load_checkpoint(tmp_path / "last.pt")
    train_translation(resumed_config(first, "train.epochs=3"), resume=first, **QUIET)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "save_checkpoint", killed)  # at the rewind's first write
    with pytest.raises(KeyboardInterrupt):
        train_translation(resumed_config(first, "train.epochs=3"), resume=first, overwrite=True, **QUIET)
    assert load_checkpoint(tmp_path / "last.pt").training["progress"]["epoch"] == 3  # the run as it stood, whole
    monkeypatch.undo()
    train_translation(resumed_config(first, "train.epochs=2"), resume=first, overwrite=True, **QUIET)  # the rewind itself
    assert load_checkpoint(tmp_path / "last.pt").training["progress"]["epoch"] == 2
    best = first.training["progress"]["best_epoch"]  # its best.pt is there, unless epoch 3 had replaced it
    assert (tmp_path / "best.pt").exists() or best == 1
    assert not (tmp_path / "best.pt").exists() or load_checkpoint(tmp_path / "best.pt").training["progress"]["epoch"] == best


def test_resume_repairs_a_log_that_a_kill_left_short_or_long(toy_data, tmp_path):
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.valid_max_examples=8"), **QUIET)
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    (tmp_path / "log.jsonl").write_text(lines[0] + "\n")  # killed after last.pt, before the log line
    last = load_checkpoint(tmp_path / "last.pt")
    train_translation(resumed_config(last, "train.epochs=3"), resume=last, **QUIET)
    assert logged_epochs(tmp_path) == [1, 2, 3]


def test_tasks_train_resumes_into_the_checkpoints_folder(toy_data, tmp_path):
    """A copied run folder goes on in the copy; the original is not touched."""
    import shutil

    from attnkit.commands import train

    original, copy = tmp_path / "original", tmp_path / "copy #2: a"  # characters YAML would read as a comment and a mapping
    train_translation(quick(toy_data, original), **QUIET)
    shutil.copytree(original, copy)
    os.remove(copy / LOCK)
    before = (original / "last.pt").read_bytes()
    assert train.main(["--resume", str(copy / "last.pt"), "--set", "train.epochs=2", "--no-progress"]) == 0
    assert (original / "last.pt").read_bytes() == before
    assert load_checkpoint(copy / "last.pt").training["progress"]["epoch"] == 2 and logged_epochs(copy) == [1, 2]


def test_a_folder_holding_another_runs_checkpoints_without_its_last_pt_is_refused(toy_data, tmp_path):
    """A user who deleted last.pt to save room still has that run's best.pt, which a new run's first epoch would
    write over; its epoch checkpoints would mix into the new run's. Resuming the same run from its best.pt goes on."""
    a, b = tmp_path / "a", tmp_path / "b"
    train_translation(quick(toy_data, a), **QUIET)
    (a / "last.pt").unlink()
    kept = (a / "best.pt").read_bytes()
    with pytest.raises(UserError, match=r"holds an earlier run's checkpoints \(best.pt\); replace them with --overwrite"):
        train_translation(quick(toy_data, a, "train.seed=7"), **QUIET)
    train_translation(quick(toy_data, b), **QUIET)
    other = load_checkpoint(b / "last.pt")
    with pytest.raises(UserError, match="holds an earlier run's checkpoints"):  # b's run resumed into a
        train_translation(resumed_config(other, f"output_dir={a}", "train.epochs=2"), resume=other, **QUIET)
    assert (a / "best.pt").read_bytes() == kept
    (b / "last.pt").unlink()
    own = load_checkpoint(b / "best.pt")
    train_translation(resumed_config(own, "train.epochs=2"), resume=own, **QUIET)
    assert logged_epochs(b) == [1, 2]
    train_translation(quick(toy_data, a, "train.seed=7"), overwrite=True, **QUIET)
    assert (a / "best.pt").read_bytes() != kept


def test_a_resume_s_new_settings_survive_a_kill_before_its_first_epoch_ends(toy_data, tmp_path, monkeypatch):
    """A resume with --set wrote config.yaml with the new settings while last.pt kept the old ones until an epoch ended:
    killed before that, the next resume of last.pt trained on with the old ones (the old rate, fewer epochs)."""
    import torch

    import attnkit.train as train_module

    a = tmp_path / "a"
    train_translation(quick(toy_data, a), **QUIET)
    epoch_one = load_checkpoint(a / "last.pt")

    def killed(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module.Trainer, "fit", killed)  # once the folder is claimed, before any step
    for folder in (a, tmp_path / "b"):  # the run's own folder, and a new one
        with pytest.raises(KeyboardInterrupt):
            train_translation(resumed_config(epoch_one, "train.epochs=3", "train.lr=0.0005", f"output_dir={folder}"), resume=epoch_one, **QUIET)
        saved = load_checkpoint(folder / "last.pt")
        assert (saved.config["train"]["epochs"], saved.config["train"]["lr"]) == (3, 0.0005)
        assert saved.training["progress"] == epoch_one.training["progress"]  # the same state, epoch 1
        assert all(torch.equal(saved.model[name], weights) for name, weights in epoch_one.model.items())
        assert "epochs: 3" in (folder / "config.yaml").read_text()


def test_a_file_system_without_locks_trains_unlocked_and_says_so(tmp_path, monkeypatch, capsys):
    """NFS mounted nolock or Lustre without flock answer ENOLCK or EOPNOTSUPP: that had been a traceback after the data
    was prepared."""
    import errno

    from attnkit import run_folder

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_folder.fcntl, "flock", no_locks)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".last.4242.tmp.pt").write_bytes(b"perhaps another run's write")
    with RunFolder(tmp_path / "run").claim() as folder:
        assert folder.path == tmp_path / "run"
    assert capsys.readouterr().err.startswith(f"note: the file system of {tmp_path / 'run'} takes no locks (No locks available)")
    assert (tmp_path / "run" / ".last.4242.tmp.pt").exists()  # unlocked, nothing of another process's is removed


def test_a_best_pt_damaged_past_its_progress_is_left_behind_by_a_resume_into_a_new_folder(toy_data, tmp_path, monkeypatch):
    """Its progress reads (so it is the run's best), the rest does not: the resume had stopped on it."""
    import attnkit.train as train_module

    a = tmp_path / "a"
    train_translation(quick(toy_data, a), **QUIET)
    epoch_one = load_checkpoint(a / "last.pt")
    train_translation(resumed_config(epoch_one, "train.epochs=2", "train.lr=10", "train.patience=0"), resume=epoch_one, **QUIET)  # epoch 2 not the best
    epoch_two = load_checkpoint(a / "last.pt")
    assert epoch_two.training["progress"]["best_epoch"] == 1

    def damaged_best(path, *args, **kwargs):
        if path == a / "best.pt":
            raise UserError(f"{path} is damaged (its checksum does not match)")
        return load_checkpoint(path, *args, **kwargs)

    monkeypatch.setattr(train_module, "load_checkpoint", damaged_best)
    lines = []
    train_translation(resumed_config(epoch_two, f"output_dir={tmp_path / 'b'}"), resume=epoch_two, progress_bar=False, log=lines.append)
    assert any(line.startswith("note: the best.pt beside the resumed checkpoint cannot be brought") for line in lines)
    assert (tmp_path / "b" / "last.pt").exists() and not (tmp_path / "b" / "best.pt").exists()


@pytest.mark.parametrize("name", ["last.pt", "config.yaml"])
def test_a_folder_where_a_run_file_goes_is_one_message_before_any_work(toy_data, tmp_path, name):
    """It was called a run already there (last.pt), or a traceback after the first epoch (config.yaml, best.pt)."""
    (tmp_path / "run" / name).mkdir(parents=True)
    with pytest.raises(UserError, match=f"output_dir {tmp_path / 'run'}: {tmp_path / 'run' / name} must be a file, and it is not; move it away"):
        train_translation(quick(toy_data, tmp_path / "run"), **QUIET)
