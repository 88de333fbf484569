"""Corpus-level scores, computed by well-kept libraries (sacreBLEU)."""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def _reference_streams(references: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """Per-hypothesis reference lists -> sacreBLEU's streams (missing references are None)."""
    width = max((len(refs) for refs in references), default=1)
    return [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]


def translation_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]], lowercase: bool = False) -> dict[str, float | str]:
    """sacreBLEU BLEU and chrF of detokenised ``hypotheses`` against one or more references each.

    Scores are on raw (detokenised) text with sacreBLEU's own 13a tokenisation,
    the comparable way; ``lowercase`` makes BLEU case-insensitive. The signatures
    say exactly how each number was computed.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    streams = _reference_streams(references)
    bleu, chrf = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase)
    bleu_score = bleu.corpus_score(list(hypotheses), streams)
    chrf_score = chrf.corpus_score(list(hypotheses), streams)
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
