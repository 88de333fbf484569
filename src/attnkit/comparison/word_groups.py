"""Statistics of many comparisons by groups of words: content words, function words (a closed-class list) and
punctuation; erasure and attention pooled per group."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from attnkit.analysis import EMITTING, Agreement, Erasure, agreement, agreement_means, erasure_means, is_punctuation, summarise
from attnkit.comparison.core import MODALITIES, AttentionComparer, Comparison
from attnkit.vocab import Vocabulary


# Closed-class English words: articles, prepositions, conjunctions, pronouns, auxiliaries. Punctuation is what
# attnkit.analysis.is_punctuation says (no letter or digit); everything else is a content word. (English: the
# target language of every recipe that captions.)
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
    if is_punctuation(word):
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
        add_parts_by_group(into[modality], found, groups)


def add_parts_by_group(into: dict[str, list], found: Erasure | Agreement, groups: Sequence[str | None]) -> None:
    """Add one sentence's per-step figures (its words, and <eos> when ``found`` has it) to ``into`` (group -> parts),
    each group's words apart."""
    for group in set(groups) - {None}:
        words = [g == group for g in groups]
        into[group].append(found.steps(torch.tensor(words + [False] * (len(found) - len(words)))))  # the words of one group


def pooled_by_group(by_group: dict[str, list], means, key: str = "by_group") -> dict:
    """``means`` (e.g. erasure_means, agreement_means) of every group's parts pooled, and (under ``key``) of each group's."""
    return {**means([part for group in sorted(by_group) for part in by_group[group]]), key: {group: means(parts) for group, parts in sorted(by_group.items())}}


def summarise_erasure_by_group(erased: dict[str, dict[str, list[Erasure]]], key: str = "by_group") -> dict:
    """Per modality, the erasure means over every grouped word and (under ``key``) per group."""
    return {modality: pooled_by_group(by_group, erasure_means, key) for modality, by_group in erased.items()}


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


def agreement_by_group(comparisons: Sequence[Comparison], groups: Sequence[Sequence[str | None]], extraction: str = EMITTING, heads: bool = False) -> dict:
    """Per modality and importance estimator (those the comparisons hold), how the grouped words' attention (under ``extraction``) agrees with their
    importance (:func:`attnkit.analysis.agreement`): the means over every grouped word and ``by_group``; with
    ``heads`` (comparisons made with ``heads=True``), the content words' rank correlation and peak match per layer
    and head (``content_by_head``, layers x heads). ``groups[i][t]``: the group of word t of comparison i."""
    estimators = comparisons[0].estimators() if comparisons else ()
    parts = {modality: {form: defaultdict(list) for form in estimators} for modality in MODALITIES}  # -> group -> Agreements
    by_head = {modality: {form: [] for form in estimators} for modality in MODALITIES}  # -> per comparison (W_c, N, h, 2)
    for comparison, word_groups in zip(comparisons, groups):
        content = torch.tensor([g == "content" for g in word_groups])
        every_head = comparison.head_attention(extraction) if heads else None  # (W, N, h, L) per modality
        for form in estimators:
            for modality, found in comparison.agreement(form, extraction).items():
                add_parts_by_group(parts[modality][form], found, word_groups)
            if every_head is None or not content.any():
                continue
            maps = comparison.importance()
            for m, modality in enumerate(MODALITIES):
                rows = every_head[m][content]  # (W_c, N, h, L)
                importance = maps[modality][form][: len(word_groups)][content]  # (W_c, L)
                repeated = importance[:, None, None].expand_as(rows)
                found = agreement(rows.flatten(0, 2), repeated.flatten(0, 2), generator=torch.Generator().manual_seed(0), draws=1)
                by_head[modality][form].append(torch.stack([found.rank_correlation, found.peak_match], -1).view(*rows.shape[:3], 2))

    def summary(modality: str, form: str) -> dict:
        found = pooled_by_group(parts[modality][form], agreement_means)
        if by_head[modality][form]:
            tables = torch.cat(by_head[modality][form]).nanmean(0)  # (N, h, 2)
            found["content_by_head"] = {name: [[round(float(v), 4) for v in row] for row in tables[..., k]] for k, name in enumerate(("rank_correlation", "peak_match"))}
        return found

    return {modality: {form: summary(modality, form) for form in estimators} for modality in MODALITIES}
