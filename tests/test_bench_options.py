"""The benchmarks in bench/: a mistake in their options is one message and exit 2 before any work; the probes of the
machine they share (bench/machine.py) are shortened only when asked, and no recorded figure was."""

from pathlib import Path

import pytest
import torch

from attnkit.errors import UserError, run_cli
from conftest import ROOT


def exit_code(main, argv) -> int:
    """What the script's ``run_cli(main)`` exits with: argparse's own refusals exit 2 themselves."""
    try:
        return run_cli(main, argv)
    except SystemExit as exit:
        return exit.code


def refuse_work(monkeypatch, module, *names):
    for name in names:
        monkeypatch.setattr(module, name, lambda *_a, _name=name, **_k: pytest.fail(f"{_name} ran before the options were checked"))


# ---------------------------------------------------------------- bench/demo_recipe.py


@pytest.fixture
def demo_recipe(bench, monkeypatch):
    module = bench("demo_recipe")
    refuse_work(monkeypatch, module, "generate_scenes", "write_scene_dataset", "train_multitask", "evaluate_scenes")
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--candidate", "a: scenes=abc"], "scenes must be a whole number"),
        (["--candidate", "a: scenes=0"], "scenes must be a whole number"),
        (["--candidate", "a: train.epochs"], "is not KEY=VALUE"),
        (["--candidate", "no colon"], "NAME: KEY=VALUE"),
        (["--candidate", "a: train.epochs=2", "--candidate", "a: train.epochs=3"], "two candidates are named 'a'"),
        (["--candidate", "a b:", "--candidate", "a-b:"], "another candidate's"),
        (["--candidate", "a: train.no_such_key=1"], "no_such_key"),
        (["--valid", "0"], "--valid"),
        (["--valid", "-3"], "--valid"),
        (["--minutes", "0"], "--minutes"),
        (["--minutes", "-1"], "--minutes"),
        (["--minutes", "soon"], "--minutes"),
    ],
)
def test_demo_recipe_refuses_bad_options_before_any_work(demo_recipe, tmp_path, capsys, argv, message):
    assert exit_code(demo_recipe.main, ["--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_demo_recipe_places_its_feature_cache_where_asked(demo_recipe, tmp_path, monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def train(config, **_):
        seen["cache"] = config.data.feature_cache
        raise Stop

    monkeypatch.setattr(demo_recipe, "generate_scenes", lambda *_a, **_k: [])
    monkeypatch.setattr(demo_recipe, "write_scene_dataset", lambda folder, *_a, **_k: (Path(folder) / "captions").mkdir(parents=True))
    monkeypatch.setattr(demo_recipe, "train_multitask", train)
    monkeypatch.setattr(demo_recipe, "busy_cores", lambda *_: None)
    with pytest.raises(Stop):
        demo_recipe.main(["--out", str(tmp_path / "out"), "--candidate", "a:", "--cache", str(tmp_path / "features")])
    assert seen["cache"] == str(tmp_path / "features")
    with pytest.raises(Stop):
        demo_recipe.main(["--out", str(tmp_path / "out"), "--candidate", "a:"])
    assert seen["cache"] == str(tmp_path / "out" / "features")  # never the checkout's cache/features


# ---------------------------------------------------------------- bench/flickr8k.py


@pytest.fixture
def flickr8k(bench, monkeypatch):
    module = bench("flickr8k")
    refuse_work(monkeypatch, module, "ensure_dataset", "train_captioning")
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--choose", "train.lr=0.1,0.1"], "names 0.1 twice"),
        (["--choose", "train.lr=0.1,0.10"], "train the same model"),
        (["--epochs", "0"], "--epochs"),
        (["--minutes", "-1"], "--minutes"),
    ],
)
def test_flickr8k_refuses_bad_options_before_any_work(flickr8k, capsys, argv, message):
    assert exit_code(flickr8k.main, argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_flickr8k_quick_data_stays_in_one_place_so_reuse_finds_its_runs(bench, monkeypatch, tmp_path):
    """--quick writes its subset under the run folder, the same each call: the runs' data.path and digest do not change."""
    from attnkit.data.captions import CaptionedImage, write_caption_dataset

    flickr8k = bench("flickr8k")
    dataset = tmp_path / "root" / "data" / "flickr8k"  # a prepared dataset stand-in: the quick subset only reads its splits
    images = [CaptionedImage(f"photo{i}.jpg", [f"a dog number {i}"]) for i in range(5)]
    write_caption_dataset(dataset, {"train": images, "valid": images[:2], "test": images[:2]}, tmp_path / "images")
    config = str(Path(__file__).resolve().parents[1] / "tasks/configs/flickr8k.yaml")
    monkeypatch.setattr(flickr8k, "ROOT", tmp_path / "root")
    monkeypatch.setattr(flickr8k, "busy_cores", lambda *_: None)

    class Stop(Exception):
        pass

    seen = []

    def train(config, **_):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(flickr8k, "train_captioning", train)
    out = tmp_path / "out"
    for _ in range(2):
        with pytest.raises(Stop):
            flickr8k.main(["--quick", "--reuse", "--skip-ablation", "--seeds", "0", "--config", config, "--out", str(out)])
    first, second = seen
    assert first.data.path == second.data.path == str(out / flickr8k.QUICK_DATA)
    assert (out / flickr8k.QUICK_DATA / "dataset.json").is_file()  # still there for the runs that name it
    assert flickr8k.training_digest(first) == flickr8k.training_digest(second)
    assert first.output_dir == second.output_dir


# ---------------------------------------------------------------- bench/caption_search.py and bench/image_memory.py


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--limit", "-5"], "--limit: must be at least 0"),
        (["--threads", "-3"], "--threads: must be at least 0"),
        (["--limit", "many"], "--limit"),
    ],
)
def test_caption_search_refuses_bad_options_before_any_work(bench, monkeypatch, capsys, argv, message):
    module = bench("caption_search")
    refuse_work(monkeypatch, module, "load_checkpoint", "busy_cores")
    assert exit_code(module.main, ["--checkpoint", "never-read.pt", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("minutes", ["-1", "0", "an hour"])
def test_image_memory_refuses_a_budget_that_is_not_above_zero(bench, monkeypatch, tmp_path, capsys, minutes):
    module = bench("image_memory")
    refuse_work(monkeypatch, module, "train_captioning", "busy_cores")
    assert exit_code(module.main, ["--minutes", minutes, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--minutes" in err and "Traceback" not in err


def test_pretrain_summary_does_not_call_the_load_after_the_arms_the_load_before_them(bench, monkeypatch, tmp_path):
    """bench/pretrain.py --summarise runs once the arms (other processes) have ended: what it samples is the load after them."""
    module = bench("pretrain")
    printed = {}
    monkeypatch.setattr(module, "busy_cores", lambda *_: 0.5)
    monkeypatch.setattr(module, "summarise", lambda *_: {"comparison": {}})
    monkeypatch.setattr(module, "print_result", lambda result, busy: printed.update(result=result, busy=busy) or 0)
    assert module.main(["--summarise", "--out", str(tmp_path)]) == 0
    assert printed["busy"] is None and printed["result"]["busy_cores_after_arms"] == 0.5


# ---------------------------------------------------------------- bench/demo_run.py and bench/serve_memory.py


@pytest.mark.parametrize(("argv", "message"), [(["--slowdown", "0.5"], "cannot make the machine faster"), (["--slowdown", "inf"], "finite"), (["--slowdown", "0"], "greater than 0")])
def test_demo_run_refuses_a_slowdown_that_is_no_slowdown(bench, monkeypatch, capsys, tmp_path, argv, message):
    module = bench("demo_run")
    refuse_work(monkeypatch, module, "busy_cores", "slow_threads")
    assert exit_code(module.main, ["--out", str(tmp_path / "demo"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_serve_memory_refuses_a_missing_checkpoint(bench, monkeypatch, capsys, tmp_path):
    module = bench("serve_memory")
    refuse_work(monkeypatch, module, "busy_cores", "measure_server")
    assert exit_code(module.main, ["--checkpoint", str(tmp_path / "missing.pt")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


# ---------------------------------------------------------------- bench/punctuation_rules.py and bench/scene_compare_cost.py


@pytest.mark.parametrize(("argv", "message"), [(["--scenes", "0"], "at least 1"), (["--data", "/nonexistent/data"], "lacks flickr8k/Flickr8k.token.txt")])
def test_punctuation_rules_refuses_bad_options_before_reading(bench, monkeypatch, capsys, argv, message):
    module = bench("punctuation_rules")
    refuse_work(monkeypatch, module, "busy_cores", "read_flickr8k_captions", "SubwordModel")
    assert exit_code(module.main, argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [(["--scenes", "0"], "at least 1"), ([], "does not exist")])
def test_scene_compare_cost_refuses_bad_options_before_loading(bench, monkeypatch, capsys, tmp_path, argv, message):
    module = bench("scene_compare_cost")
    refuse_work(monkeypatch, module, "busy_cores", "evaluate_scenes")
    assert exit_code(module.main, ["--checkpoint", str(tmp_path / "missing.pt"), *argv]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- bench/backbones.py


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--backbones", "resnet9"], "--backbones: resnet9; choose among efficientnet_lite0"), (["--backbones", ","], "none given"), (["--photos", "0"], "--photos")],
)
def test_backbones_refuses_bad_options_before_any_work(bench, monkeypatch, capsys, argv, message):
    module = bench("backbones")
    refuse_work(monkeypatch, module, "busy_cores", "measure", "read_caption_split")
    assert exit_code(module.main, argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_backbones_measures_each_variant_at_its_own_grid(bench):
    module = bench("backbones")
    found = module.measure("efficientnet_lite1", torch.rand(2, 3, 240, 240), trainable_blocks=2)
    assert (found["image_size"], found["cells"], found["cached_map"]) == (240, 64, [192, 8, 8])  # the map before the last two blocks
    assert found["cache_kb_per_photo"] == round(192 * 8 * 8 * 2 / 1000, 1) and 0 < found["fine_tuned_parameters"] < found["parameters"]
    assert found["prefix_ms_per_photo"] > 0 and found["epoch_ms_per_photo"] > 0


def test_the_load_sample_and_the_calibration_are_shortened_only_when_asked_and_say_so(bench, monkeypatch):
    machine = bench("machine")
    monkeypatch.setenv(machine.PROBE_SCALE_VARIABLE, "0.02")  # what tests/conftest.py sets
    measured = machine.calibrate()
    assert measured["probe_scale"] == 0.02 and measured["matmul_gflops"] > 0 and measured["lstm_cell_steps_per_s"] > 0
    assert "probe_scale" not in machine.calibrate(0.06)  # a duration given outright is not the tests' shortening
    for wrong in ("0", "2", "fast"):
        monkeypatch.setenv(machine.PROBE_SCALE_VARIABLE, wrong)
        with pytest.raises(UserError, match=f"ATTNKIT_PROBE_SCALE='{wrong}': give a number above 0 and at most 1"):
            machine.busy_cores()
    monkeypatch.delenv(machine.PROBE_SCALE_VARIABLE)
    assert machine.probe_scale() == 1.0


def test_no_recorded_figure_was_measured_with_the_probes_shortened():
    recorded = (ROOT / "BENCHMARKS.md").read_text().replace('`"probe_scale": 0.02`', "")  # the sentence explaining it
    assert '"probe_scale"' not in recorded


# ---------------------------------------------------------------- bench/multi30k.py


@pytest.mark.parametrize(("given", "pieces"), [([], 2000), (["--set", "data.tokenizer.vocab_size=1500"], 1500)])
def test_multi30k_quick_trains_a_subword_recipe_with_a_vocabulary_its_pairs_hold(bench, monkeypatch, tmp_path, given, pieces):
    """--quick's 8,000 pairs hold no 6,000 pieces: the GPU recipe's try-out on a CPU stopped at "Vocabulary size too high"."""
    multi30k = bench("multi30k")
    trained = []

    class Stop(Exception):
        pass

    def train(config, **kwargs):
        trained.append(config)
        raise Stop

    monkeypatch.setattr(multi30k, "ensure_dataset", lambda folder, root: None)
    monkeypatch.setattr(multi30k, "quick_subset", lambda folder, into: into)
    monkeypatch.setattr(multi30k, "train_translation", train)
    with pytest.raises(Stop):
        multi30k.main(["--quick", "--config", str(ROOT / "tasks/configs/multi30k_de_en_transformer_gpu.yaml"), "--out", str(tmp_path), *given])
    assert trained[0].data.tokenizer.vocab_size == pieces


def test_a_benchmark_s_line_is_strict_json(bench, monkeypatch, capsys):
    """bench/scenes.py's line carried bare NaN (a share of no cases), which jq and JSON.parse refuse: null now."""
    import json

    module = bench("machine")
    monkeypatch.setattr(module, "calibrate", lambda: {})
    module.print_result({"benchmark": "x", "flip_share": float("nan")}, 0.0)
    line = capsys.readouterr().out.strip()
    assert "NaN" not in line and json.loads(line, parse_constant=lambda name: pytest.fail(f"bare {name}"))["flip_share"] is None
