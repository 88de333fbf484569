"""Checkpoint averaging: train.keep_epochs keeps the last epochs' weights, attnkit average averages them."""

import copy
import dataclasses

import pytest
import torch

from attnkit.checkpoint import Checkpoint, average_checkpoints, load_checkpoint, save_checkpoint
from attnkit.config import to_dict
from attnkit.data.text import read_parallel
from attnkit.errors import UserError, run_cli
from attnkit.run_folder import RunFolder
from attnkit.translation import Translator, train_translation
from conftest import TINY_TRANSFORMER, tiny_config, tiny_model
from attnkit.commands import average
from test_train import toy_config


def checkpoint_of(model, vocab, **decoder) -> Checkpoint:
    """A translation checkpoint of ``model``, built by ``tiny_model(vocab, **decoder)``."""
    return Checkpoint("translation", to_dict(tiny_config(**decoder)), {"source": vocab.to_list(), "target": vocab.to_list()}, model.state_dict())


def test_the_average_is_the_mean_of_the_weights(vocab):
    checkpoints = [checkpoint_of(tiny_model(vocab, seed=seed), vocab) for seed in (0, 1, 2)]
    averaged = average_checkpoints(checkpoints, ["a", "b", "c"])
    for name, tensor in averaged.model.items():
        expected = torch.stack([c.model[name] for c in checkpoints]).mean(dim=0)
        assert torch.allclose(tensor, expected, atol=1e-7), name
    assert averaged.training == {} and averaged.vocabularies == checkpoints[0].vocabularies


def test_checkpoints_of_different_models_do_not_average(vocab):
    other = tiny_model(vocab, hidden_size=12)  # another decoder size: other weight shapes
    with pytest.raises(UserError, match="not a checkpoint of the same model.*weights"):
        average_checkpoints([checkpoint_of(tiny_model(vocab), vocab), checkpoint_of(other, vocab)], ["a.pt", "b.pt"])


@pytest.mark.parametrize(
    "decoder, section, key, value, shown",
    [
        (TINY_TRANSFORMER, "decoder", "heads", 4, "decoder.heads 2 vs 4"),
        ({}, "decoder", "normaliser", "sparsemax", "decoder.normaliser 'softmax' vs 'sparsemax'"),
    ],
    ids=["transformer heads", "rnn normaliser"],
)
def test_checkpoints_whose_configs_define_other_models_do_not_average(vocab, decoder, section, key, value, shown):
    """Other heads or another normaliser keep every weight's shape: the configs tell the models apart."""
    first = checkpoint_of(tiny_model(vocab, **decoder), vocab, **decoder)
    config = copy.deepcopy(first.config)
    config[section][key] = value
    other = dataclasses.replace(first, config=config)
    message = rf"b.pt is not a checkpoint of the same model as a.pt: their configs differ \(a.pt vs b.pt\): {shown}; only one model's"
    with pytest.raises(UserError, match=message):
        average_checkpoints([first, other], ["a.pt", "b.pt"])
    config = copy.deepcopy(first.config)
    config["train"]["epochs"] = 40  # a resumed run's later epochs: the same model
    assert average_checkpoints([first, dataclasses.replace(first, config=config)], ["a.pt", "b.pt"]).config == config


def test_configs_that_differ_only_where_neither_model_reads_average(vocab):
    """A translator has no image encoder and an RNN decoder no heads (attnkit.config.unread_keys): configs that differ
    there describe one model."""
    first = checkpoint_of(tiny_model(vocab), vocab)
    config = copy.deepcopy(first.config)
    config["image_encoder"]["image_size"], config["decoder"]["heads"] = 64, 2
    assert average_checkpoints([first, dataclasses.replace(first, config=config)], ["a.pt", "b.pt"]).config == config


def test_average_replaces_an_existing_out_only_with_overwrite(vocab, tmp_path, capsys):
    run = tmp_path / "run"
    epochs = [str(save_checkpoint(run / f"epoch-{seed}.pt", checkpoint_of(tiny_model(vocab, seed=seed), vocab))) for seed in (1, 2)]
    for name in ("best.pt", "last.pt"):
        save_checkpoint(run / name, checkpoint_of(tiny_model(vocab, seed=0), vocab))
    (tmp_path / "mean.pt").write_bytes(b"an earlier mean")
    kept = {path: path.read_bytes() for path in (run / "best.pt", tmp_path / "mean.pt")}
    for out, message in [
        (run / "best.pt", f"error: --out {run / 'best.pt'} exists (the best.pt of the run in {run}); pass --overwrite to replace it"),
        (tmp_path / "mean.pt", f"error: --out {tmp_path / 'mean.pt'} exists; pass --overwrite to replace it"),
    ]:
        assert run_cli(average.main, [*epochs, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
    last = (run / "last.pt").read_bytes()
    assert run_cli(average.main, [*epochs, "--out", str(run / "last.pt"), "--overwrite"]) == 2  # the run could not be resumed
    assert capsys.readouterr().err.startswith(f"error: --out {run / 'last.pt'} is the training state of the run in {run}")
    assert (run / "last.pt").read_bytes() == last
    with RunFolder(run).claim():  # a training writes the run: its best.pt is not replaced under it
        assert run_cli(average.main, [*epochs, "--out", str(run / "best.pt"), "--overwrite"]) == 2
    assert "is being written by another training" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in kept} == kept

    assert run_cli(average.main, [*epochs, "--out", str(run / "best.pt"), "--overwrite"]) == 0
    averaged = load_checkpoint(run / "best.pt").model
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (load_checkpoint(epochs[0]).model[name] + load_checkpoint(epochs[1]).model[name]) / 2, msg=name)


def test_two_runs_checkpoints_average_only_when_asked(vocab, tmp_path, capsys):
    """Epoch checkpoints carry no run_id: two seeds of one recipe averaged without a word, into a model that
    translates next to nothing (docs/training.md)."""
    def run_folder(name: str, run_id: str, seed: int) -> str:
        checkpoint = checkpoint_of(tiny_model(vocab, seed=seed), vocab)
        save_checkpoint(tmp_path / name / "last.pt", dataclasses.replace(checkpoint, training={"progress": {"run_id": run_id, "epoch": 1}}))
        return str(save_checkpoint(tmp_path / name / "epoch-1.pt", checkpoint))

    seed_1, seed_2, resumed_elsewhere = run_folder("seed-1", "aaaa", 1), run_folder("seed-2", "bbbb", 2), run_folder("copy", "aaaa", 3)
    mean = tmp_path / "mean.pt"
    assert run_cli(average.main, [seed_1, seed_2, "--out", str(mean)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: these checkpoints come from 2 runs") and "--across-runs" in err and "compare them one by one" in err and err.count("\n") == 1, err
    assert not mean.exists()
    assert run_cli(average.main, [seed_1, seed_2, "--out", str(mean), "--across-runs"]) == 0  # a soup of fine-tunes
    assert run_cli(average.main, [seed_1, resumed_elsewhere, str(mean), "--out", str(tmp_path / "again.pt")]) == 0
    assert capsys.readouterr().err == ""  # one run in two folders, and a mean outside any run


def test_a_kill_after_the_last_epoch_s_checkpoint_leaves_no_epoch_too_many(toy_data, tmp_path, monkeypatch):
    """The oldest epoch file went after last.pt was written: killed in between on the run's last epoch, the folder kept
    keep_epochs + 1 of them, which no resume pruned (nothing was left to train) and `average epoch-*.pt` averaged."""
    import attnkit.train as train_module

    written = train_module.save_checkpoint

    def killed_after_the_last(path, checkpoint):
        written(path, checkpoint)
        if path.name == "last.pt" and checkpoint.training["progress"]["epoch"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "save_checkpoint", killed_after_the_last)
    with pytest.raises(KeyboardInterrupt):
        train_translation(toy_config(toy_data, tmp_path, "train.epochs=2", "train.keep_epochs=1", "train.valid_max_examples=8"), progress_bar=False, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.glob("epoch-*.pt")) == ["epoch-2.pt"]


@pytest.mark.slow
def test_keep_epochs_then_average_end_to_end(toy_data, tmp_path, capsys, bench):
    config = toy_config(toy_data, tmp_path / "run", "train.epochs=3", "train.keep_epochs=2", "train.patience=0")
    train_translation(config, progress_bar=False, log=lambda _: None)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("epoch-*.pt")) == ["epoch-2.pt", "epoch-3.pt"]  # epoch 1 was dropped
    epoch_3 = load_checkpoint(run / "epoch-3.pt")
    assert epoch_3.training == {}  # weights only
    assert all(torch.equal(epoch_3.model[k], v) for k, v in load_checkpoint(run / "last.pt").model.items())

    out = tmp_path / "averaged.pt"
    assert run_cli(average.main, [str(run / "epoch-2.pt"), str(run / "epoch-3.pt"), "--out", str(out)]) == 0
    assert "the mean of 2 checkpoints" in capsys.readouterr().out
    assert Translator.from_checkpoint(out, device="cpu").translate(["a b c"])[0][0].error is None

    # bench/multi30k.py tests the mean instead of best.pt only when it scores higher on validation
    translator, choice = bench("multi30k").choose_checkpoint(run, read_parallel(toy_data, "valid", "src", "tgt"))
    scores = choice["valid_bleu_greedy"]
    assert choice["averaged_epochs"] == [2, 3] and set(scores) == {"best.pt", "averaged.pt"}
    assert choice["chosen"] == max(scores, key=scores.get) and (run / "averaged.pt").is_file()
    tested_weights = load_checkpoint(run / choice["chosen"]).model  # the translator returned is the chosen checkpoint's
    for name, tensor in translator.model.state_dict().items():
        torch.testing.assert_close(tensor, tested_weights[name], msg=name)

    # --overwrite removes the old run's epoch checkpoints with its other files
    train_translation(toy_config(toy_data, run, "train.epochs=1"), overwrite=True, progress_bar=False, log=lambda _: None)
    assert not list(run.glob("epoch-*.pt"))


def test_average_bad_input(vocab, tmp_path, capsys):
    path = tmp_path / "one.pt"
    save_checkpoint(path, checkpoint_of(tiny_model(vocab), vocab))
    other = tmp_path / "two.pt"
    save_checkpoint(other, checkpoint_of(tiny_model(vocab, seed=1), vocab))
    before = path.read_bytes()
    for argv, message in [
        ([str(path), str(path), "--out", str(tmp_path / "x.pt")], "given twice"),
        ([str(path), str(tmp_path / "." / "one.pt"), "--out", str(tmp_path / "x.pt")], "given twice"),
        ([str(other), str(path), "--out", str(path)], "is one of the checkpoints to average"),
        ([str(other), str(path), "--out", str(tmp_path / "sub" / ".." / "one.pt")], "is one of the checkpoints to average"),
        ([str(tmp_path / "missing.pt"), "--out", str(tmp_path / "x.pt")], "checkpoint not found"),
        ([str(path), "--out", str(tmp_path)], "--out"),
    ]:
        assert run_cli(average.main, argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert path.read_bytes() == before and not (tmp_path / "x.pt").exists()
