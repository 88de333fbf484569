"""bench/image_memory.py: the image-memory candidates train on a slice of Flickr8k and are measured end to end."""

import json

import pytest

from attnkit.errors import UserError
from conftest import needs_shared


@pytest.fixture
def memory_bench(bench):
    """The benchmark's module, for what it checks before it reads any data."""
    return bench("image_memory")


@pytest.fixture
def image_memory(memory_bench):
    needs_shared("flickr8k", "images")
    return memory_bench


@pytest.mark.slow
def test_two_candidates_train_and_are_measured_in_one_table(image_memory, tmp_path, capsys):
    out = tmp_path / "memory"
    argv = ["--quick", "--no-progress", "--out", str(out), "--candidate", "recipe:", "--candidate", "penalty 1: train.attention_regularization=1"]
    assert image_memory.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mode"] == "quick" and set(result["candidates"]) == {"recipe", "penalty 1"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["penalty 1"]["overrides"] == ["train.attention_regularization=1"] and saved["recipe"]["grid"] == [9, 9]  # the recipe's Lite2 grid
    study = saved["recipe"]["study"]
    assert study["photos"] == 8 and len(study["mosaic"]["arrangements"]) == 8
    assert set(study["erasure"]["by_group"]) <= {"content", "function", "punctuation"} and 0.0 <= study["mosaic"]["mass"] <= 1.0
    assert 0.0 <= study["mosaic"]["reading"]["mass"] <= 1.0  # the step that has read each word, beside the emitting step
    for form in ("attention", "input", "windows"):  # each word's attention against its importance maps (the defaults)
        agreed = study["agreement"][form]
        assert -1 <= agreed["rank_correlation"] <= 1 and agreed["steps"] > 0 and set(agreed["by_group"]) <= {"content", "function", "punctuation"}
    table = (out / "table.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[4:]] == ["recipe", "penalty 1"]

    # Measured again without training, and a captioner trained elsewhere beside them.
    again = ["--quick", "--no-progress", "--out", str(out), "--evaluate-only", "--candidate", "recipe:", "--checkpoint", f"elsewhere: {out / 'penalty_1' / 'best.pt'}"]
    assert image_memory.main(again) == 0
    rerun = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["candidates"]
    assert rerun["recipe"] == result["candidates"]["recipe"]  # the same model, photos and seed: the same figures
    assert rerun["elsewhere"] == result["candidates"]["penalty 1"]

    # The norm-weighted view of the attention against the importance estimators (issue 45's third lever).
    viewed = ["--quick", "--no-progress", "--out", str(tmp_path / "viewed"), "--checkpoint", f"elsewhere: {out / 'penalty_1' / 'best.pt'}", "--importance", "windows,norm_weighted"]
    assert image_memory.main(viewed) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["candidates"]["elsewhere"]
    assert found["content_agreement_windows"] == rerun["elsewhere"]["content_agreement_windows"]  # the default windows, hidden from attention
    assert -1 <= found["content_norm_weighted_agreement_windows"] <= 1 and "content_norm_weighted_agreement_norm_weighted" not in found


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--candidate", "no colon here"], "must look like 'NAME: ...'"),
        (["--checkpoint", "x: missing.pt"], "no checkpoint at missing.pt"),
        (["--evaluate-only", "--candidate", "never trained:"], "has no model in"),
        (["--photos", "3", "--candidate", "a:"], "the mosaics need at least 4"),
        (["--hide-at", "image=pixels", "--candidate", "a:"], "unknown place to hide a position 'pixels'"),
    ],
)
def test_bad_input_is_one_clear_message(image_memory, tmp_path, argv, message):
    with pytest.raises(UserError, match=message):
        image_memory.main([*argv, "--quick", "--out", str(tmp_path / "out")])


@pytest.fixture
def no_work(memory_bench, monkeypatch):
    """Training or preparing data is a failure of these tests: everything they check comes before it."""

    def refused(*args, **kwargs):
        raise AssertionError("work started before the bad input was refused")

    monkeypatch.setattr(memory_bench, "train_captioning", refused)
    monkeypatch.setattr(memory_bench, "busy_cores", refused)
    monkeypatch.setattr(memory_bench.prepare_flickr8k, "main", refused)
    return memory_bench


@pytest.mark.parametrize(
    "candidates, message",
    [
        (["..: train.lr=0.001"], "the name must hold a letter or a digit"),
        (["x y:", "x_y: train.lr=0.001"], "--candidate 'x y' and 'x_y' would train into one folder"),
        (["Recipe:", "recipe: train.lr=0.001"], "would train into one folder"),  # one folder on a case-insensitive disk
        (["a:", "a: train.lr=0.001"], "--candidate 'a' is given twice"),
        (["results.json:"], "its run folder would be --out's results.json"),
        (["good:", "bad: train.epochz=3"], "unknown config key train.epochz"),  # found before 'good' trains
    ],
)
def test_bad_candidates_are_refused_before_any_work(no_work, tmp_path, candidates, message):
    with pytest.raises(UserError, match=message):
        no_work.main(["--quick", "--out", str(tmp_path / "out"), *(a for c in candidates for a in ("--candidate", c))])


def test_a_run_the_benchmark_did_not_train_is_never_replaced(no_work, tmp_path):
    run = tmp_path / "x"
    run.mkdir()
    (run / "last.pt").write_bytes(b"someone's run")
    with pytest.raises(UserError, match="must hold a letter or a digit"):  # '..' of --out x/bench is x
        no_work.main(["--quick", "--out", str(run / "bench"), "--candidate", "..: train.lr=0.001"])
    with pytest.raises(UserError, match=f"{run} holds a run this benchmark did not train"):
        no_work.main(["--quick", "--out", str(tmp_path), "--candidate", "x: train.lr=0.001"])
    assert (run / "last.pt").read_bytes() == b"someone's run" and sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_a_run_the_benchmark_trained_is_replaced_and_one_it_measures_is_not(memory_bench, tmp_path):
    folders = memory_bench.run_folders(["7x7, penalty 0", "v1.5-b"], tmp_path)
    assert folders == {"7x7, penalty 0": tmp_path / "7x7_penalty_0", "v1.5-b": tmp_path / "v1.5-b"}
    ours = folders["7x7, penalty 0"]
    ours.mkdir()
    (ours / "best.pt").write_bytes(b"an earlier run of the benchmark")
    (ours / memory_bench.OWNER).write_text("7x7, penalty 0\n")
    memory_bench.check_ours(folders)  # no error: the benchmark's own run, which training replaces
    with pytest.raises(UserError, match="it would be replaced before it is measured"):
        memory_bench.main(["--quick", "--out", str(tmp_path), "--candidate", "7x7, penalty 0:", "--checkpoint", f"old: {ours / 'best.pt'}"])
