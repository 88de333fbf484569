"""bench/scst_start.py: what a self-critical stage starts from (its samples' reward and spread, its entropy per word)."""

import json

import pytest

from attnkit.captioning import train_captioning
from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.config import load_config
from attnkit.errors import run_cli
from test_captioning import TINY, write_shape_images


@pytest.fixture
def scst_start(bench):
    return bench("scst_start")


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_sharper_output_layer_lowers_the_entropy_and_no_dropout_draws_alike(tmp_path, capsys, scst_start):
    data = write_shape_images(tmp_path)
    config = load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY])  # decoder.dropout=0
    train_captioning(config, progress_bar=False, log=lambda _: None)
    start = load_checkpoint(tmp_path / "run" / "best.pt")
    for key in ("decoder.output.weight", "decoder.output.bias"):  # the logits x 10: a far more peaked softmax
        start.model[key] = start.model[key] * 10
    save_checkpoint(tmp_path / "sharper.pt", start)
    start.config["decoder"]["dropout"] = 0.5  # sharper.pt's weights, read through dropout while sampling
    save_checkpoint(tmp_path / "dropout.pt", start)
    checkpoints = [tmp_path / "run" / "best.pt", tmp_path / "sharper.pt", tmp_path / "dropout.pt"]
    argv = [*(f"--checkpoint={path}" for path in checkpoints), "--photos", "8", "--cache", "", "--device", "cpu"]
    assert scst_start.main(argv) == 0
    plain, sharper, dropout = last_json(capsys)["rows"]
    assert plain["train"]["photos"] == 8 and plain["valid"]["photos"] == 12  # the first N training photos, every validation photo
    for row in (plain, sharper):
        for split in ("train", "valid"):  # no dropout in this decoder: both modes draw the same captions
            assert row[split]["sample_cider_d"] == row[split]["sample_cider_d_eval"]
    assert sharper["train"]["nats_per_word"] < plain["train"]["nats_per_word"] / 2
    assert dropout["train"]["sample_cider_d"] != dropout["train"]["sample_cider_d_eval"]
    assert all(dropout["train"][key] == sharper["train"][key] for key in ("greedy_cider_d", "sample_cider_d_eval", "nats_per_word"))  # eval mode: no dropout
    assert scst_start.main(argv[2:]) == 0  # measured first this time: seeded, its dropout masks too, so the same figures
    assert last_json(capsys)["rows"] == [dropout]


def test_a_missing_checkpoint_is_one_message(tmp_path, capsys, scst_start):
    assert run_cli(scst_start.main, ["--checkpoint", str(tmp_path / "missing.pt")]) == 2
    assert "missing.pt" in capsys.readouterr().err
