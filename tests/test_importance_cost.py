"""bench/importance_cost.py: a mistake in its options is one message before any model loads."""

import pytest

from attnkit.errors import run_cli


@pytest.fixture
def importance_cost(bench, monkeypatch):
    importance_cost = bench("importance_cost")
    monkeypatch.setattr(importance_cost.AttentionComparer, "from_checkpoints", lambda *a, **k: pytest.fail("loaded models before checking the options"))
    return importance_cost


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give --joint, or both --captioner and --translator"),
        (["--captioner", "c.pt"], "give --joint, or both"),
        (["--joint", "j.pt", "--captioner", "c.pt", "--translator", "t.pt"], "give --joint, or both"),
        (["--joint", "j.pt", "--image", "no/such/photo.jpg"], "no photo at no/such/photo.jpg"),
        (["--joint", "j.pt", "--image", __file__, "--importance", "input,lime"], "unknown importance estimator 'lime'"),
    ],
)
def test_bad_options_are_one_message(importance_cost, capsys, argv, message):
    assert run_cli(importance_cost.main, argv) == 2
    assert message in capsys.readouterr().err
