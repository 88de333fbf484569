"""Statistics of many comparisons by groups of words: content words, function words (a closed-class list) and
punctuation; erasure and attention pooled per group."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from attnkit.analysis import EMITTING, Erasure, erasure_means, summarise
from attnkit.comparison.core import MODALITIES, AttentionComparer, Comparison
from attnkit.vocab import Vocabulary


# Closed-class English words: articles, prepositions, conjunctions, pronouns, auxiliaries. Everything else with
# a letter or digit is a content word; tokens without one are punctuation. (English: the target language of
# every recipe that captions.)
FUNCTION_WORDS = frozenset(
    "a an the this that these those some any each every another other "
    "of in on at to from by with without for into onto over under above below near behind between through across "
    "along around down up out off while as like than and or but nor so if because "
    "i you he she it we they me him her us them his its our their my your there here "
    "is are was were be been being am has have had do does did can could will would should may might must "
    "not no 's".split()
)


def word_group(word: str, *vocabularies: Vocabulary) -> str | None:
    """content / function / punctuation; None for a word outside any of ``vocabularies`` (its attention is not the word's)."""
    if any(word not in vocab for vocab in vocabularies):
        return None
    if not any(character.isalnum() for character in word):
        return "punctuation"
    return "function" if word in FUNCTION_WORDS else "content"


def comparison_word_groups(comparer: "AttentionComparer", comparison: Comparison) -> list[str | None]:
    """The group of each target word (not <eos>); a word counts when both models know it: the same words in both modalities."""
    vocabularies = (comparer.captioner.pipeline.vocab, comparer.translator.pipeline.target_vocab)
    return [word_group(word, *vocabularies) for word in comparison.target_words[:-1]]


def erasure_groups() -> dict[str, dict[str, list[Erasure]]]:
    """An empty modality -> group -> erasure parts, for :func:`add_erasure_by_group` to fill."""
    return {modality: defaultdict(list) for modality in MODALITIES}


def add_erasure_by_group(into: dict[str, dict[str, list[Erasure]]], comparison: Comparison, groups: Sequence[str | None]) -> None:
    """Add one comparison's erasure of its words to ``into`` (modality -> group -> parts); ``groups[t]`` is word t's
    group, None leaves the word out (<eos> is never in a group)."""
    for modality, found in (("image", comparison.image_erasure), ("text", comparison.text_erasure)):
        add_erasure_parts(into[modality], found, groups)


def add_erasure_parts(into: dict[str, list[Erasure]], found: Erasure, groups: Sequence[str | None]) -> None:
    """Add one sentence's erasure (its words and <eos>) to ``into`` (group -> parts), each group's words apart."""
    for group in set(groups) - {None}:
        into[group].append(found.steps(torch.tensor([g == group for g in groups] + [False])))  # the words of one group


def summarise_erasure_by_group(erased: dict[str, dict[str, list[Erasure]]], key: str = "by_group") -> dict:
    """Per modality, the erasure means over every grouped word and (under ``key``) per group."""
    return {
        modality: {
            **erasure_means([part for parts in by_group.values() for part in parts]),
            key: {group: erasure_means(parts) for group, parts in sorted(by_group.items())},
        }
        for modality, by_group in erased.items()
    }


def attention_by_group(comparisons: Sequence[Comparison], groups: Sequence[Sequence[str | None]], extraction: str = EMITTING) -> dict:
    """Per modality, the mean entropy, normalised entropy, peak weight and effective positions of the grouped words'
    attention (all of them, and ``by_group``), and the coverage of each sentence's attention over its memory
    (the largest column sum and the spread of the column sums, over every step) averaged over the sentences.
    ``groups[i][t]``: the group of word t of comparison i (None leaves the word out)."""
    names = ("entropy", "normalised_entropy", "peak", "effective_positions")
    values = {modality: defaultdict(lambda: defaultdict(list)) for modality in MODALITIES}  # modality -> group -> statistic -> per word
    covered = {modality: defaultdict(list) for modality in MODALITIES}
    for comparison, word_groups in zip(comparisons, groups):
        for modality, rows, whole in zip(MODALITIES, comparison.word_attention(extraction), (comparison.image_attention, comparison.text_attention)):
            summary = summarise(rows)
            for t, group in enumerate(word_groups):
                if group is not None:
                    for name in names:
                        values[modality][group][name].append(getattr(summary, name)[t])
            whole_summary = summarise(whole).mean()
            for name in ("coverage_max", "coverage_std"):
                covered[modality][name].append(whole_summary[name])

    def means(by_name: dict[str, list[float]]) -> dict:
        return {"words": len(by_name["peak"]), **{name: round(sum(v) / len(v), 4) if v else float("nan") for name, v in by_name.items()}}

    result = {}
    for modality in MODALITIES:
        everything = defaultdict(list)
        for by_name in values[modality].values():
            for name, v in by_name.items():
                everything[name] += v
        result[modality] = {
            **means(everything),
            **{name: round(sum(v) / len(v), 4) for name, v in covered[modality].items() if v},
            "by_group": {group: means(by_name) for group, by_name in sorted(values[modality].items())},
        }
    return result
