"""bench/flickr8k.py: a mistake in its options is one message before any data is prepared or any model trained."""

import sys
from pathlib import Path

import pytest

from attnkit.errors import run_cli

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def flickr8k(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import flickr8k

    monkeypatch.setattr(flickr8k, "ensure_dataset", lambda *_: pytest.fail("prepared data before checking the options"))
    monkeypatch.setattr(flickr8k, "train_captioning", lambda *_a, **_k: pytest.fail("trained before checking the options"))
    yield flickr8k
    sys.modules.pop("flickr8k", None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--choose", "train.no_such_key=1,2"], "no_such_key"),
        (["--choose", "decoder.dropout=0.1,7"], "decoder.dropout"),
        (["--set", "decoder.nope=1"], "nope"),
        (["--seeds", "0,1,0"], "names 0 twice"),
        (["--seeds", "zero"], "whole numbers"),
        (["--beams", "0,5"], "at least 1"),
        (["--beams", "5,5"], "names 5 twice"),
        (["--choose", "decoder.dropout"], "must look like"),
    ],
)
def test_bad_options_are_one_message_before_any_work(flickr8k, capsys, argv, message):
    assert run_cli(flickr8k.main, argv) == 2
    assert message in capsys.readouterr().err


def test_numbers_and_their_summary(flickr8k):
    assert flickr8k.numbers("0, 1,2", "--seeds", 0) == [0, 1, 2]
    assert flickr8k.mean_and_spread([21.0, 22.5]) == {"mean": 21.75, "spread": 1.5, "runs": [21.0, 22.5]}
