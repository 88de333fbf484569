"""bench/recipe_speed.py times each recipe's real training epoch on the same pairs (tiny recipes, toy data)."""

import pytest
import torch

from attnkit.errors import UserError, run_cli


@pytest.fixture
def recipe_speed(bench):
    return bench("recipe_speed")


def test_both_families_are_timed_on_the_same_pairs(recipe_speed, toy_data, tmp_path):
    results = [
        recipe_speed.measure(f"tasks/configs/{recipe}.yaml", toy_data, pairs=200, seed=1, scratch=tmp_path / recipe)
        for recipe in ("tiny", "tiny_transformer")
    ]
    assert [result["family"] for result in results] == ["rnn", "transformer"]
    assert all(result["pairs"] == 200 and result["tokens_per_s"] > 0 and result["matmul_flops_per_token"] > 0 for result in results)
    assert results[0]["target_tokens"] == results[1]["target_tokens"]  # the same sample, tokenised alike
    for result in results:  # the trainer's own count of the epoch agrees with the script's
        assert result["trainer_tokens_per_s"] == pytest.approx(result["tokens_per_s"], rel=0.5)


def test_too_few_pairs_is_one_message(recipe_speed):
    with pytest.raises(UserError, match="--pairs must be at least 64"):
        recipe_speed.main(["--pairs", "10"])


def test_the_device_option_is_parsed_and_a_missing_cuda_is_one_error(recipe_speed, monkeypatch, capsys):
    assert recipe_speed.get_args_parser().parse_args([]).device == "cpu"  # where the recorded figures come from
    assert recipe_speed.get_args_parser().parse_args(["--device", "cpu"]).device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU (this one may have one)
    monkeypatch.setattr(recipe_speed, "busy_cores", lambda: pytest.fail("the device is resolved before any work"))
    assert run_cli(recipe_speed.main, ["--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: device 'cuda' asked for, but CUDA is not available here; use device auto or cpu\n"


def test_the_chosen_device_reaches_the_recipe(recipe_speed, toy_data, tmp_path, monkeypatch):
    seen = {}
    prepare = recipe_speed.prepare_translation

    def spy(config, resume, context):
        seen.update(config=config.train.device, context=context.device)
        return prepare(config, resume, context)

    monkeypatch.setattr(recipe_speed, "prepare_translation", spy)
    result = recipe_speed.measure("tasks/configs/tiny.yaml", toy_data, pairs=64, seed=1, scratch=tmp_path, device=torch.device("cpu"))
    assert seen == {"config": "cpu", "context": torch.device("cpu")} and result["tokens_per_s"] > 0


def test_token_batches_are_timed_and_their_padded_size_reported(recipe_speed, toy_data, tmp_path):
    by_examples = recipe_speed.measure("tasks/configs/tiny.yaml", toy_data, pairs=200, seed=1, scratch=tmp_path / "a")
    by_tokens = recipe_speed.measure("tasks/configs/tiny.yaml", toy_data, pairs=200, seed=1, scratch=tmp_path / "b", overrides=["train.batch_tokens=60"])
    assert by_examples["batches"] == "16 examples" and by_examples["steps"] == 13  # 200 pairs / 16
    assert by_tokens["batches"] == "up to 60 target tokens" and 0 < by_tokens["padded_target_tokens_per_batch"] <= 60
    assert by_tokens["target_tokens"] == by_examples["target_tokens"] and by_tokens["steps"] > by_examples["steps"]
