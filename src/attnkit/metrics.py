"""Corpus-level scores, computed by well-kept libraries (sacreBLEU; pycocoevalcap and NLTK for captions), and
CIDEr-D per caption as a training reward (:class:`CiderD`, our own, held equal to pycocoevalcap's by a test)."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from attnkit.errors import first_line


def _reference_streams(references: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """Per-hypothesis reference lists -> sacreBLEU's streams (missing references are None)."""
    width = max((len(refs) for refs in references), default=1)
    return [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]


def translation_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]], lowercase: bool = False) -> dict[str, float | str]:
    """sacreBLEU BLEU and chrF of detokenised ``hypotheses`` against one or more references each.

    Scores are on raw (detokenised) text with sacreBLEU's own 13a tokenisation, the comparable way.
    ``bleu`` is the model's own score: case-insensitive when ``lowercase`` (a model that writes lower
    case), else sacreBLEU's case-sensitive default; ``bleu_cased`` and ``bleu_lowercased`` are both
    variants, whatever the model. Each signature says exactly how its number was computed.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    streams = _reference_streams(references)
    bleu = {}
    for name, case_insensitive in (("bleu_cased", False), ("bleu_lowercased", True)):
        metric = BLEU(lowercase=case_insensitive)
        bleu[name] = round(metric.corpus_score(list(hypotheses), streams).score, 2)
        bleu[f"{name}_signature"] = str(metric.get_signature())
    chrf = CHRF(lowercase=lowercase)
    chrf_score = chrf.corpus_score(list(hypotheses), streams)
    own = "bleu_lowercased" if lowercase else "bleu_cased"
    return {
        "bleu": bleu[own],
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": bleu[f"{own}_signature"],
        "chrf_signature": str(chrf.get_signature()),
        **bleu,
    }


# -- captioning ----------------------------------------------------------------------------------------
# pycocoevalcap's PTBTokenizer drops these (its brackets as -LRB- etc.): the single characters, and the quotes, dashes
# and dots NLTK's and Moses's tokenizers make of several ("free hugs" -> `` free hugs '')
PUNCTUATION = set(".,!?;:'\"`()[]{}-") | {"``", "''", "--", "..."}


def caption_words(words: Sequence[str]) -> list[str]:
    """Lower-cased words without punctuation tokens, as the COCO caption evaluation compares them."""
    return [word.lower() for word in words if word not in PUNCTUATION]


def java_available() -> bool:
    import shutil

    return shutil.which("java") is not None


def why_no_meteor() -> str | None:
    """Why METEOR cannot run here (None: it can). It needs Java and pycocoevalcap's METEOR jar, which the copy of
    pycocoevalcap's BLEU and CIDEr-D alone that a GPU machine is given (bench/device_wheels.sh) lacks."""
    from importlib.util import find_spec

    if not java_available():
        return "it needs Java, and no 'java' was found on PATH"
    if find_spec("pycocoevalcap.meteor") is None:
        return "this pycocoevalcap has no METEOR (its BLEU and CIDEr-D alone)"
    return None


def caption_scores(
    hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]], meteor: bool = True, log=print
) -> dict[str, float | None]:
    """BLEU-1..4, CIDEr-D and METEOR (pycocoevalcap, the COCO caption evaluation code) and NLTK's corpus BLEU-4.

    Input is tokenised: one word list per image and one list of reference word
    lists per image (all references count). Words are compared lower-cased with
    punctuation removed (what the COCO tokeniser leaves). pycocoevalcap's CIDEr is
    the CIDEr-D variant (Gaussian length penalty, clipped counts), with document
    frequencies from these references. METEOR runs Java; without Java (or without
    pycocoevalcap's METEOR) it is None and ``log`` says why. ``bleu4_nltk`` is ``nltk.translate.bleu_score.corpus_bleu`` with
    its default uniform weights, the figure popular Show-Attend-Tell code reports.
    Scores are on a 0-100 scale (CIDEr-D on 0-1000, i.e. x100, as papers print it).
    """
    from nltk.translate.bleu_score import corpus_bleu
    from pycocoevalcap.bleu.bleu import Bleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    hyps = [caption_words(h) for h in hypotheses]
    refs = [[caption_words(r) for r in rs] for rs in references]
    gold, generated = coco_inputs(hyps, refs)
    bleu, _ = Bleu(4).compute_score(gold, generated, verbose=0)
    per_image = cider_d_per_image(hyps, refs)
    scores: dict[str, float | None] = {f"bleu{n}": round(100 * bleu[n - 1], 2) for n in range(1, 5)}
    scores["cider_d"] = round(100 * float(np.mean(per_image)), 2)  # pycocoevalcap's corpus CIDEr-D: the images' mean, as it takes it
    scores["meteor"] = None
    missing = why_no_meteor() if meteor else None
    if meteor and missing is None:
        value, missing = _meteor(gold, generated)
        scores["meteor"] = None if value is None else round(100 * value, 2)
    if meteor and missing is not None:
        log(f"note: METEOR skipped: {missing}")
    with warnings.catch_warnings():  # NLTK warns when an n-gram order has no match; the score (0 there) is still right
        warnings.simplefilter("ignore", UserWarning)
        scores["bleu4_nltk"] = round(100 * corpus_bleu(refs, hyps), 2)
    return scores


def _meteor(gold: dict, generated: dict) -> tuple[float | None, str | None]:
    """pycocoevalcap's METEOR of ``generated`` against ``gold``, or None and why it failed. Its scorer runs a Java
    process and takes a lock it keeps when that process fails (a java that does not start, a missing jar): its
    __del__ then waits for the lock at exit, for ever. So a failure closes the process and frees the lock here."""
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = None
    try:
        scorer = Meteor()
        value, _ = scorer.compute_score(gold, generated)
        return value, None
    except (OSError, ValueError) as error:  # BrokenPipeError writing to it, b'' where it should have printed a score
        if scorer is not None:
            scorer.meteor_p.kill()
            with contextlib.suppress(OSError):
                scorer.meteor_p.stdin.close()  # before its __del__ does, which would flush into the broken pipe
            scorer.meteor_p.wait()
            if scorer.lock.locked():
                scorer.lock.release()
        return None, f"the METEOR scorer failed ({first_line(error)}; it runs Java with pycocoevalcap's meteor-1.5.jar)"


def coco_inputs(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> tuple[dict, dict]:
    """(references, captions) as pycocoevalcap's scorers take them, keyed by image number: words cleaned by
    :func:`caption_words` (it changes nothing the second time) and joined by spaces. Cleaned here, so that every
    scorer fed from it compares words as :class:`CiderD` does (raw tokens moved a caption's CIDEr-D by up to 0.6)."""
    def joined(words: Sequence[str]) -> str:
        return " ".join(caption_words(words))

    return {i: [joined(r) for r in rs] for i, rs in enumerate(references)}, {i: [joined(h)] for i, h in enumerate(hypotheses)}


def cider_d_per_image(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> list[float]:
    """pycocoevalcap's CIDEr-D of each caption (on its 0-10 scale), document frequencies from all of ``references``:
    their mean is :func:`caption_scores`' ``cider_d`` / 100. Words are compared as :func:`caption_words` leaves them."""
    from pycocoevalcap.cider.cider import Cider

    _, per_image = Cider().compute_score(*coco_inputs(hypotheses, references))
    return [float(score) for score in per_image]


# -- CIDEr-D as a reward ----------------------------------------------------------------------------------
CIDER_NGRAMS = 4
CIDER_SIGMA = 6.0  # the Gaussian length penalty's width, in (pycocoevalcap's) length units


def _ngram_counts(words: Sequence[str]) -> Counter:
    return Counter(tuple(words[i : i + n]) for n in range(1, CIDER_NGRAMS + 1) for i in range(len(words) - n + 1))


class CiderD:
    """CIDEr-D of one caption against one image's references, on pycocoevalcap's scale (its per-image scores: 0-10,
    papers print x100), with the document frequencies fixed once from ``references`` (the training references, for
    self-critical training: Rennie et al. 2017 fix them so a caption's reward does not depend on its batch).

    The same arithmetic as pycocoevalcap's ``CiderScorer`` (clipped tf-idf n-gram vectors, n = 1..4, cosine per n,
    the Gaussian length penalty, mean over n, mean over references, x10), including its length, which counts the
    caption's bigrams; faster for many captions because each reference's vectors are computed once.

    ``references``: per image, its reference captions as word lists; a caption is scored against the references of
    ``image`` (its index there). Words are compared as :func:`caption_scores` compares them (lower-cased, without
    punctuation)."""

    def __init__(self, references: Sequence[Sequence[Sequence[str]]]):
        if not references:
            raise ValueError("CIDEr-D needs the references of at least one image")
        counted = [[_ngram_counts(caption_words(reference)) for reference in image] for image in references]
        self.document_frequency = Counter(ngram for image in counted for ngram in set().union(*image))  # images holding each n-gram
        self.log_images = math.log(len(references))
        self.references = [[self._vector(counts) for counts in image] for image in counted]

    def _vector(self, counts: Counter) -> tuple[list[dict], list[float], int]:
        """tf-idf weights per n-gram order, their norms, and pycocoevalcap's length (the number of bigrams)."""
        weights: list[dict] = [{} for _ in range(CIDER_NGRAMS)]
        squares = [0.0] * CIDER_NGRAMS
        for ngram, count in counts.items():
            weight = count * (self.log_images - math.log(max(1.0, self.document_frequency[ngram])))
            weights[len(ngram) - 1][ngram] = weight
            squares[len(ngram) - 1] += weight * weight
        return weights, [math.sqrt(square) for square in squares], sum(counts[g] for g in weights[1])

    def score(self, caption: Sequence[str], image: int) -> float:
        weights, norms, length = self._vector(_ngram_counts(caption_words(caption)))
        total = 0.0
        references = self.references[image]
        for reference_weights, reference_norms, reference_length in references:
            penalty = math.exp(-((length - reference_length) ** 2) / (2 * CIDER_SIGMA**2))
            for n in range(CIDER_NGRAMS):
                shared = reference_weights[n]
                similarity = sum(min(weight, shared.get(ngram, 0.0)) * shared.get(ngram, 0.0) for ngram, weight in weights[n].items())
                if norms[n] and reference_norms[n]:
                    similarity /= norms[n] * reference_norms[n]
                total += similarity * penalty
        return 10.0 * total / CIDER_NGRAMS / len(references)
