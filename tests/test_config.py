from pathlib import Path

import pytest

from attnkit.config import ExperimentConfig, from_dict, load_config, save_config, to_dict
from attnkit.errors import UserError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "tasks" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_recipe_loads(path):
    config = load_config(path)
    assert config.name == path.stem


def test_unknown_key_names_it_and_lists_the_valid_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("decoder:\n  hiden_size: 5\n")
    with pytest.raises(UserError) as error:
        load_config(path)
    assert "decoder.hiden_size" in str(error.value) and "hidden_size" in str(error.value)


def test_overrides_are_typed_and_nested():
    config = load_config(None, ["decoder.hidden_size=64", "train.lr=1e-4", "decoder.style=bahdanau", "train.epochs=3"])
    assert config.decoder.hidden_size == 64 and config.train.lr == 1e-4 and config.decoder.style == "bahdanau"
    with pytest.raises(UserError, match="must be int"):
        load_config(None, ["decoder.hidden_size=big"])
    with pytest.raises(UserError, match="unknown config key"):
        load_config(None, ["decoder.colour=red"])
    with pytest.raises(UserError, match="section.key=value"):
        load_config(None, ["decoder.hidden_size"])


def test_round_trip_through_yaml_and_dict(tmp_path):
    config = load_config(None, ["decoder.score=additive", "data.tokenizer.kind=nltk"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    assert from_dict(ExperimentConfig, to_dict(config)) == config


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "broken.yaml").write_text("decoder: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(tmp_path / "broken.yaml")
