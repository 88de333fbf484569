"""Attention over image regions next to attention over source words, for the same target words.

One concern per module:

* :mod:`~attnkit.comparison.core`: one comparison (:class:`AttentionComparer`, :class:`Comparison`) and one
  mosaic comparison;
* :mod:`~attnkit.comparison.word_groups`: content words, function words and punctuation, and the statistics
  of many comparisons pooled per group;
* :mod:`~attnkit.comparison.studies`: the mosaic study and the captioner-only study of many inputs;
* :mod:`~attnkit.comparison.scenes`: quality and grounding on generated scenes against their ground truth.
"""

from attnkit.comparison.core import MODALITIES, AttentionComparer, Comparison, MosaicComparison
from attnkit.comparison.scenes import DEFAULT_EXTRACTION, choose_declared_attention, describe_scene_result, evaluate_scenes, several_heads
from attnkit.comparison.studies import LocalisationTally, StudyInput, caption_attention_study, mosaic_study
from attnkit.comparison.word_groups import (
    FUNCTION_WORDS,
    add_erasure_by_group,
    add_parts_by_group,
    agreement_by_group,
    attention_by_group,
    comparison_word_groups,
    erasure_groups,
    summarise_erasure_by_group,
    word_group,
)

__all__ = [
    "DEFAULT_EXTRACTION",
    "FUNCTION_WORDS",
    "MODALITIES",
    "AttentionComparer",
    "Comparison",
    "LocalisationTally",
    "MosaicComparison",
    "StudyInput",
    "add_erasure_by_group",
    "add_parts_by_group",
    "agreement_by_group",
    "attention_by_group",
    "caption_attention_study",
    "choose_declared_attention",
    "comparison_word_groups",
    "describe_scene_result",
    "erasure_groups",
    "evaluate_scenes",
    "mosaic_study",
    "several_heads",
    "summarise_erasure_by_group",
    "word_group",
]
