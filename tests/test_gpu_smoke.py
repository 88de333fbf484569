"""bench/gpu_smoke.py keeps working where there is no GPU: the same path on a CPU with tiny models."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
@pytest.mark.parametrize("recipes", ["captioning,multitask", "translation_transformer,captioning_transformer,multitask_transformer"])
def test_gpu_smoke_runs_the_recipes_on_a_cpu(capsys, monkeypatch, recipes):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_smoke

    assert gpu_smoke.main(["--device", "cpu", "--tiny", "--recipes", recipes]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["recipes"]) == set(recipes.split(","))
    assert all(recipe["steps"] >= 2 and recipe["tokens_per_s_last_epoch"] > 0 for recipe in result["recipes"].values())
    sys.modules.pop("gpu_smoke", None)
