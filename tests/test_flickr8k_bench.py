"""bench/flickr8k.py: a mistake in its options is one message before any data is prepared or any model trained."""

from pathlib import Path

import pytest

from attnkit.errors import run_cli
from conftest import standing_run_folder


@pytest.fixture
def flickr8k(bench, monkeypatch):
    flickr8k = bench("flickr8k")
    monkeypatch.setattr(flickr8k, "ensure_dataset", lambda *_: pytest.fail("prepared data before checking the options"))
    monkeypatch.setattr(flickr8k, "train_captioning", lambda *_a, **_k: pytest.fail("trained before checking the options"))
    return flickr8k


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--choose", "train.no_such_key=1,2"], "no_such_key"),
        (["--choose", "decoder.dropout=0.1,7"], "decoder.dropout"),
        (["--set", "decoder.nope=1"], "nope"),
        (["--seeds", "0,1,0"], "names 0 twice"),
        (["--seeds", "zero"], "whole numbers"),
        (["--beams", "0,5"], "at least 1"),
        (["--beams", "5,5"], "names 5 twice"),
        (["--choose", "decoder.dropout"], "must look like"),
        (["--ensemble", "--seeds", "3"], "--ensemble decodes the seeds' checkpoints together: give at least two --seeds"),
        (["--scst-set", "train.lr=0.001"], "--scst-epochs N (N >= 1) runs the SCST stage"),
        (["--scst-epochs", "-1"], "--scst-epochs N (N >= 1)"),
        (["--scst-epochs", "2", "--scst-set", "train.scst_baseline=best"], "unknown SCST baseline 'best'"),
        (["--scst-epochs", "2", "--set", "train.label_smoothing=0.1"], "train.label_smoothing: it smooths the cross-entropy targets"),
    ],
)
def test_bad_options_are_one_message_before_any_work(flickr8k, capsys, argv, message):
    assert run_cli(flickr8k.main, argv) == 2
    assert message in capsys.readouterr().err


def test_numbers_and_their_summary(flickr8k):
    assert flickr8k.numbers("0, 1,2", "--seeds", 0) == [0, 1, 2]
    assert flickr8k.mean_and_spread([21.0, 22.5]) == {"mean": 21.75, "spread": 1.5, "runs": [21.0, 22.5]}
    # METEOR is None where Java or its jar is missing (the lent GPU machine): not measured, not a crash
    assert flickr8k.mean_and_spread([None, None]) == {"mean": None, "spread": None, "runs": [None, None]}


def test_reuse_takes_a_finished_run_of_the_same_training_and_continues_one_cut_short(flickr8k, tmp_path):
    from attnkit.config import load_config, to_dict

    recipe = Path(__file__).resolve().parents[1] / "tasks/configs/flickr8k.yaml"

    def asked(*overrides):
        return load_config(recipe, ["output_dir=elsewhere", "train.epochs=10", *overrides])

    saved = to_dict(asked("train.seed=0"))
    saved["data"]["target_lang"] = "en"  # asked as "" (resolved by training): any saved value is the same run
    standing_run_folder(tmp_path / "a-seed0", {**saved, "output_dir": str(tmp_path / "a-seed0")}, epoch=10)
    standing_run_folder(tmp_path / "b-seed1", to_dict(asked("train.seed=1")), epoch=6)  # cut short, no stop reason: not finished
    standing_run_folder(tmp_path / "c-seed2", to_dict(asked("train.seed=2")), epoch=4, stop_reason="early stopping", best=False)
    standing_run_folder(tmp_path / "d-seed3", to_dict(asked("train.seed=3")), epoch=4, stop_reason="early stopping")
    older = to_dict(asked("train.seed=5"))
    del older["train"]["objective"], older["train"]["scst_samples"]  # saved before these keys existed: it trained with their defaults
    standing_run_folder(tmp_path / "f-seed5", older, epoch=10)

    found = flickr8k.finished_run(tmp_path, asked("train.seed=0", "search.beam_size=3", "train.keep_epochs=2"))  # decoding and kept epochs differ
    assert found is not None and found[0] == tmp_path / "a-seed0" and found[1].epoch == 10
    assert flickr8k.finished_run(tmp_path, asked("train.seed=0", "train.lr=0.001")) is None  # trained otherwise
    assert flickr8k.finished_run(tmp_path, asked("train.seed=0", "data.target_lang=de")) is None  # a pinned value must match
    assert flickr8k.finished_run(tmp_path, asked("train.seed=1")) is None
    assert flickr8k.finished_run(tmp_path, asked("train.seed=2")) is None  # no best.pt
    assert flickr8k.finished_run(tmp_path, asked("train.seed=3"))[0] == tmp_path / "d-seed3"
    assert flickr8k.finished_run(tmp_path, asked("train.seed=5"))[0] == tmp_path / "f-seed5"
    assert flickr8k.finished_run(tmp_path, asked("train.seed=5", "train.scst_samples=3")) is None  # not the default it trained with
    # The run cut short is continued in its own folder, never from another one.
    assert flickr8k.cut_short_run(tmp_path / "b-seed1", asked("train.seed=1")) == tmp_path / "b-seed1" / "last.pt"
    assert flickr8k.cut_short_run(tmp_path / "other-seed1", asked("train.seed=1")) is None
    assert flickr8k.cut_short_run(tmp_path / "b-seed1", asked("train.seed=1", "train.lr=0.001")) is None
    assert flickr8k.cut_short_run(tmp_path / "new" / "b-seed1", asked("train.seed=1")) is None  # a run folder not made yet
    # Run folders are named by what they train: a changed recipe never trains into an earlier recipe's folder.
    digest = flickr8k.training_digest
    assert digest(asked("train.seed=0")) == digest(asked("train.seed=0", "search.length_penalty=0.5", "output_dir=x"))
    assert digest(asked("train.seed=0")) != digest(asked("train.seed=0", "train.lr=0.001"))
    (tmp_path / "e-seed4").mkdir()
    (tmp_path / "e-seed4" / "last.pt").write_text("not a checkpoint")
    assert flickr8k.finished_run(tmp_path, asked("train.seed=4")) is None
