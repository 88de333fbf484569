"""Caption metrics (known values, every reference counts, METEOR skipped cleanly without Java) and
translation BLEU, cased and lower-cased."""

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
    assert scores["meteor"] is None


def test_cider_d_of_a_constructed_case_is_known_exactly():
    # Image 0: the caption is each reference (once lower-cased and without punctuation), so every n-gram
    # vector equals the reference's and the lengths agree: 10 (CIDEr-D's maximum). Image 1: the caption
    # shares no word with its references: 0. The corpus score is their mean, x100: 500.
    hyps = [["the", "red", "bus", "stops", "here"], ["a", "cat", "sleeps", "on", "grass"]]
    refs = [
        [["The", "red", "bus", "stops", "here", "."], ["the", "red", "bus", "stops", "here"]],
        [["two", "dogs", "play", "outside"], ["dogs", "running", "in", "snow"]],
    ]
    assert metrics.caption_scores(hyps, refs, meteor=False)["cider_d"] == 500.0


def test_every_reference_counts():
    only_second = [[REFS[0][1]], [REFS[1][1]]]
    assert metrics.caption_scores(HYPS, only_second, meteor=False)["bleu1"] < metrics.caption_scores(HYPS, REFS, meteor=False)["bleu1"]


@pytest.mark.slow
def test_meteor_runs_with_java():
    if not metrics.java_available():
        pytest.skip("METEOR needs Java, and no 'java' was found on PATH")
    assert 0 < metrics.caption_scores(HYPS, REFS)["meteor"] <= 100


def test_meteor_is_skipped_with_a_notice_without_java(monkeypatch):
    notes = []
    monkeypatch.setattr(metrics, "java_available", lambda: False)
    assert metrics.caption_scores(HYPS, REFS, log=notes.append)["meteor"] is None
    assert notes and "METEOR skipped" in notes[0]


def test_meteor_is_skipped_with_a_notice_where_pycocoevalcap_has_no_meteor(monkeypatch):
    """The GPU machine gets pycocoevalcap's BLEU and CIDEr-D alone (bench/device_wheels.sh): with Java there, no crash."""
    import importlib.util

    notes = []
    monkeypatch.setattr(metrics, "java_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "pycocoevalcap.meteor" else real_find_spec(name, *rest))
    scores = metrics.caption_scores(HYPS, REFS, log=notes.append)
    assert scores["meteor"] is None and scores["cider_d"] > 0
    assert notes == ["note: METEOR skipped: this pycocoevalcap has no METEOR (its BLEU and CIDEr-D alone)"]


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError):
        metrics.caption_scores(HYPS, REFS[:1])


@pytest.mark.parametrize("lowercase", [False, True])
def test_translation_bleu_reports_both_cased_and_lowercased(lowercase):
    hypotheses = ["i'm glad you came.", "The cat sat on the mat."]
    references = [["I'm glad you came."], ["The cat sat on the mat."]]
    scores = metrics.translation_scores(hypotheses, references, lowercase=lowercase)
    assert scores["bleu_lowercased"] == 100.0 and scores["bleu_cased"] < 100.0
    assert "case:mixed" in scores["bleu_cased_signature"] and "case:lc" in scores["bleu_lowercased_signature"]
    own = "bleu_lowercased" if lowercase else "bleu_cased"
    assert scores["bleu"] == scores[own] and scores["bleu_signature"] == scores[f"{own}_signature"]


def test_cider_d_reward_equals_pycocoevalcap_on_fixed_captions():
    """Per image, against that image's references, with document frequencies from the same references."""
    import random

    import numpy as np
    from pycocoevalcap.cider.cider import Cider

    from attnkit.metrics import CiderD, caption_words, cider_d_per_image

    rng = random.Random(0)
    words = "a dog runs on the grass two men ride bikes down hill child in red shirt plays with ball".split()
    references = [[[rng.choice(words) for _ in range(rng.randint(3, 12))] for _ in range(rng.randint(1, 5))] for _ in range(30)]
    references[0] = [["A", "dog", "runs", "on", "the", "grass", "."], ["a", "brown", "dog", "runs", "."]]
    captions = [[rng.choice(words) for _ in range(rng.randint(0, 12))] for _ in references]
    captions[0] = ["a", "dog", "runs", "on", "grass"]
    captions[1] = references[1][0]  # a caption equal to one of its references
    reward = CiderD(references)
    ours = [reward.score(caption, image) for image, caption in enumerate(captions)]
    gold = {i: [" ".join(caption_words(r)) for r in rs] for i, rs in enumerate(references)}
    generated = {i: [" ".join(caption_words(c))] for i, c in enumerate(captions)}
    _, theirs = Cider().compute_score(gold, generated)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    assert ours[0] > 1.0 and ours[1] > ours[2]
    # The per-image scores the bootstrap reads clean raw tokens as the reward does (they took "A" and "." as words)
    np.testing.assert_allclose(cider_d_per_image(captions, references), ours, rtol=1e-9, atol=1e-12)


def test_caption_words_drop_what_cocos_tokenizer_drops():
    """pycocoevalcap's PTBTokenizer leaves out its PUNCTUATIONS; the quotes, dashes and dots NLTK and Moses make of
    several characters (a "free hugs" sign: `` free hugs '') are among them, not words to match."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    from attnkit.metrics import PUNCTUATION, caption_words

    assert {mark for mark in PUNCTUATIONS if not mark.startswith("-") or mark in ("-", "--")} <= PUNCTUATION  # -LRB- and kin: no tokenizer here makes them
    assert caption_words(["A", "man", "holds", "a", "``", "free", "hugs", "''", "sign", "...", "--", "Tom", "'s"]) == ["a", "man", "holds", "a", "free", "hugs", "sign", "tom", "'s"]


def test_a_meteor_scorer_that_fails_is_a_note_not_a_hang(tmp_path, monkeypatch):
    """A java that does not start (or a missing jar) gave pycocoevalcap's ValueError or BrokenPipeError, and then its
    scorer's __del__ waited for the lock its compute_score had kept: the command never ended."""
    import os
    import subprocess
    import sys

    pytest.importorskip("pycocoevalcap")
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    code = "from attnkit import metrics; print(metrics.caption_scores([['a', 'dog']], [[['a', 'dog', 'runs']]], log=print)['meteor'])"
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "note: METEOR skipped: the METEOR scorer failed" in done.stdout and done.stdout.strip().endswith("None")
    assert "Traceback" not in done.stderr
