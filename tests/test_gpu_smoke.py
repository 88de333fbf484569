"""bench/gpu_smoke.py, the one-call GPU check, keeps working where there is no GPU: every step on a CPU with tiny
models, one line per step in steps.jsonl as it goes; what the precision step reads is the precision rule itself."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch


@pytest.fixture
def gpu_smoke(bench):
    return bench("gpu_smoke")


def steps_of(folder: Path) -> dict:
    return {record["step"]: record for record in map(json.loads, (folder / "steps.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_on_a_cpu_under_bf16(tmp_path, capsys, gpu_smoke):
    assert gpu_smoke.main(["--device", "cpu", "--tiny", "--precision", "bf16", "--out", str(tmp_path), "--set", "train.batch_tokens=200"]) == 0
    steps = steps_of(tmp_path)
    assert list(steps) == list(gpu_smoke.STEPS)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed[-1]["steps"] == steps  # the last stdout line holds them all
    # and each training variant's line came as it ended (a call cut short keeps them), the same as its part of the step
    variants = {
        (line["recipe"], line["variant"]): {key: value for key, value in line.items() if key not in ("step", "recipe", "variant")}
        for line in printed[:-1] if line.get("step") == "training" and "variant" in line
    }  # fmt: skip
    assert variants == {(name, precision): steps["training"]["recipes"][name][precision] for name in gpu_smoke.RECIPES for precision in ("bf16", "fp32")}
    assert all(step["status"] == "ok" for step in steps.values()), {name: step.get("error") for name, step in steps.items()}
    assert {name: recipe["host_reads"] for name, recipe in steps["host_syncs"]["recipes"].items()} == dict.fromkeys(gpu_smoke.RECIPES, 0)

    precision = steps["precision"]["recipes"]
    for name in gpu_smoke.RECIPES:
        parts = precision[name]["parts"]
        assert precision[name]["autocast"] == "bfloat16" and not precision[name]["loss_scaler"]
        assert parts["decoder.output"]["addmm"] == ["bfloat16"]  # products run in the autocast dtype
        assert parts["other"]["_log_softmax"] == ["float32"]  # the loss in fp32
    for name in ("translation", "captioning", "multitask"):  # the RNN decoder's cells, and the bi-GRU encoder, in fp32
        assert {dtype for dtypes in precision[name]["parts"]["decoder.rnn"].values() for dtype in dtypes} == {"float32"}
    assert precision["translation"]["parts"]["encoders.text"] == {"addmm": ["float32"]}

    for name, recipe in steps["training"]["recipes"].items():  # bf16 and fp32 from the same seed take the same steps
        assert recipe["bf16"]["steps"] == recipe["fp32"]["steps"] >= 2, name
        assert all(recipe[precision]["tokens_per_s"] > 0 for precision in ("bf16", "fp32")), name
        assert recipe["bf16"]["train_loss_last_epoch"] == pytest.approx(recipe["fp32"]["train_loss_last_epoch"], abs=0.05), name
        # train_for measures kernel_share only in the step's time left: on a loaded machine it may run out first
        assert all("kernel_share" in recipe[precision] for precision in ("bf16", "fp32")), f"{name}: the training step's time limit ran out (a busy machine?)"
        assert all(0 < recipe[precision]["kernel_share"] <= 1.5 for precision in ("bf16", "fp32")), name
        assert recipe["bf16"]["batches"] == "up to 200 target tokens", name
        # autocast's casts (weights, activations, their gradients) are what bf16 adds to a step; fp32 has next to none
        assert recipe["bf16"]["casts_per_step"] > recipe["fp32"]["casts_per_step"] + 10, name
        assert recipe["bf16"]["operations_per_step"] > recipe["fp32"]["operations_per_step"] > 100, name
    assert all(recipe["beam5"]["sentences"] > 0 for recipe in steps["decoding"]["recipes"].values())
    assert steps["round_trip"]["exit_codes"] == {"train": 0, "resume": 0, "evaluate": 0} and steps["round_trip"]["epochs_logged"] == [1, 2, 3]
    assert steps["pixels"]["images_per_s"] > 0


def test_no_recipe_s_training_step_reads_a_value_back_from_the_device(tmp_path, gpu_smoke):
    """On a GPU each such read would stop the host until the device caught up (attnkit.host_reads); the check's
    host_syncs step finds them on a CPU too, and every recipe's step (model, loss, clipping, fused Adam) has none."""
    assert gpu_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--only", "host_syncs"]) == 0
    recipes = steps_of(tmp_path)["host_syncs"]["recipes"]
    assert recipes == {name: {"host_reads": 0, "reads": []} for name in gpu_smoke.RECIPES}  # no "syncs": that count needs CUDA



def test_every_recipe_s_loader_can_start_its_workers_by_pickling(tmp_path, gpu_smoke):
    """On CUDA the loader runs workers; where they start by pickling what they run (Python 3.14's default on Linux,
    and macOS and Windows), the dataset and the collate function must pickle: the joint recipes' collate was a closure."""
    import pickle

    from attnkit.data.batching import padded_collate
    from attnkit.data.scenes import write_scene_dataset

    scenes = write_scene_dataset(tmp_path / "scenes", {"train": 8, "valid": 2}, seed=0, size=32)
    args = gpu_smoke.get_args_parser().parse_args(["--device", "cpu", "--tiny", "--out", str(tmp_path / "out")])
    for name, (prepare, config) in gpu_smoke.recipe_configs(args, scenes, tmp_path / "cache", "fp32").items():
        loader = gpu_smoke.build_trainer(name, prepare, config, torch.device("cpu"), tmp_path).loader
        batch = next(iter(loader))
        collate = partial(padded_collate, loader.collate_fn, 8, True)  # what a CUDA loader's workers run
        dataset, collate = pickle.loads(pickle.dumps((loader.dataset, collate)))
        again = collate([dataset[i] for i in range(len(batch.index))])
        assert (again.target.shape[-1] - 1) % 8 == 0, name  # the decoder's steps padded as on CUDA

def test_a_failing_step_is_recorded_and_the_next_one_runs(tmp_path, capsys, gpu_smoke, monkeypatch):
    def broken(device):
        raise RuntimeError("the environment broke\nsecond line")

    monkeypatch.setattr(gpu_smoke, "environment", broken)
    written = []
    original_write = gpu_smoke.StepLog.write
    monkeypatch.setattr(gpu_smoke.StepLog, "write", lambda log, record: (original_write(log, record), written.append(steps_of(tmp_path))))
    assert gpu_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--only", "environment,host_syncs", "--recipes", "translation"]) == 0
    steps = steps_of(tmp_path)
    assert steps["environment"]["status"] == "error" and steps["environment"]["error"] == "RuntimeError: the environment broke"
    assert steps["host_syncs"]["status"] == "ok"
    assert [list(lines) for lines in written] == [["environment"], ["environment", "host_syncs"]]  # each line on disk as its step ends


def test_limit_scale_scales_every_steps_limit(tmp_path, gpu_smoke):
    """What lets a device call share its minutes between the check and another run (bench/gpu_check_on_device.sh)."""
    for scale in (1, 0.5):
        assert gpu_smoke.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--only", "environment", "--limit-scale", str(scale)]) == 0
        tiny_cpu_limit = gpu_smoke.LIMITS["environment"] * 3 * 0.2 * scale + 30  # a CPU's limits x 3, tiny's x 0.2, + 30 s
        assert steps_of(tmp_path)["environment"]["limit_s"] == pytest.approx(tiny_cpu_limit)


def test_a_step_past_its_limit_is_cut_and_recorded(tmp_path, gpu_smoke):
    log = gpu_smoke.StepLog(tmp_path)

    def forever(deadline):
        while True:
            pass

    gpu_smoke.run_step(log, "stuck", 0.1, forever)  # the alarm ends it shortly after its limit
    assert steps_of(tmp_path)["stuck"]["status"] == "timeout"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--recipes", "translation,nope"], "unknown recipe nope"),
        (["--only", "environment,speed"], "unknown step speed"),
        (["--device", "cuda:7"], "device 'cuda:7'"),
        (["--limit-scale", "0"], "--limit-scale must be above 0"),
    ],
)
def test_bad_options_are_one_error(tmp_path, capsys, gpu_smoke, argv, message):
    from attnkit.errors import run_cli

    assert run_cli(gpu_smoke.main, ["--tiny", "--device", "cpu", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_compile_measures_each_precision_compiled_too(tmp_path, gpu_smoke, monkeypatch):
    """--compile: the same seed and steps with train.compile (traced with aot_eager here), where torch.compile could
    not trace a part (none), and the ratios that say whether bf16 and compiling pay."""
    import torch

    import attnkit.train

    monkeypatch.setattr(attnkit.train, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    argv = ["--device", "cpu", "--tiny", "--out", str(tmp_path), "--only", "training", "--recipes", "translation", "--compile"]
    assert gpu_smoke.main(argv) == 0
    training = steps_of(tmp_path)["training"]
    assert training["status"] == "ok" and training["limit_s"] == pytest.approx(200 * 2.5 * 3 * 0.2 + 30)  # twice the runs, and compiling
    for name, recipe in training["recipes"].items():
        assert {"bf16", "fp32", "bf16_compiled", "fp32_compiled"} <= recipe.keys(), name
        for precision in ("bf16", "fp32"):  # compiled from the same seed: the same steps, the same loss
            eager, compiled = recipe[precision], recipe[f"{precision}_compiled"]
            assert compiled["steps"] == eager["steps"] and compiled["train_loss_last_epoch"] == pytest.approx(eager["train_loss_last_epoch"], abs=1e-3), name
            assert compiled["compile_breaks"] == [] and "compile_breaks" not in eager, name  # every part traced whole
        assert set(recipe["speed_ratios"]) == {"bf16/fp32", "bf16_compiled/fp32_compiled", "bf16_compiled/bf16", "fp32_compiled/fp32"}, name
        assert recipe["speed_ratios"]["fp32_compiled/fp32"] == round(recipe["fp32_compiled"]["tokens_per_s"] / recipe["fp32"]["tokens_per_s"], 3)
        # the compiled variants' speed leaves out their first epoch, which held the compiling
        assert all(recipe[f"{p}_compiled"]["tokens_per_s_over"].startswith("epoch") for p in ("bf16", "fp32")), name


def test_a_compiled_variant_of_one_epoch_gives_no_speed_ratio(gpu_smoke):
    """Its one epoch held the compiling: a tiny try-out read compiled bf16 at 0.014 of eager."""
    measured = {
        "bf16": {"tokens_per_s": 5000.0}, "fp32": {"tokens_per_s": 4000.0},
        "bf16_compiled": {"tokens_per_s": 70.7, "last_epoch_compiled_the_parts": True},
        "fp32_compiled": {"tokens_per_s": 4400.0},
    }  # fmt: skip
    assert gpu_smoke.speed_ratios(measured, "bf16") == {"bf16/fp32": 1.25, "fp32_compiled/fp32": 1.1}


def test_a_variant_s_speed_leaves_out_its_first_epoch(gpu_smoke, monkeypatch):
    """The first epoch holds the loader's start, the kernels' choice and any compiling: ``tokens_per_s`` counts the
    epochs after it (``tokens_per_s_last_epoch`` stays the last one's), and a run of one epoch says so."""
    from types import SimpleNamespace

    class Trainer:  # three steps an epoch, 10 tokens/s in the first epoch, then 100 and 120
        device, dtype = torch.device("cpu"), torch.float32
        config = SimpleNamespace(batch_size=64, batch_tokens=None, compile=False)

        def __init__(self):
            self.progress = SimpleNamespace(step=0)

        def train_epoch(self, epoch):
            self.progress.step += 3
            return {"train_tokens_per_s": {1: 10.0, 2: 100.0}.get(epoch, 120.0), "train_loss": 1.0}

    monkeypatch.setattr(gpu_smoke, "kernel_share", lambda trainer, steps: 1.0)
    monkeypatch.setattr(gpu_smoke, "operations_per_step", lambda trainer: {})
    far = float("inf")
    two = gpu_smoke.train_for(Trainer(), steps=6, deadline=far)
    assert two["tokens_per_s"] == 100.0 and two["tokens_per_s_over"] == "epoch 2, 3 steps" and two["tokens_per_s_last_epoch"] == 100.0
    three = gpu_smoke.train_for(Trainer(), steps=9, deadline=far)
    assert 100.0 <= three["tokens_per_s"] <= 120.0 and three["tokens_per_s_over"] == "epochs 2-3, 6 steps"  # the two epochs' tokens over their time
    one = gpu_smoke.train_for(Trainer(), steps=3, deadline=far)
    assert one["tokens_per_s"] == 10.0 and one["tokens_per_s_over"] == "its only epoch"
