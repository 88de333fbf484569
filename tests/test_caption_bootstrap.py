"""bench/caption_bootstrap.py: corpus BLEU-4 from per-photo statistics is NLTK's, a draw of every photo once gives the
split's BLEU-4 and CIDEr-D, the draws are paired (a checkpoint against itself differs by nothing in every draw), a
better caption set is above in the draws, and the script scores a checkpoint as `evaluate` does."""

import contextlib
import json
import random
import warnings

import numpy as np
import pytest
from nltk.translate.bleu_score import corpus_bleu

WORDS = "a dog runs on the grass two men play ball in park".split()


@pytest.fixture
def caption_bootstrap(bench):
    return bench("caption_bootstrap")


def random_captions(rng: random.Random, photos: int):
    caption = lambda: [rng.choice(WORDS) for _ in range(rng.randint(0, 9))]  # noqa: E731  (empty ones too)
    return [caption() for _ in range(photos)], [[caption() or ["a"] for _ in range(rng.randint(1, 5))] for _ in range(photos)]


@pytest.mark.parametrize("seed", range(6))
def test_corpus_bleu_from_the_photos_statistics_is_nltk_s(caption_bootstrap, seed):
    rng = random.Random(seed)
    hypotheses, references = random_captions(rng, photos=rng.randint(1, 40))
    if seed % 2:  # a share of the captions copied from a reference with a word changed: real 4-gram matches, BLEU well above 0
        hypotheses = [[*refs[0][:-1], "dog"] if index % 3 == 0 else hypothesis for index, (hypothesis, refs) in enumerate(zip(hypotheses, references))]
    statistics = caption_bootstrap.bleu_statistics(hypotheses, references)
    with nltk_quiet():
        expected = 100 * corpus_bleu(references, hypotheses)
    assert caption_bootstrap.corpus_bleu4(statistics.sum(0)) == pytest.approx(expected, abs=1e-9)
    assert expected > 5 or not seed % 2


@contextlib.contextmanager
def nltk_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # NLTK warns when an order has no match; the score is still its own
        yield


def photo_figures(caption_bootstrap, hypotheses, references) -> dict:
    with nltk_quiet():
        return caption_bootstrap.photo_figures(hypotheses, references)


def test_a_draw_of_every_photo_once_gives_the_whole_split_s_figures(caption_bootstrap):
    from attnkit.metrics import caption_scores

    hypotheses, references = random_captions(random.Random(3), photos=25)
    checkpoint = photo_figures(caption_bootstrap, hypotheses, references)
    once = caption_bootstrap.figures(checkpoint, np.ones((1, 25), dtype=np.int64))
    whole = caption_bootstrap.figures(checkpoint)
    with nltk_quiet():
        scored = caption_scores(hypotheses, references, meteor=False)
    for figure in ("bleu4_nltk", "cider_d"):
        assert once[figure][0] == pytest.approx(whole[figure], abs=1e-9) and round(float(whole[figure]), 2) == scored[figure], figure


def test_the_draws_are_paired_and_a_better_caption_set_is_above_in_them(caption_bootstrap):
    rng = random.Random(7)
    hypotheses, references = random_captions(rng, photos=60)
    better = [list(refs[0]) if index % 3 == 0 else hypothesis for index, (hypothesis, refs) in enumerate(zip(hypotheses, references))]  # a third copied from a reference
    checkpoints = [photo_figures(caption_bootstrap, captions, references) for captions in (hypotheses, hypotheses, better)]
    same, improved = caption_bootstrap.compare(["a", "a again", "better"], checkpoints, resamples=300, seed=0)[1:]
    for figure in ("bleu4_nltk", "cider_d"):
        assert same[figure]["minus_first"] == 0 and same[figure]["interval_95"] == [0, 0] and same[figure]["share_above_first"] == 0, figure
        assert improved[figure]["minus_first"] > 0 and improved[figure]["interval_95"][0] > 0 and improved[figure]["share_above_first"] == 1.0, figure


def test_a_checkpoint_against_itself_scores_as_evaluate_and_differs_by_nothing(caption_bootstrap, tmp_path, capsys):
    from attnkit.captioning import Captioner, train_captioning
    from attnkit.config import load_config
    from attnkit.data.captions import image_root, read_caption_split
    from test_captioning import TINY, write_shape_images

    data = write_shape_images(tmp_path)
    config = load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'run'}", "train.epochs=2", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    checkpoint = str(tmp_path / "run" / "best.pt")
    assert caption_bootstrap.main([checkpoint, checkpoint, "--data", str(data), "--beam", "2", "--resamples", "50"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first, second = result["checkpoints"]
    evaluated = Captioner.from_checkpoint(checkpoint).evaluate(read_caption_split(data, "test"), image_root(data), beam_size=2, meteor=False, log=lambda _: None)
    assert result["photos"] == 12
    for figure in ("bleu4_nltk", "cider_d"):
        assert first[figure]["value"] == second[figure]["value"] == evaluated[figure], figure
        assert second[figure]["minus_first"] == 0 and second[figure]["interval_95"] == [0, 0], figure


@pytest.mark.parametrize("argv, message", [(["one.pt"], "give two or more checkpoints"), (["one.pt", "two.pt"], "no checkpoint at one.pt, two.pt")])
def test_bad_input_is_one_message(caption_bootstrap, capsys, argv, message):
    from attnkit.errors import run_cli

    assert run_cli(caption_bootstrap.main, argv) == 2
    assert message in capsys.readouterr().err


def test_resamples_must_be_a_positive_count(caption_bootstrap, capsys):
    with pytest.raises(SystemExit) as exit:
        caption_bootstrap.main(["a.pt", "b.pt", "--resamples", "0"])
    assert exit.value.code == 2 and "--resamples: must be at least 1" in capsys.readouterr().err
