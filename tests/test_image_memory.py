"""bench/image_memory.py: the image-memory candidates train on a slice of Flickr8k and are measured end to end."""

import json
import sys
from pathlib import Path

import pytest

from attnkit.errors import UserError
from conftest import needs_shared

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def image_memory(monkeypatch):
    needs_shared("flickr8k", "images")
    monkeypatch.syspath_prepend(str(BENCH))
    import image_memory

    yield image_memory
    sys.modules.pop("image_memory", None)


@pytest.mark.slow
def test_two_candidates_train_and_are_measured_in_one_table(image_memory, tmp_path, capsys):
    out = tmp_path / "memory"
    argv = ["--quick", "--no-progress", "--out", str(out), "--candidate", "recipe:", "--candidate", "penalty 1: train.attention_regularization=1"]
    assert image_memory.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mode"] == "quick" and set(result["candidates"]) == {"recipe", "penalty 1"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["penalty 1"]["overrides"] == ["train.attention_regularization=1"] and saved["recipe"]["grid"] == [7, 7]
    study = saved["recipe"]["study"]
    assert study["photos"] == 8 and len(study["mosaic"]["arrangements"]) == 8
    assert set(study["erasure"]["by_group"]) <= {"content", "function", "punctuation"} and 0.0 <= study["mosaic"]["mass"] <= 1.0
    table = (out / "table.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[4:]] == ["recipe", "penalty 1"]

    # Measured again without training, and a captioner trained elsewhere beside them.
    again = ["--quick", "--no-progress", "--out", str(out), "--evaluate-only", "--candidate", "recipe:", "--checkpoint", f"elsewhere: {out / 'penalty_1' / 'best.pt'}"]
    assert image_memory.main(again) == 0
    rerun = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["candidates"]
    assert rerun["recipe"] == result["candidates"]["recipe"]  # the same model, photos and seed: the same figures
    assert rerun["elsewhere"] == result["candidates"]["penalty 1"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--candidate", "no colon here"], "must look like 'NAME: ...'"),
        (["--checkpoint", "x: missing.pt"], "no checkpoint at missing.pt"),
        (["--evaluate-only", "--candidate", "never trained:"], "has no model in"),
        (["--photos", "3", "--candidate", "a:"], "the mosaics need at least 4"),
    ],
)
def test_bad_input_is_one_clear_message(image_memory, tmp_path, argv, message):
    with pytest.raises(UserError, match=message):
        image_memory.main([*argv, "--quick", "--out", str(tmp_path / "out")])
