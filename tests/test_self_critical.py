"""Self-critical sequence training: the objective raises a reward, a run starts from a cross-entropy run and resumes
exactly, the config refuses what SCST cannot train, and the reward is the CIDEr-D the metric gives."""

import json

import pytest
import torch

from attnkit.captioning import CaptionPipeline, train_captioning
from attnkit.checkpoint import load_checkpoint
from attnkit.config import load_config
from attnkit.data.batching import Batch
from attnkit.errors import UserError
from attnkit.interfaces import GridFeatures
from attnkit.model import build_captioning_model
from attnkit.self_critical import SelfCriticalObjective, cider_d_reward
from test_captioning import TINY, write_shape_images


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return write_shape_images(tmp_path_factory.mktemp("scst-scenes"))


def _toy_captioner(scenes):
    """A tiny captioner with random weights over the shapes' vocabulary, reading random 2 x 2 grids."""
    config = load_config(None, [f"data.path={scenes}", *TINY, "image_encoder.trainable_blocks=0"])
    pipeline = CaptionPipeline.build(config, ["a red square", "a blue circle", "a green square", "a white circle"], "en")
    torch.manual_seed(0)
    return build_captioning_model(config, pipeline.vocab, load_weights=False), pipeline.vocab


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_self_critical_training_raises_a_hand_made_reward(scenes, baseline):
    """Reward 1 for a caption that starts with "red": a few dozen SCST steps make most samples do so."""
    model, vocab = _toy_captioner(scenes)
    starts_red = lambda captions, photos: [float(caption[:1] == ["red"]) for caption in captions]  # noqa: E731
    objective = SelfCriticalObjective(starts_red, vocab, photo_of=list(range(8)), samples=4, baseline=baseline, max_length=5)
    grids = torch.randn(8, model.encoder_for("image").channels, 2, 2)
    batch = Batch(GridFeatures(grids), torch.zeros(8, 2, dtype=torch.long), torch.arange(8))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)

    def mean_reward() -> float:
        with torch.no_grad():
            return objective(model, batch).statistics["reward"].item() / 32

    torch.manual_seed(1)
    before = sum(mean_reward() for _ in range(4)) / 4
    for _ in range(40):
        out = objective(model, batch)
        optimizer.zero_grad()
        out.loss().backward()
        optimizer.step()
    after = sum(mean_reward() for _ in range(4)) / 4
    assert before < 0.3 and after > before + 0.4, (before, after)


def test_under_the_mean_baseline_samples_that_all_score_alike_teach_nothing(scenes):
    """Each sample is compared with the mean of the photo's others: equal rewards give a zero loss (no gradient);
    the reward is logged per sample, and no perplexity (no reference is read)."""
    model, vocab = _toy_captioner(scenes)
    same = SelfCriticalObjective(lambda captions, photos: [0.7] * len(captions), vocab, photo_of=[0, 1], samples=3, max_length=4)
    batch = Batch(GridFeatures(torch.randn(2, model.encoder_for("image").channels, 2, 2)), torch.zeros(2, 2, dtype=torch.long), torch.arange(2))
    out = same(model, batch)
    assert out.loss().item() == pytest.approx(0.0, abs=1e-6) and out.nll_sum is None
    assert out.statistics["reward"].item() == pytest.approx(0.7 * 6) and out.examples.item() == 6


def test_an_scst_step_in_bf16_gives_a_finite_loss_and_gradients(scenes):
    """As the trainer runs it under train.precision=bf16: the log-probabilities and the loss stay fp32."""
    from attnkit.distributed import autocast

    model, vocab = _toy_captioner(scenes)
    reward = lambda captions, photos: [float(len(caption)) for caption in captions]  # noqa: E731
    objective = SelfCriticalObjective(reward, vocab, photo_of=[0, 1, 2], samples=3, max_length=6, attention_regularization=0.5)
    batch = Batch(GridFeatures(torch.randn(3, model.encoder_for("image").channels, 2, 2)), torch.zeros(3, 2, dtype=torch.long), torch.arange(3))
    with autocast(torch.device("cpu"), torch.bfloat16):
        out = objective(model, batch)
    loss = out.loss()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.decoder.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_the_cider_d_reward_is_the_metric_s_per_image_score():
    from attnkit.metrics import CiderD

    references = [[["a", "dog", "runs"], ["a", "brown", "dog", "runs", "fast"]], [["two", "girls", "play"], ["girls", "play", "outside"]]]
    reward = cider_d_reward(references)
    cider = CiderD(references)
    captions = [["a", "dog", "runs"], ["girls", "play"], ["a", "cat"]]
    assert reward(captions, [0, 1, 0]) == [cider.score(c, p) for c, p in zip(captions, [0, 1, 0])]
    assert reward([["a", "dog", "runs"]], [0])[0] > reward([["a", "dog", "runs"]], [1])[0]


def _log(run):
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_an_scst_run_starts_from_a_cross_entropy_run_logs_its_reward_and_resumes_exactly(scenes, tmp_path):
    common = [f"data.path={scenes}", *TINY, "train.device=cpu"]
    train_captioning(load_config(None, [*common, f"output_dir={tmp_path / 'xe'}", "train.epochs=3"]), progress_bar=False, log=lambda _: None)
    start = tmp_path / "xe" / "best.pt"
    scst = [*common, f"train.init_from={start}", "train.objective=scst", "train.scst_samples=3", "train.lr=0.001"]
    printed = []
    train_captioning(load_config(None, [*scst, f"output_dir={tmp_path / 'whole'}", "train.epochs=2"]), progress_bar=False, log=printed.append)
    records = _log(tmp_path / "whole")
    assert [r["epoch"] for r in records] == [1, 2] and all("reward" in r["train_statistics"] and "train_ppl" not in r for r in records)
    assert any("self-critical training: 3 captions sampled per photo" in line for line in printed)
    assert any(f"starting from the weights of {start}" in line for line in printed)
    whole = load_checkpoint(tmp_path / "whole" / "last.pt")
    assert whole.vocabularies == load_checkpoint(start).vocabularies
    assert whole.training["progress"]["step"] == 2 * 3  # 12 photos in batches of 4: each photo once an epoch, not once a caption

    train_captioning(load_config(None, [*scst, f"output_dir={tmp_path / 'cut'}", "train.epochs=1"]), progress_bar=False, log=lambda _: None)
    cut = load_checkpoint(tmp_path / "cut" / "last.pt")
    resumed_config = load_config(None, [*scst, f"output_dir={tmp_path / 'cut'}", "train.epochs=2"])
    train_captioning(resumed_config, resume=cut, progress_bar=False, log=lambda _: None)
    resumed = load_checkpoint(tmp_path / "cut" / "last.pt")
    for name, value in whole.model.items():
        assert torch.equal(value, resumed.model[name]), name
    timeless = lambda log: [{k: v for k, v in r.items() if k not in ("epoch_seconds", "train_tokens_per_s")} for r in log]  # noqa: E731
    assert timeless(_log(tmp_path / "cut")) == timeless(records)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task=translation", "train.objective=scst"], "scst rewards captions with CIDEr-D against a photo's references (task captioning or multitask), not task translation"),
        (["task=pretrain", "train.objective=scst"], "not task pretrain"),
        (["task=captioning", "train.objective=scst", "train.scst_samples=1"], "sample at least 2, or use train.scst_baseline=greedy"),
        (["task=captioning", "train.objective=scst", "train.label_smoothing=0.1"], "train.label_smoothing: it smooths the cross-entropy targets"),
        (["task=multitask", "train.objective=scst", "data.mosaic_share=0.2"], "data.mosaic_share"),
        (["task=multitask", "train.objective=scst", "train.caption_share=0"], "train.caption_share: 0 leaves the joint model no caption batch"),
        (["task=captioning", "train.objective=scst", "train.teacher_forcing=0.9"], "train.teacher_forcing"),
        (["task=captioning", "train.objective=scst", "data.mosaic_share=0.2"], "data.mosaic_share"),
        (["task=captioning", "train.objective=reinforce"], "unknown objective 'reinforce'; choose one of xe, scst"),
        (["task=translation", "train.init_from=runs/x/best.pt"], "train.init_from: a run started from another run's weights is built for SCST after cross-entropy (task captioning or multitask)"),
    ],
)
def test_what_self_critical_training_cannot_train_is_refused_with_one_message(overrides, message):
    with pytest.raises(UserError, match=None) as raised:
        load_config(None, overrides)
    assert message in str(raised.value)


@pytest.mark.slow
def test_a_joint_model_s_caption_batches_train_self_critically_and_its_translations_keep_cross_entropy(tmp_path):
    """task multitask: SCST from a joint cross-entropy run; the caption side is one example per photo, the reward is the
    mean over the sampled captions alone (the translation batches give none), label smoothing stays the translations'."""
    from attnkit.data.scenes import write_scene_dataset
    from attnkit.multitask import train_multitask
    from test_multitask import tiny_joint_config

    scenes = write_scene_dataset(tmp_path / "scenes", {"train": 24, "valid": 4, "test": 4, "compositional": 4}, seed=0, size=64)
    train_multitask(tiny_joint_config(scenes, tmp_path / "xe", "train.epochs=1"), progress_bar=False, log=lambda _: None)
    start = tmp_path / "xe" / "best.pt"
    printed = []
    scst = ["train.epochs=1", f"train.init_from={start}", "train.objective=scst", "train.scst_samples=3", "train.label_smoothing=0.1"]
    train_multitask(tiny_joint_config(scenes, tmp_path / "scst", *scst), progress_bar=False, log=printed.append)
    assert any("multitask: 24 photos of" in line for line in printed)
    assert any("self-critical training of the caption batches: 3 captions sampled per photo" in line for line in printed)
    assert any(f"starting from the weights of {start}" in line for line in printed)
    (record,) = _log(tmp_path / "scst")
    # CIDEr-D's scale (at most 10) over the samples alone; the perplexity is the translation batches'
    assert 0.0 <= record["train_statistics"]["reward"] <= 10.0 and record["train_ppl"] > 1.0
    assert load_checkpoint(tmp_path / "scst" / "last.pt").vocabularies == load_checkpoint(start).vocabularies


def test_a_start_from_another_model_or_task_is_refused_before_training(scenes, tmp_path):
    from attnkit.checkpoint import Checkpoint, save_checkpoint

    common = [f"data.path={scenes}", *TINY, "train.device=cpu", "train.epochs=1"]
    train_captioning(load_config(None, [*common, f"output_dir={tmp_path / 'xe'}"]), progress_bar=False, log=lambda _: None)
    start = tmp_path / "xe" / "best.pt"
    with pytest.raises(UserError, match=r"train.init_from: the config changes the model of .* decoder.hidden_size 48 vs 64"):
        train_captioning(load_config(None, [*common, f"output_dir={tmp_path / 'other'}", f"train.init_from={start}", "decoder.hidden_size=64"]), progress_bar=False, log=lambda _: None)
    translation = tmp_path / "translation.pt"
    saved = load_checkpoint(start)
    save_checkpoint(translation, Checkpoint("translation", saved.config, {**saved.vocabularies, "source": saved.vocabularies["target"]}, saved.model, {}))
    with pytest.raises(UserError, match="is a translation checkpoint; a captioning run starts from a captioning checkpoint"):
        train_captioning(load_config(None, [*common, f"output_dir={tmp_path / 't'}", f"train.init_from={translation}"]), progress_bar=False, log=lambda _: None)
    assert not (tmp_path / "other").exists() and not (tmp_path / "t" / "last.pt").exists()
