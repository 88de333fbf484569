"""train.tensorboard: the event file holds each epoch's scalars and one validation example's attention (read back
with TensorBoard's own reader); the joint model shows both attentions; --resume hides the redone epochs' events;
--overwrite removes them; a missing tensorboard package is one message before any work."""

import sys

import pytest

from attnkit.config import load_config
from attnkit.data.scenes import write_scene_dataset
from attnkit.errors import UserError
from attnkit.multitask import train_multitask
from attnkit.translation import train_translation
from attnkit.watch import FOLDER, scalars

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator", reason="the tensorboard package (pip install 'attnkit[tensorboard]')")
TINY = ["data.tokenizer.kind=space", "text_encoder.embedding_size=8", "text_encoder.hidden_size=8", "decoder.embedding_size=8",
        "decoder.hidden_size=16", "decoder.attention_size=8", "train.batch_size=16", "train.device=cpu", "train.tensorboard=true"]  # fmt: skip
SCALARS = {"train/loss", "train/perplexity", "train/tokens_per_s", "train/learning_rate", "train/epoch_seconds"}


def read_events(run):
    events = event_accumulator.EventAccumulator(str(run / FOLDER), size_guidance={event_accumulator.IMAGES: 0, event_accumulator.SCALARS: 0})
    events.Reload()
    return events


def test_each_epoch_writes_its_scalars_and_the_attention_of_one_validation_sentence(toy_data, tmp_path):
    run = tmp_path / "run"
    train_translation(load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=2", *TINY]), progress_bar=False, log=lambda _: None)
    events = read_events(run)
    tags = events.Tags()
    assert SCALARS | {"valid/bleu", "valid/chrf", "valid/score"} <= set(tags["scalars"])
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2]  # the step is the epoch
    assert tags["images"] == ["attention/translation"]
    images = events.Images("attention/translation")
    assert [image.step for image in images] == [1, 2] and all(image.width > 100 and image.height > 100 for image in images)


def test_the_joint_model_shows_the_photo_s_and_the_sentence_s_attention(tmp_path):
    scenes = write_scene_dataset(tmp_path / "scenes", {"train": 24, "valid": 4}, seed=0, size=64)
    run = tmp_path / "run"
    config = load_config(None, [
        "task=multitask", f"data.path={scenes}/captions", f"data.text_path={scenes}/text", "image_encoder.backbone=resnet18",
        "image_encoder.weights=none", "image_encoder.image_size=64", "image_encoder.grid_size=2", "image_encoder.memory_size=16",
        "text_encoder.hidden_size=16", f"output_dir={run}", "train.epochs=1", *TINY,
    ])  # fmt: skip
    train_multitask(config, progress_bar=False, log=lambda _: None)
    events = read_events(run)
    assert sorted(events.Tags()["images"]) == ["attention/caption", "attention/translation"]
    assert {"valid/caption_bleu4", "valid/bleu"} <= set(events.Tags()["scalars"])


def test_resume_hides_the_events_of_a_killed_epoch_and_overwrite_removes_them(toy_data, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from attnkit.checkpoint import load_checkpoint

    run = tmp_path / "run"
    train_translation(load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=1", *TINY]), progress_bar=False, log=lambda _: None)
    killed = SummaryWriter(log_dir=str(run / FOLDER))  # epoch 2 logged, then killed before its checkpoints
    killed.add_scalar("train/loss", 999.0, 2)
    killed.close()
    config = load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=2", *TINY])
    train_translation(config, resume=load_checkpoint(run / "last.pt"), progress_bar=False, log=lambda _: None)
    losses = read_events(run).Scalars("train/loss")
    assert [event.step for event in losses] == [1, 2] and losses[1].value != 999.0  # the redone epoch shows once

    user_file = run / FOLDER / "notes.txt"
    user_file.write_text("mine")
    train_translation(load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=1", *TINY]), overwrite=True, progress_bar=False, log=lambda _: None)
    assert [event.step for event in read_events(run).Scalars("train/loss")] == [1]  # the earlier run's events are gone
    assert user_file.read_text() == "mine"  # the folder's other files are the user's


def test_a_missing_tensorboard_package_is_one_message_before_any_work(toy_data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when tensorboard is not installed
    run = tmp_path / "run"
    with pytest.raises(UserError, match=r"train.tensorboard: true needs the tensorboard package: pip install 'attnkit\[tensorboard\]'"):
        train_translation(load_config(None, [f"data.path={toy_data}", f"output_dir={run}", *TINY]), progress_bar=False, log=lambda _: None)
    assert not run.exists()


@pytest.mark.parametrize("unusable, message", [("file", "is a file, not a folder"), ("dangling link", "is a link to nowhere/events, which does not exist")])
def test_a_file_or_a_dangling_link_where_the_events_go_is_one_message_before_training(toy_data, tmp_path, capsys, unusable, message):
    from attnkit.commands import train
    from attnkit.errors import run_cli
    from conftest import ROOT

    run = tmp_path / "run"
    run.mkdir()
    if unusable == "file":
        (run / FOLDER).write_text("x\n")
    else:
        (run / FOLDER).symlink_to("nowhere/events")
    argv = ["--config", str(ROOT / "tasks/configs/tiny.yaml"), "--no-progress", *(a for o in [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=1", "train.tensorboard=true"] for a in ("--set", o))]
    assert run_cli(train.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: train.tensorboard: {run / FOLDER} {message}") and "Traceback" not in err
    assert "move it away, or set train.tensorboard=false" in err
    assert sorted(p.name for p in run.iterdir()) == [FOLDER]  # refused before training: no checkpoint, no log


def test_scalars_take_every_number_of_an_epoch_s_record_and_nothing_else():
    record = {"epoch": 3, "step": 9, "train_loss": 2.5, "train_ppl": 12.2, "train_tokens_per_s": 900.0, "lr": 0.001, "epoch_seconds": 4.0,
              "valid": {"bleu": 12.5, "score": 12.5, "signature": "x", "flag": True}, "best": True}  # fmt: skip
    assert scalars(record) == {
        "train/loss": 2.5, "train/perplexity": 12.2, "train/tokens_per_s": 900.0, "train/learning_rate": 0.001,
        "train/epoch_seconds": 4.0, "valid/bleu": 12.5, "valid/score": 12.5,
    }  # fmt: skip


def test_an_objective_s_own_statistics_become_scalars_and_a_missing_perplexity_is_left_out():
    record = {"epoch": 1, "step": 5, "train_loss": 1.2, "train_tokens_per_s": 800.0, "lr": 5e-05, "train_statistics": {"reward": 0.44}, "valid": {"cider_d": 49.7}}
    assert scalars(record) == {"train/loss": 1.2, "train/tokens_per_s": 800.0, "train/learning_rate": 5e-05, "train/reward": 0.44, "valid/cider_d": 49.7}


def test_a_rewind_with_overwrite_keeps_the_events_of_the_epochs_it_keeps(toy_data, tmp_path):
    """--overwrite from an earlier checkpoint of the folder's own run removed all its events: those of the epochs up
    to the one resumed stay, and the redone epochs show once (the writer's purge_step)."""
    from attnkit.checkpoint import load_checkpoint

    run = tmp_path / "run"
    train_translation(load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=2", *TINY]), progress_bar=False, log=lambda _: None)
    first = load_checkpoint(run / "last.pt")
    more = load_config(None, [f"data.path={toy_data}", f"output_dir={run}", "train.epochs=3", *TINY])
    train_translation(more, resume=first, progress_bar=False, log=lambda _: None)
    train_translation(more, resume=first, overwrite=True, progress_bar=False, log=lambda _: None)  # epoch 3 again
    assert [event.step for event in read_events(run).Scalars("train/loss")] == [1, 2, 3]
