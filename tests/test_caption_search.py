"""bench/caption_search.py: beam sizes x length penalties scored on a split, with the lengths that explain them."""

import json

import pytest

from attnkit.captioning import train_captioning
from attnkit.config import load_config
from attnkit.errors import run_cli
from test_captioning import TINY, write_shape_images


@pytest.fixture
def caption_search(bench):
    return bench("caption_search")


@pytest.mark.slow
def test_every_setting_is_scored_with_its_lengths(tmp_path, capsys, caption_search):
    data = write_shape_images(tmp_path)
    config = load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    argv = ["--checkpoint", str(tmp_path / "run" / "best.pt"), "--cache", "", "--beams", "1,2", "--alphas", "0,1", "--device", "cpu"]
    assert caption_search.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(row["beam"], row["alpha"]) for row in result["rows"]] == [(1, 0.0), (2, 0.0), (2, 1.0)]  # greedy once: alpha changes nothing
    assert all(row["mean_length"] >= 0 and 0 <= row["brevity_penalty"] <= 1 and row["reference_mean_length"] == 3.0 for row in result["rows"])  # "a red square ." and "A red square"
    assert result["images"] == 12 and result["split"] == "valid"


def test_length_figures_give_bleu_s_brevity_penalty(caption_search):
    figures = caption_search.length_figures([["a", "dog"]], [[["a", "dog", "runs"], ["a", "big", "dog", "runs", "."]]])
    assert figures["mean_length"] == 2 and figures["reference_mean_length"] == 3.5  # "." is not a word
    assert figures["brevity_penalty"] == pytest.approx(0.607, abs=1e-3)  # exp(1 - 3 / 2): the closest reference has 3 words


@pytest.mark.parametrize("argv, message", [(["--alphas", "-1"], "at least 0"), (["--alphas", "1,1"], "none twice"), (["--beams", "0"], "at least 1")])
def test_bad_settings_are_one_message(tmp_path, capsys, caption_search, argv, message):
    assert run_cli(caption_search.main, ["--checkpoint", str(tmp_path / "missing.pt"), *argv]) == 2
    assert message in capsys.readouterr().err
