"""The trainer and the translation recipe on the toy reversal task."""

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.config import ExperimentConfig, apply_overrides, from_dict, load_config, to_dict
from attnkit.data.text import read_parallel
from attnkit.train import GPU_VARIANTS, gpu_variant_note
from attnkit.translation import Translator, train_translation
from attnkit.errors import UserError
from attnkit.distributed import resolve_device, resolve_precision

LEARNS = [
    "text_encoder.embedding_size=16", "text_encoder.hidden_size=32", "text_encoder.dropout=0.0",
    "decoder.embedding_size=16", "decoder.hidden_size=64", "decoder.attention_size=32", "decoder.dropout=0.0",
    "data.tokenizer.kind=space", "data.tokenizer.lowercase=false",
    "train.batch_size=32", "train.lr=0.01", "train.patience=0", "search.beam_size=1",
]  # fmt: skip


def toy_config(toy_data, run_dir, *overrides):
    return load_config(None, [f"data.path={toy_data}", f"output_dir={run_dir}", *LEARNS, *overrides])


@pytest.mark.slow
@pytest.mark.parametrize("style", ["luong", "bahdanau"])
def test_a_tiny_model_learns_to_reverse(toy_data, tmp_path, style):
    extra = ["decoder.score=additive", "decoder.rnn=lstm"] if style == "bahdanau" else []
    # 12 epochs: at 8 the luong model reversed 88 % on an Intel Xeon (98 % and more on AMD EPYC): the margin was too thin
    config = toy_config(toy_data, tmp_path, "train.epochs=12", f"decoder.style={style}", *extra)
    train_translation(config, progress_bar=False, log=lambda _: None)
    translator = Translator.from_checkpoint(tmp_path / "best.pt", device="cpu")
    pairs = read_parallel(toy_data, "test", "src", "tgt")
    outputs = translator.translate([s for s, _ in pairs], beam_size=1)
    exact = sum(best[0].text == reference for best, (_, reference) in zip(outputs, pairs)) / len(pairs)
    assert exact >= 0.95, f"only {exact:.0%} exact reversals"


@pytest.mark.parametrize("batches", [[], ["train.batch_tokens=150"]], ids=["examples", "tokens"])
def test_resume_continues_exactly_where_the_run_stopped(toy_data, tmp_path, batches):
    quiet = dict(progress_bar=False, log=lambda _: None)
    straight = toy_config(toy_data, tmp_path / "straight", "train.epochs=3", *batches)
    train_translation(straight, **quiet)

    interrupted = toy_config(toy_data, tmp_path / "resumed", "train.epochs=2", *batches)
    train_translation(interrupted, **quiet)
    last = load_checkpoint(tmp_path / "resumed" / "last.pt")
    continued = from_dict(ExperimentConfig, apply_overrides(last.config, ["train.epochs=3"]))
    train_translation(continued, resume=last, **quiet)

    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    for name in a.model:
        torch.testing.assert_close(a.model[name], b.model[name], msg=name)
    log = [json.loads(line) for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert {"train_loss", "train_ppl", "train_tokens_per_s", "lr", "valid", "best", "epoch_seconds"} <= set(log[-1])
    assert b.training["progress"]["epoch"] == 3


def test_a_run_killed_in_its_decay_resumes_exactly(toy_data, tmp_path, monkeypatch):
    """train.decay_epochs: the rate falls step by step over the last epochs, and a run stopped after an epoch of its
    decay goes on exactly as the run that was never stopped."""
    from attnkit.train import Trainer

    quiet = dict(progress_bar=False, log=lambda _: None)
    settings = ["train.epochs=3", "train.decay_epochs=2", "train.lr_patience=0"]
    train_translation(toy_config(toy_data, tmp_path / "straight", *settings), **quiet)

    class Killed(Exception):
        pass

    end_of_epoch = Trainer.end_of_epoch

    def killed_after_epoch_2(self, record, started):
        end_of_epoch(self, record, started)
        if record["epoch"] == 2:
            raise Killed

    monkeypatch.setattr(Trainer, "end_of_epoch", killed_after_epoch_2)
    with pytest.raises(Killed):
        train_translation(toy_config(toy_data, tmp_path / "resumed", *settings), **quiet)
    monkeypatch.undo()
    last = load_checkpoint(tmp_path / "resumed" / "last.pt")
    assert last.training["progress"]["epoch"] == 2
    train_translation(from_dict(ExperimentConfig, last.config), resume=last, **quiet)

    a, b = load_checkpoint(tmp_path / "straight" / "last.pt"), load_checkpoint(tmp_path / "resumed" / "last.pt")
    for name in a.model:
        torch.testing.assert_close(a.model[name], b.model[name], msg=name)
    rates = [[json.loads(line)["lr"] for line in (tmp_path / run / "log.jsonl").read_text().splitlines()] for run in ("straight", "resumed")]
    assert rates[0] == rates[1] and rates[0][0] == last.config["train"]["lr"] > rates[0][1] > rates[0][2] > 0  # each epoch's last step's rate


def test_a_time_budget_that_ends_a_run_before_its_decay_says_so(toy_data, tmp_path):
    lines = []
    config = toy_config(toy_data, tmp_path, "train.epochs=4", "train.decay_epochs=2", "train.max_minutes=0.0001", "train.valid_max_examples=16")
    train_translation(config, progress_bar=False, log=lines.append)
    assert any("stopping (time budget, before its decay (the last 2 of 4 epochs) began)" in line for line in lines), lines


def test_a_weight_average_validates_and_saves_the_average_and_leaves_training_alone(toy_data, tmp_path):
    """train.ema_decay: the steps are those of a run without it (the trained weights match), validation scored
    the average that best.pt and last.pt hold, and a resumed run goes on exactly (average and weights)."""
    quiet = dict(progress_bar=False, log=lambda _: None)
    settings = ["train.epochs=2", "train.valid_max_examples=16"]
    train_translation(toy_config(toy_data, tmp_path / "plain", *settings), **quiet)
    train_translation(toy_config(toy_data, tmp_path / "averaged", *settings, "train.ema_decay=0.9"), **quiet)
    interrupted = toy_config(toy_data, tmp_path / "resumed", "train.epochs=1", "train.valid_max_examples=16", "train.ema_decay=0.9")
    train_translation(interrupted, **quiet)
    last = load_checkpoint(tmp_path / "resumed" / "last.pt")
    train_translation(from_dict(ExperimentConfig, apply_overrides(last.config, ["train.epochs=2"])), resume=last, **quiet)

    plain = load_checkpoint(tmp_path / "plain" / "last.pt")
    averaged = load_checkpoint(tmp_path / "averaged" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "last.pt")
    trained = averaged.training["trained_weights"]
    for name in plain.model:
        torch.testing.assert_close(trained[name], plain.model[name], msg=name)
        torch.testing.assert_close(resumed.training["trained_weights"][name], trained[name], msg=name)
        torch.testing.assert_close(resumed.model[name], averaged.model[name], msg=name)
    assert any(not torch.equal(averaged.model[name], trained[name]) for name in trained if trained[name].is_floating_point())

    log = [json.loads(line) for line in (tmp_path / "averaged" / "log.jsonl").read_text().splitlines()]
    valid_pairs = read_parallel(toy_data, "valid", "src", "tgt")[:16]
    rescored = Translator.from_checkpoint(tmp_path / "averaged" / "last.pt", device="cpu").evaluate(valid_pairs, beam_size=1)
    assert rescored["bleu"] == log[-1]["valid"]["bleu"]



def test_a_resumed_run_trains_with_the_rate_and_weight_decay_its_config_names(small_toy_data, tmp_path):
    """--resume --set train.lr=... train.weight_decay=...: the optimizer's saved settings came back, so the run went on
    with the old ones while its checkpoints' config named the new."""
    quiet = dict(progress_bar=False, log=lambda _: None)
    train_translation(toy_config(small_toy_data, tmp_path, "train.epochs=1", "train.weight_decay=0"), **quiet)
    last = load_checkpoint(tmp_path / "last.pt")
    continued = from_dict(ExperimentConfig, apply_overrides(last.config, ["train.epochs=2", "train.weight_decay=0.05", "train.lr=0.02"]))
    train_translation(continued, resume=last, **quiet)
    (group,) = load_checkpoint(tmp_path / "last.pt").training["optimizer"]["param_groups"]
    assert (group["weight_decay"], group["lr"]) == (0.05, pytest.approx(0.02))  # no plateau yet: the whole peak

def test_validation_and_the_plateaus_see_the_average_and_a_resume_may_turn_it_on_or_off(toy_data, tmp_path):
    """Validation scores the weights the model holds when it runs: with a weight average, the average (here its
    fingerprint, the sum of the output layer's weights), which the schedule and early stopping then follow."""
    pairs = read_parallel(toy_data, "train", "src", "tgt")[:64]
    config = toy_config(toy_data, tmp_path / "a", "train.epochs=2", "train.ema_decay=0.9", "train.batch_size=16")
    trainer = toy_trainer(config, pairs, tmp_path / "a", score=0.0)
    fingerprint = lambda weights: sum(t.double().sum().item() for name, t in weights.items() if name.endswith("output.weight"))  # noqa: E731
    seen = []
    trainer.evaluate = lambda model: seen.append(fingerprint(model.state_dict())) or {"score": seen[-1]}
    trainer.fit()
    last = load_checkpoint(tmp_path / "a" / "last.pt")
    assert seen[-1] == pytest.approx(fingerprint(last.model)) and seen[-1] != pytest.approx(fingerprint(last.training["trained_weights"]))
    assert fingerprint(trainer.model.state_dict()) == pytest.approx(fingerprint(last.training["trained_weights"]))  # trained weights back

    plain = toy_trainer(toy_config(toy_data, tmp_path / "b", "train.epochs=3", "train.batch_size=16"), pairs, tmp_path / "b", score=0.0)
    plain.restore(last)  # the average off: training goes on from the trained weights
    torch.testing.assert_close(plain.model.state_dict(), last.training["trained_weights"])
    averaged = toy_trainer(toy_config(toy_data, tmp_path / "c", "train.epochs=3", "train.batch_size=16", "train.ema_decay=0.9"), pairs, tmp_path / "c", score=0.0)
    without_average = replace(last, model=last.training["trained_weights"], training={k: v for k, v in last.training.items() if k != "trained_weights"})
    averaged.restore(without_average)  # as a run without an average saves it; the average on: it starts from the weights
    torch.testing.assert_close(averaged.weight_average.average, averaged.model.state_dict())
    torch.testing.assert_close(averaged.model.state_dict(), last.training["trained_weights"])


def test_resume_refuses_a_changed_architecture_and_touches_nothing(toy_data, tmp_path, capsys):
    """Another normaliser or another size may fit the saved weights (a normaliser always does): one message lists what changed."""
    from attnkit.errors import run_cli
    from attnkit.commands import train

    train_translation(toy_config(toy_data, tmp_path, "train.epochs=1", "train.valid_max_examples=8"), progress_bar=False, log=lambda _: None)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()}
    argv = ["--resume", str(tmp_path / "last.pt"), "--no-progress", "--set", "train.epochs=2", "--set", "decoder.hidden_size=32", "--set", "decoder.normaliser=sparsemax"]
    assert run_cli(train.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot resume: the config changes the checkpoint's model (saved vs asked): decoder.hidden_size 64 vs 32; decoder.normaliser 'softmax' vs 'sparsemax'; keep")
    assert err.count("\n") == 1 and "train.epochs" not in err
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()} == before


@pytest.mark.parametrize("option", ["train.valid_beam_size", "search.beam_size"])
def test_a_beam_wider_than_the_vocabulary_is_refused_before_the_first_epoch(toy_data, tmp_path, option):
    """It was found at the first validation (or by the first `translate`), after an epoch, asking for gigabytes."""
    config = toy_config(toy_data, tmp_path / "run", "train.epochs=1", f"{option}=100000")
    with pytest.raises(UserError, match=f"^{option} 100,000 is wider than the [0-9,]+ tokens this model can output"):
        train_translation(config, progress_bar=False, log=lambda _: None)
    assert not (tmp_path / "run").exists()


def _set_moment_shape(training):
    first = next(iter(training["optimizer"]["state"]))
    training["optimizer"]["state"][first]["exp_avg"] = torch.zeros(2)  # fused Adam stepped with it and crashed the process


@pytest.mark.parametrize(
    "damage",
    [
        _set_moment_shape,
        lambda training: training["optimizer"].update(state=[]),
        lambda training: training["scheduler"].update(peaks=[0.0]),
        lambda training: training["progress"].update(epoch=1.5),  # was accepted: "epoch 2.5"
        lambda training: training["progress"].update(best_score="x"),  # found after a whole epoch
    ],
    ids=["moment-shape", "state-list", "zero-peak", "fractional-epoch", "text-score"],
)
def test_a_training_state_that_does_not_fit_is_one_message_before_any_work(toy_data, tmp_path, damage):
    train_translation(toy_config(toy_data, tmp_path / "run", "train.epochs=1", "train.valid_max_examples=8"), progress_bar=False, log=lambda _: None)
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    training = copy.deepcopy(last.training)
    damage(training)
    config = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(last.config), ["train.epochs=2", f"output_dir={tmp_path / 'resumed'}"]))
    with pytest.raises(UserError, match="the checkpoint's training state does not fit this run"):
        train_translation(config, resume=replace(last, training=training), progress_bar=False, log=lambda _: None)
    assert not (tmp_path / "resumed").exists()


def test_an_existing_run_is_not_overwritten(toy_data, tmp_path):
    config = toy_config(toy_data, tmp_path, "train.epochs=1")
    train_translation(config, progress_bar=False, log=lambda _: None)
    before = (tmp_path / "last.pt").read_bytes()
    with pytest.raises(UserError, match="already holds a run"):
        train_translation(config, progress_bar=False, log=lambda _: None)
    assert (tmp_path / "last.pt").read_bytes() == before


def test_time_budget_stops_before_an_epoch_that_would_overrun(toy_data, tmp_path):
    config = toy_config(toy_data, tmp_path, "train.epochs=5", "train.max_minutes=0.0001", "train.valid_max_examples=10")
    lines = []
    progress = train_translation(config, progress_bar=False, log=lines.append)
    assert lines[-1].startswith("time budget: it allowed 1 of 5 epochs in ")  # the last thing a budgeted run says
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert progress.epoch == 1 and [r.get("stop") for r in log] == ["time budget"]
    saved = load_checkpoint(tmp_path / "last.pt").training["progress"]
    assert saved["stop_reason"] == "time budget" and saved["seconds"] == pytest.approx(log[0]["epoch_seconds"], abs=0.01)


def toy_trainer(config, pairs, run_dir, score: float):
    """A Trainer of the toy translation model whose validation always gives ``score``."""
    from attnkit.data.text import collate_pairs
    from attnkit.losses import Seq2SeqObjective
    from attnkit.model import build_translation_model
    from attnkit.train import CheckpointContents, Trainer
    from attnkit.text_pipeline import TextPipeline

    pipeline = TextPipeline.build(config, pairs, "src", "tgt")
    model = build_translation_model(config, pipeline.source_vocab, pipeline.target_vocab)
    return Trainer(
        model, Seq2SeqObjective(), pipeline.encode_pairs(pairs, 50, 50), collate_pairs, lambda m: {"score": score},
        config.train, run_dir, CheckpointContents("translation", to_dict(config), pipeline.vocabularies), progress_bar=False, log=lambda _: None,
    )  # fmt: skip


def test_a_run_resumed_as_it_stopped_stops_there_again_and_a_raised_budget_goes_on(toy_data, tmp_path):
    """A resumed stop was decided only after one more epoch: an epoch past the budget (or the patience) ran."""
    config = toy_config(toy_data, tmp_path, "train.epochs=5", "train.max_minutes=0.0001", "train.valid_max_examples=10")
    train_translation(config, progress_bar=False, log=lambda _: None)
    last = load_checkpoint(tmp_path / "last.pt")
    lines = []
    same = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(last.config), []))
    progress = train_translation(same, resume=last, progress_bar=False, log=lines.append)
    assert progress.epoch == 1 and progress.stop_reason == "time budget"
    assert any(line.startswith("the run stopped after epoch 1 (time budget) and this config stops it there again") for line in lines)
    raised = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(last.config), ["train.max_minutes=0", "train.epochs=2"]))
    assert train_translation(raised, resume=last, progress_bar=False, log=lambda _: None).epoch == 2


def test_a_tied_validation_score_keeps_the_later_checkpoint_but_counts_towards_early_stopping(toy_data, tmp_path):
    config = toy_config(toy_data, tmp_path, "train.epochs=5", "train.patience=2")
    progress = toy_trainer(config, read_parallel(toy_data, "train", "src", "tgt")[:64], tmp_path, score=100.0).fit()
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["best"] for r in log] == [True, True, True]  # every epoch ties the first
    assert progress.stop_reason == "early stopping"  # ... but no tie is an improvement
    assert load_checkpoint(tmp_path / "best.pt").training["progress"]["epoch"] == 3


def test_an_objective_s_statistics_are_the_mean_over_the_batches_that_give_them(toy_data, tmp_path):
    """A joint model's translation batches give no SCST reward: they must not dilute the reward's mean."""
    from attnkit.losses import Seq2SeqObjective

    calls = []

    def every_other_batch(model, batch):
        out = Seq2SeqObjective()(model, batch)
        calls.append(len(batch.index))
        if len(calls) % 2:  # "1 per example" of every other batch only
            out = replace(out, statistics={"marker": out.examples.to(torch.float64)})
        return out

    config = toy_config(toy_data, tmp_path, "train.epochs=1", "train.batch_size=8")
    trainer = toy_trainer(config, read_parallel(toy_data, "train", "src", "tgt")[:64], tmp_path, score=1.0)
    trainer.objective = every_other_batch
    record = trainer.train_epoch(1)
    assert len(calls) >= 2 and record["train_statistics"] == {"marker": 1.0}


def test_bf16_autocast_trains_on_cpu(toy_data, tmp_path):
    config = toy_config(toy_data, tmp_path, "train.epochs=1", "train.precision=bf16", "train.valid_max_examples=10")
    train_translation(config, progress_bar=False, log=lambda _: None)
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert torch.isfinite(torch.tensor(record["train_loss"]))


def test_device_and_precision_resolution():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    # auto never picks mixed precision, whatever the device: bf16 ran five of the six recipes slower than fp32 + TF32
    # on an H200 (BENCHMARKS.md, issue 47); a recipe measured faster in bf16 says so itself
    assert resolve_precision("auto") == torch.float32
    assert resolve_precision("bf16") == torch.bfloat16
    with pytest.raises(UserError, match="precision"):
        resolve_precision("fp8")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(UserError, match="unknown device"):
        resolve_device("tpu")


TRANSFORMER = [
    "text_encoder.family=transformer", "text_encoder.embedding_size=16", "text_encoder.hidden_size=16", "text_encoder.num_layers=1",
    "text_encoder.heads=2", "text_encoder.feedforward_size=32", "text_encoder.dropout=0", "decoder.family=transformer",
    "decoder.embedding_size=16", "decoder.hidden_size=16", "decoder.num_layers=1", "decoder.heads=2", "decoder.feedforward_size=32",
]  # fmt: skip


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_a_batch_padded_to_multiples_of_8_gives_the_same_loss_and_gradients(toy_data, tmp_path, family):
    """What the trainer does on CUDA (few shapes): the padding is masked and unscored, by the cross-entropy, its
    label smoothing and the attention penalty alike."""
    from attnkit.distributed import Distributed
    from attnkit.train import RunContext
    from attnkit.translation import prepare_translation

    losses = ["train.label_smoothing=0.1", "train.attention_regularization=0.5"]
    config = toy_config(toy_data, tmp_path, *losses, *(TRANSFORMER if family == "transformer" else []))
    torch.manual_seed(0)
    setup = prepare_translation(config, None, RunContext(Distributed(), torch.device("cpu"), lambda _: None))
    as_collated = setup.collate([setup.dataset[i] for i in range(16)])
    padded = as_collated.padded_to_multiple(8)
    (rows, source), target = as_collated.source.ids.shape, as_collated.target.shape[1]
    assert padded.source.ids.shape == (rows, -(-source // 8) * 8)  # S rounded up
    assert (padded.target.shape[1] - 1) % 8 == 0 and target <= padded.target.shape[1] < target + 8  # the decoder's T - 1 steps rounded up
    results = []
    for batch in (as_collated, padded):
        setup.model.zero_grad()
        loss = setup.objective(setup.model, batch).loss()
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in setup.model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_trainer_pads_its_batches_to_the_device_s_multiple(toy_data, tmp_path, monkeypatch):
    import attnkit.train

    monkeypatch.setattr(attnkit.train, "length_multiple", lambda device: 8)  # as on CUDA
    collate, seen = attnkit.train.padded_collate, []

    def padded_and_seen(*args):
        batch = collate(*args)
        seen.append((batch.source.ids.shape[1], batch.target.shape[1]))
        return batch

    monkeypatch.setattr(attnkit.train, "padded_collate", padded_and_seen)
    for family in ("rnn", "transformer"):
        seen.clear()
        settings = ["train.epochs=1", "train.valid_max_examples=8", *(TRANSFORMER if family == "transformer" else [])]
        train_translation(toy_config(toy_data, tmp_path / family, *settings), progress_bar=False, log=lambda _: None)
        assert len(seen) == 47 and all(source % 8 == 0 for source, _ in seen)  # 1,500 pairs / 32
        # the target too where the decoder takes every step at once; an RNN decoder's loop would pay for its padding
        padded_targets = [(target - 1) % 8 == 0 for _, target in seen]
        assert all(padded_targets) if family == "transformer" else not all(padded_targets), family


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bahdanau", "transformer"])
def test_train_compile_compiles_the_repeated_parts_and_trains_as_eager(small_toy_data, tmp_path, monkeypatch, family):
    """train.compile (traced here with aot_eager: the same graphs, no C++ or Triton build): the parts a step runs many
    times are compiled in place, each traced whole (a part torch.compile cannot trace runs eager, and the run says
    so: the RNN cell step once touched the nn.LSTM module and ran eager), so the checkpoint's weights keep their
    names, and an epoch (validation decoding included) ends with the weights eager training gives."""
    import attnkit.train

    monkeypatch.setattr(attnkit.train, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    model = TRANSFORMER if family == "transformer" else ["decoder.style=bahdanau", "decoder.score=additive", "decoder.rnn=lstm"]
    expected = (
        "encoders.text.layers.layers.0, decoder.layers.0" if family == "transformer" else "decoder._cell_step, decoder.attention"
    )  # the Transformer layers; the RNN decoder's cell step and its attention
    runs = {}
    for compiled in (False, True):
        run_dir = tmp_path / f"compile={compiled}"
        lines: list[str] = []
        config = toy_config(small_toy_data, run_dir, "train.epochs=1", "train.valid_max_examples=8", f"train.compile={compiled}", *model)
        train_translation(config, progress_bar=False, log=lines.append)
        runs[compiled] = (load_checkpoint(run_dir / "last.pt").model, lines)
    (eager, eager_log), (compiled, compiled_log) = runs[False], runs[True]
    assert f"compiled (torch.compile, dynamic shapes; each part compiles at its first call): {expected}" in compiled_log
    assert "torch.compile traced every compiled part whole" in compiled_log, [line for line in compiled_log if "torch.compile" in line]
    assert not any(line.startswith(("compiled", "torch.compile")) for line in eager_log)
    assert compiled.keys() == eager.keys()
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-4, atol=1e-5, msg=name)


def test_resuming_with_another_number_of_processes_says_what_becomes_of_the_global_batch():
    """The batch is per process: a 2-process run resumed by one process took twice the steps at the same learning
    rate, and the only warning was about the random streams."""
    from types import SimpleNamespace

    from attnkit.config import TrainConfig
    from attnkit.distributed import Distributed
    from attnkit.train import Trainer

    said = []
    trainer = SimpleNamespace(
        distributed=Distributed(), config=TrainConfig(batch_size=32), log=said.append, progress=SimpleNamespace(epoch=2), device=torch.device("cpu")
    )
    Trainer._restore_random_state(trainer, {"rng": [{"cpu": torch.get_rng_state()}] * 2})
    assert "global batch is now 32 examples (it was 64 examples)" in said[0] and "--set train.batch_size=64" in said[0]
    trainer.config = TrainConfig(batch_tokens=1001)
    trainer.distributed = Distributed(0, 3, 0, 3)
    Trainer._restore_random_state(trainer, {"rng": [{"cpu": torch.get_rng_state()}] * 2})
    assert "now up to 3003 target tokens (it was up to 2002 target tokens)" in said[1] and "--set" not in said[1]


def test_a_frozen_encoder_s_gradients_do_not_shrink_the_clipped_steps_of_the_rest(toy_data, tmp_path):
    """Clipping measured every parameter's gradient: an encoder held still (text_encoder.frozen_steps) moved nothing
    but made the norm larger, so the decoder's clipped steps were smaller than without it."""
    from attnkit.optim import LearningRateSchedule

    config = toy_config(toy_data, tmp_path, "train.epochs=1", "train.clip_norm=0.001")  # small enough to clip every step
    trainer = toy_trainer(config, read_parallel(toy_data, "train", "src", "tgt")[:8], tmp_path, score=1.0)
    encoder = list(trainer.model.encoders.parameters())
    rest = [p for name, p in trainer.model.named_parameters() if not name.startswith("encoders.")]
    trainer.optimizer = torch.optim.Adam([{"params": encoder, "frozen_steps": 100}, {"params": rest}], lr=1e-3)
    trainer.schedule = LearningRateSchedule(trainer.optimizer, config.train)
    trainer.train_step(next(iter(trainer.loader)))
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in rest])).item() == pytest.approx(0.001, rel=1e-3)
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in encoder])).item() > 0.001  # measured, left unclipped


RECIPES = Path(__file__).resolve().parents[1] / "tasks" / "configs"


@pytest.mark.parametrize("recipe", sorted(GPU_VARIANTS))
def test_a_cpu_recipe_started_on_a_gpu_names_its_gpu_variant(recipe):
    """Only a new run on CUDA of a recipe that batches by examples hears of the variant; the file it names exists and
    is that recipe's (tests/test_config.py checks it changes the schedule only)."""
    config = load_config(RECIPES / f"{recipe}.yaml")
    variant = GPU_VARIANTS[recipe]
    assert load_config(RECIPES / f"{variant}.yaml").name == variant
    note = gpu_variant_note(torch.device("cuda"), config, resuming=False)
    assert note is not None and f"tasks/configs/{variant}.yaml" in note and f"batches {config.train.batch_size} examples" in note
    assert gpu_variant_note(torch.device("cpu"), config, resuming=False) is None
    assert gpu_variant_note(torch.device("cuda"), config, resuming=True) is None  # a run keeps its batches
    by_tokens = load_config(RECIPES / f"{recipe}.yaml", ["train.batch_tokens=8500"])
    assert gpu_variant_note(torch.device("cuda", 0), by_tokens, resuming=False) is None
    assert gpu_variant_note(torch.device("cuda"), load_config(RECIPES / f"{variant}.yaml"), resuming=False) is None


def test_the_captioning_recipe_names_no_gpu_variant():
    """flickr8k_gpu.yaml scored under flickr8k.yaml on test after SCST: the note must not send a GPU user to it."""
    assert gpu_variant_note(torch.device("cuda"), load_config(RECIPES / "flickr8k.yaml"), resuming=False) is None


def test_a_new_run_says_the_gpu_note_beside_its_device_line(toy_data, tmp_path, monkeypatch):
    """train_recipe asks for the note with the run's own device and says it among its first lines (CUDA itself is
    faked at the note: the run trains on the CPU)."""
    import attnkit.train as train_module

    asked = []
    monkeypatch.setattr(train_module, "gpu_variant_note", lambda device, config, resuming: asked.append((device.type, resuming)) or "note: the GPU variant")
    lines = []
    train_translation(toy_config(toy_data, tmp_path, "train.epochs=1"), progress_bar=False, log=lines.append)
    assert asked == [("cpu", False)] and "note: the GPU variant" in lines[:3], lines[:3]
