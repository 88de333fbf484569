"""Caption metrics: known values, every reference counts, METEOR skipped cleanly without Java."""

import pytest

from attnkit import metrics

HYPS = [["a", "dog", "runs", "on", "the", "grass", "."], ["a", "man", "rides", "a", "bike"]]
REFS = [
    [["A", "dog", "runs", "on", "the", "grass", "."], ["a", "brown", "dog", "is", "running"]],
    [["a", "man", "rides", "a", "bike"], ["a", "person", "on", "a", "bicycle"]],
]


def test_perfect_captions_score_100_bleu_and_nltk_agrees():
    scores = metrics.caption_scores(HYPS, REFS, meteor=False)
    assert scores["bleu1"] == scores["bleu4"] == 100.0 == scores["bleu4_nltk"]
    assert scores["cider_d"] > 0 and scores["meteor"] is None


def test_every_reference_counts():
    only_second = [[REFS[0][1]], [REFS[1][1]]]
    assert metrics.caption_scores(HYPS, only_second, meteor=False)["bleu1"] < metrics.caption_scores(HYPS, REFS, meteor=False)["bleu1"]


def test_meteor_runs_with_java_and_is_skipped_with_a_notice_without(monkeypatch):
    if metrics.java_available():
        assert 0 < metrics.caption_scores(HYPS, REFS)["meteor"] <= 100
    notes = []
    monkeypatch.setattr(metrics, "java_available", lambda: False)
    assert metrics.caption_scores(HYPS, REFS, log=notes.append)["meteor"] is None
    assert notes and "METEOR skipped" in notes[0]


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError):
        metrics.caption_scores(HYPS, REFS[:1])
