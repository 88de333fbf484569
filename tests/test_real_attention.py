"""bench/real_attention.py: the real joint recipe trains on a slice of the shared data and the study runs end to end."""

import json
from pathlib import Path

import pytest

from attnkit.checkpoint import load_checkpoint
from attnkit.errors import UserError, run_cli
from conftest import needs_shared, shared_data_root, standing_run_folder

NO_MULTI30K_SENTENCE = "3482062809_3b694322c4.jpg"  # a Flickr8k test photo Multi30k does not describe


@pytest.fixture
def real_attention(bench):
    needs_shared("flickr8k", "images")
    needs_shared("multi30k", "task1", "image_splits")
    return bench("real_attention")


def test_the_study_photos_are_flickr8k_test_photos_with_multi30k_sentences(real_attention):
    photos = real_attention.study_photos(shared_data_root())
    assert len(photos) == 458 and len({p.image for p in photos}) == 458
    assert {p.multi30k_split for p in photos} == {"train", "val", "test_2016_flickr"}
    first = photos[0]
    assert first.german and first.english and (shared_data_root() / "flickr8k" / "images" / first.image).is_file()


def test_word_groups():
    from attnkit.comparison import word_group
    from attnkit.vocab import Vocabulary

    vocab, other = Vocabulary.build([["a", "dog", "runs", ".", "the"]]), Vocabulary.build([["a", "runs", ".", "the"]])
    assert [word_group(w, vocab) for w in ["a", "dog", ".", "the", "zebra"]] == ["function", "content", "punctuation", "function", None]
    assert word_group("dog", vocab, other) is None  # a word counts only where every model knows it


@pytest.mark.slow
def test_the_joint_recipe_trains_on_a_slice_and_the_study_runs_end_to_end(real_attention, tmp_path, capsys):
    out = tmp_path / "study"
    figure = tmp_path / "docs" / "figure.png"
    assert real_attention.main(["--quick", "--no-progress", "--out", str(out), "--figure", str(figure), "--scst-epochs", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mode"] == "quick" and result["training"]["epochs"] == 2
    assert result["training"]["scst"]["epochs"] == 1 and "train.objective=scst" in result["scst_overrides"]
    studied = load_checkpoint(out / "joint-scst" / "best.pt")  # the self-critical stage is what was scored and studied
    assert studied.config["train"]["init_from"] == str(out / "joint" / "best.pt") and studied.task == "multitask"
    joint = result["results"]["joint"]
    assert joint["quality"]["caption"]["images"] == 6 and joint["quality"]["translation"]["sentences"] > 0
    study = joint["study"]
    assert study["sentences"] == 6 and study["words"] == study["attention"]["image"]["words"] + study["unknown_words_left_out"]
    for modality in ("image", "text"):
        assert set(study["attention"][modality]["by_group"]) <= {"content", "function", "punctuation"}
        erasure = study["erasure"][modality]
        assert erasure["steps"] == sum(group["steps"] for group in erasure["by_group"].values())
        assert {"peak_drop", "random_drop", "lowest_drop", "peak_flip", "flip_share"} <= set(erasure)
        localised = study["mosaic"][modality]
        assert 0.0 <= localised["mass"] <= 1.0 and set(localised["by_group"]) <= {"content", "function", "punctuation"}
        assert "content_by_head" in localised and 0.0 <= study["mosaic"]["reading"][modality]["mass"] <= 1.0
        for form in ("attention", "input", "windows"):  # attention against importance (the defaults), by word group and (content words) by head
            agreed = study["agreement"][modality][form]
            assert -1 <= agreed["rank_correlation"] <= 1 and set(agreed["by_group"]) <= {"content", "function", "punctuation"}
            assert "content_by_head" in agreed
    assert study["agreement"]["image"]["input"] == study["agreement"]["image"]["attention"]  # a cell hidden from attention by default: one estimator
    assert result["importance"]["hide_at"] == {"image": "attention", "text": "input"} and result["importance"]["chosen"] == {"image": "windows", "text": "input"}
    assert study["mosaic"]["mosaics"] == 6 and len(study["mosaic"]["arrangements"]) == 6 and study["mosaic"]["seed"] == 0
    assert json.loads((out / "study.json").read_text())["joint"]["study"]["sentences"] == 6
    assert (out / "erasure.png").stat().st_size > 0 and "<script" in (out / "example" / "report.html").read_text()
    assert figure.read_bytes() == (out / "example" / "comparison.png").read_bytes()
    # --resume reads both finished stages back (the quick data were rewritten the same, so their configs match).
    trained = {stage: (out / stage / "last.pt").stat().st_mtime_ns for stage in ("joint", "joint-scst")}
    assert real_attention.main(["--quick", "--no-progress", "--out", str(out), "--scst-epochs", "1", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": reading back the run in") == 2
    again = json.loads(printed.strip().splitlines()[-1])["training"]
    assert again["origin"] == again["scst"]["origin"] == "read back" and result["training"]["origin"] == "trained"
    assert again["train_minutes"] == result["training"]["train_minutes"] and again["scst"]["epochs"] == 1
    assert {stage: (out / stage / "last.pt").stat().st_mtime_ns for stage in ("joint", "joint-scst")} == trained


def test_resume_reads_back_a_finished_stage_continues_one_cut_short_and_replaces_another_config(real_attention, tmp_path, monkeypatch, capsys):
    from argparse import Namespace

    from attnkit.config import load_config, to_dict
    from attnkit.train import TrainingProgress

    recipe = Path(__file__).resolve().parents[1] / "tasks/configs/flickr8k_multi30k_transformer.yaml"
    calls = []  # (run folder, resumed from, overwrite) of each training the stage asked for

    def train_multitask(config, resume=None, overwrite=False, progress_bar=True):
        calls.append((config.run_dir, resume, overwrite))
        return TrainingProgress(epoch=9, seconds=60.0)

    monkeypatch.setattr(real_attention, "train_multitask", train_multitask)
    monkeypatch.setattr(real_attention, "load_checkpoint", lambda path, task=None: f"checkpoint {Path(path).name} for {task}")
    asked = lambda folder, *overrides: load_config(recipe, [f"output_dir={tmp_path / folder}", *overrides])  # noqa: E731
    standing_run_folder(tmp_path / "finished", to_dict(asked("finished")), epoch=7, stop_reason="early stopping")
    standing_run_folder(tmp_path / "cut", to_dict(asked("cut")), epoch=3)
    standing_run_folder(tmp_path / "other", to_dict(asked("other", "train.lr=0.001")), epoch=3, stop_reason="early stopping")
    args = Namespace(evaluate_only=False, no_progress=True)

    assert real_attention.trained_stage(asked("finished"), "stage", args, resume=True) == {"train_minutes": 0.0, "epochs": 7, "stop_reason": "early stopping", "origin": "read back"}
    assert calls == []
    assert real_attention.trained_stage(asked("cut"), "stage", args, resume=True)["origin"] == "continued"
    assert calls.pop() == (tmp_path / "cut", "checkpoint last.pt for multitask", False)
    assert real_attention.trained_stage(asked("other"), "stage", args, resume=True)["origin"] == "trained"  # trained otherwise: replaced
    real_attention.trained_stage(asked("finished"), "stage", args, resume=False)  # without --resume a run there is replaced
    assert calls == [(tmp_path / "other", None, True), (tmp_path / "finished", None, True)]
    printed = capsys.readouterr().out
    assert "reading back the run in" in printed and "continuing the run in" in printed and "from epoch 3" in printed


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--photo", NO_MULTI30K_SENTENCE], "has no Multi30k sentences"),
        (["--photo", "1000268201_693b08cb0e.jpg"], "is not a Flickr8k test photo"),
        (["--captioner", "x.pt"], "both --captioner and --translator"),
        (["--evaluate-only"], "no joint model"),
        (["--photos", "3"], "the mosaics need at least 4"),
        (["--hide-at", "image=pixels"], "unknown place to hide a position 'pixels'"),
        (["--scst-set", "train.lr=0.001"], "--scst-set configures the SCST stage, which --scst-epochs N"),
        (["--scst-epochs", "1", "--scst-set", "train.scst_samples=0"], "train.scst_samples"),
    ],
)
def test_bad_input_is_one_clear_message(real_attention, tmp_path, capsys, argv, message):
    argv = [*argv, "--quick", "--out", str(tmp_path / "out")]
    with pytest.raises(UserError, match=message):
        real_attention.main(argv)
    capsys.readouterr()
    assert run_cli(real_attention.main, argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_the_study_pairs_leave_out_the_test_and_the_caption_validation_photos_and_older_folders_are_prepared_again(real_attention, tmp_path):
    """The caption validation photos' own references were Multi30k training targets (391 of 433): the joint model
    was chosen on captions it had partly learnt by heart. A folder prepared with the test photos alone is redone."""
    from attnkit.data.folder import read_dataset_info, write_dataset_info
    from attnkit.data.text import read_parallel

    captions, pairs = real_attention.ensure_data(shared_data_root(), tmp_path)
    assert real_attention.excluded_lists(pairs) == ["Flickr_8k.testImages.txt", "Flickr_8k.devImages.txt"]
    assert len(read_parallel(pairs, "train", "de", "en")) == 28_167 and len(read_parallel(pairs, "test", "de", "en")) == 1000
    info = read_dataset_info(pairs)
    info["excluded_photos"] = {"list": "/data/flickr8k/Flickr_8k.testImages.txt", "pairs_left_out": {"train": 433, "valid": 11}}
    write_dataset_info(pairs, info)  # as prepared before 2026-12-04
    assert real_attention.excluded_lists(pairs) == ["Flickr_8k.testImages.txt"]
    real_attention.ensure_data(shared_data_root(), tmp_path)
    assert real_attention.excluded_lists(pairs) == ["Flickr_8k.testImages.txt", "Flickr_8k.devImages.txt"]
