"""Studies of many inputs without annotations: localisation on mosaics (each photo with three others, each source
sentence with three others) and the image half of the study for a captioner alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.analysis import (
    EMITTING,
    READING,
    Agreement,
    Erasure,
    agreement,
    agreement_means,
    erasure,
    forced_attention,
    localisation,
    mostly_inside,
    quadrant_weights,
    summarise,
    word_attention,
)
from attnkit.captioning import Captioner
from attnkit.comparison.core import MODALITIES, AttentionComparer
from attnkit.comparison.word_groups import add_parts_by_group, comparison_word_groups, pooled_by_group, summarise_erasure_by_group, word_group
from attnkit.data.batching import pad_sequences
from attnkit.data.images import mosaic_arrangements, open_mosaic
from attnkit.errors import UserError
from attnkit.importance import ESTIMATES_OF_IMPORTANCE, NORM_WEIGHTED, ImportanceSettings, as_settings, importance_maps


@dataclass(frozen=True)
class StudyInput:
    """One input of the mosaic study: a photo, a source sentence about it and a target sentence about it."""

    image: str | Path
    source: str
    target: str


class LocalisationTally:
    """Localisation of many forced sentences, pooled per word group (and, for content words, per layer and head)."""

    def __init__(self):
        self.masses: dict[str, list[Tensor]] = defaultdict(list)  # group -> each sentence's words' masses (W_g,)
        self.hits: dict[str, list[Tensor]] = defaultdict(list)
        self.head_masses: list[Tensor] = []  # each sentence's content words, (W_c, N, h)
        self.head_hits: list[Tensor] = []
        self.chance: list[tuple[float, float, int]] = []  # each sentence's region share of the memory, the share of
        # positions a peak hits it on, and its grouped words

    def add(self, groups: Sequence[str | None], mass: Tensor, hits: Tensor, region: Tensor, head_mass: Tensor | None = None, head_hits: Tensor | None = None) -> None:
        """One sentence: ``groups[t]`` of word t (None leaves it out), its (W,) masses and hits, the (L,) region; optionally (W, N, h)."""
        self.chance.append((float(region.mean()), float(mostly_inside(region).double().mean()), sum(group is not None for group in groups)))
        for group in set(groups) - {None}:
            chosen = torch.tensor([g == group for g in groups])
            self.masses[group].append(mass[chosen])
            self.hits[group].append(hits[chosen].float())
        if head_mass is not None and head_hits is not None:
            content = torch.tensor([g == "content" for g in groups])
            self.head_masses.append(head_mass[content])
            self.head_hits.append(head_hits[content].float())

    def summary(self) -> dict:
        """``chance``, ``mass``, ``pointing_chance`` and ``pointing`` over every grouped word, ``by_group``, and
        ``content_by_head`` when heads were added. ``chance`` is the ``mass`` that attention spread evenly over the
        memory would score, weighted as ``mass`` is: per word (a longer sentence has more words, and often a larger
        share of a joined source). ``pointing_chance`` is the ``pointing`` of a peak at a position drawn at random: on a
        joined source the same, on an odd grid less than a quarter (7 x 7: 9 of 49 cells lie mostly in a quadrant)."""

        def mean(parts: list[Tensor]) -> float:
            joined = torch.cat(parts) if parts else torch.empty(0)
            return round(float(joined.mean()), 4) if joined.numel() else float("nan")

        groups = sorted(self.masses)
        total_words = sum(words for *_, words in self.chance)

        def per_word(column: int) -> float:
            return round(sum(row[column] * row[-1] for row in self.chance) / total_words, 4) if total_words else float("nan")

        found = {
            "chance": per_word(0),
            "mass": mean([part for group in groups for part in self.masses[group]]),
            "pointing_chance": per_word(1),
            "pointing": mean([part for group in groups for part in self.hits[group]]),
            "by_group": {
                group: {"words": int(sum(len(part) for part in self.masses[group])), "mass": mean(self.masses[group]), "pointing": mean(self.hits[group])}
                for group in groups
            },
        }
        if self.head_masses:
            head_mass, head_hits = torch.cat(self.head_masses), torch.cat(self.head_hits)  # (content words, N, h)
            found["content_by_head"] = {"mass": _rounded_table(head_mass.mean(0)), "pointing": _rounded_table(head_hits.mean(0))}
        return found


def mosaic_study(comparer: "AttentionComparer", inputs: Sequence[StudyInput], seed: int = 0, heads: bool = False) -> dict:
    """Each input's target forced over a mosaic of its photo and three others, and over their source sentences joined.

    Per modality and word group: the mean share of a word's attention on its own input's positions (``mass``;
    chance is the region's share, about a quarter) and the pointing game (``pointing``: the peak lies mostly on
    it); with ``heads``, the same per layer and head for content words. All of that reads a word's attention at
    the step that emits it; ``reading`` has the same per modality at the step whose query has read the word
    (a ``bahdanau`` decoder attends before it reads the word it emits). ``arrangements`` records every mosaic's
    inputs in quadrant order. An input whose photo or sentences the models cannot read is skipped and said why."""
    arrangements = mosaic_arrangements(len(inputs), seed)
    tallies = {modality: LocalisationTally() for modality in MODALITIES}
    reading = {modality: LocalisationTally() for modality in MODALITIES}
    skipped = []
    for i, order in enumerate(arrangements):
        try:
            found = comparer.compare_mosaic(
                [inputs[j].image for j in order], [inputs[j].source for j in order], inputs[i].target, own=order.index(i), heads=heads
            )
        except UserError as error:  # ImageError too: an unreadable photo is named and the study goes on
            skipped.append({"input": i, "arrangement": order, "why": str(error)})
            continue
        groups = comparison_word_groups(comparer, found.comparison)
        by_head = found.head_localisation() if heads else {}
        for (modality, (mass, hits)), region in zip(found.localisation().items(), found.regions()):
            tallies[modality].add(groups, mass, hits, region, *by_head.get(modality, (None, None)))
        for (modality, (mass, hits)), region in zip(found.localisation(READING).items(), found.regions()):
            reading[modality].add(groups, mass, hits, region)
    if len(skipped) == len(inputs):
        raise UserError(f"no mosaic could be compared: {skipped[0]['why']}")
    return {
        "mosaics": len(inputs) - len(skipped), "seed": seed, "skipped": skipped, "arrangements": arrangements,
        **{modality: tally.summary() for modality, tally in tallies.items()},
        "reading": {modality: tally.summary() for modality, tally in reading.items()},
    }  # fmt: skip


def caption_attention_study(
    captioner: Captioner, items: Sequence[tuple[str | Path, str]], seed: int = 0, batch_size: int = 16, importance: bool | ImportanceSettings = True
) -> dict:
    """The image half of the study for a captioner alone (choosing an image memory needs no translator).

    ``items``: (photo, a caption of it). Each caption is forced over its photo: erasure per word group
    (what removing the peak cell, a random cell or the lowest cell does to the word); with ``importance``, each
    word's attention against its importance maps (``agreement`` per estimator and word group; True: the default
    estimators, or the :class:`attnkit.importance.ImportanceSettings` given; with ``norm_weighted`` among them, also
    that view of the attention against every estimate of importance, ``norm_weighted_agreement``); and over a mosaic of
    its photo and three others (arrangements from ``seed``, as :func:`mosaic_study`): localisation per word group,
    at the step that emits each word and (``reading``) at the step that has read it; and the spread of each
    word's attention over its photo (normalised entropy, peak, effective cells).
    Words outside the captioner's vocabulary are left out."""
    decoder, vocab, tokenizer = captioner.model.decoder, captioner.pipeline.vocab, captioner.pipeline.tokenizer
    words = [tokenizer.tokenize(caption) for _, caption in items]
    groups = [[word_group(word, vocab) for word in sentence] for sentence in words]
    erased: dict[str, list[Erasure]] = defaultdict(list)
    settings = as_settings(importance)
    agreed: dict[str, dict[str, list[Agreement]]] = {form: defaultdict(list) for form in settings.estimators} if settings else {}  # form -> group -> parts
    viewed: dict[str, dict[str, list[Agreement]]] = defaultdict(lambda: defaultdict(list))  # the norm-weighted view: form -> group -> parts
    spread: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # group -> statistic -> per word
    for start in range(0, len(items), batch_size):
        chunk = range(start, min(start + batch_size, len(items)))
        encoded = captioner.encode([items[i][0] for i in chunk])
        forced = pad_sequences([vocab.encode(words[i], add_bos=True, add_eos=True) for i in chunk]).ids.to(captioner.device)  # (B, T)
        for i, rows in zip(chunk, forced_attention(decoder, encoded, forced)):  # (W + 1, L)
            summary = summarise(rows[: len(words[i])])
            for t, group in enumerate(groups[i]):
                if group is not None:
                    for name in ("normalised_entropy", "peak", "effective_positions"):
                        spread[group][name].append(getattr(summary, name)[t])
            if settings is not None:
                grid = (encoded.layout.height, encoded.layout.width)
                maps = importance_maps(decoder, encoded.row(i - start), captioner.hideable(items[i][0], grid), forced[i - start, : len(words[i]) + 2], settings)
                for form, found in maps.items():
                    add_parts_by_group(agreed[form], agreement(rows[: len(words[i])], found[: len(words[i])], generator=torch.Generator().manual_seed(i)), groups[i])
                    if NORM_WEIGHTED in maps and form in ESTIMATES_OF_IMPORTANCE:  # the view read in place of the raw weights
                        view = maps[NORM_WEIGHTED][: len(words[i])]
                        add_parts_by_group(viewed[form], agreement(view, found[: len(words[i])], generator=torch.Generator().manual_seed(i)), groups[i])
        for row, i in enumerate(chunk):
            ids = forced[row, : len(words[i]) + 2]
            add_parts_by_group(erased, erasure(decoder, encoded.row(row), ids, generator=torch.Generator().manual_seed(i)), groups[i])
    attention = {group: {"words": len(values["peak"]), **{name: round(sum(v) / len(v), 4) for name, v in values.items()}} for group, values in sorted(spread.items())}
    tally, reading = LocalisationTally(), LocalisationTally()
    size = captioner.model.encoder_for("image").config.image_size
    arrangements = mosaic_arrangements(len(items), seed)
    for i, order in enumerate(arrangements):
        encoded = captioner.encode([open_mosaic([items[j][0] for j in order], size)])
        ids = torch.tensor([vocab.encode(words[i], add_bos=True, add_eos=True)], device=captioner.device)
        steps = forced_attention(decoder, encoded, ids, read_eos=True)[0]  # (W + 2, L)
        region = quadrant_weights((encoded.layout.height, encoded.layout.width), order.index(i))
        tally.add(groups[i], *localisation(word_attention(steps, len(words[i]), decoder.reading_offset, EMITTING), region), region)
        reading.add(groups[i], *localisation(word_attention(steps, len(words[i]), decoder.reading_offset, READING), region), region)
    found = {
        "photos": len(items),
        "grid": [encoded.layout.height, encoded.layout.width],
        "attention_by_group": attention,
        "erasure": summarise_erasure_by_group({"image": erased})["image"],
        "mosaic": {"seed": seed, "arrangements": arrangements, **tally.summary(), "reading": reading.summary()},
    }
    if settings is not None:
        found["agreement"] = {form: pooled_by_group(by_group, agreement_means) for form, by_group in agreed.items()}
    if viewed:
        found["norm_weighted_agreement"] = {form: pooled_by_group(by_group, agreement_means) for form, by_group in viewed.items()}
    return found


def _rounded_table(values: Tensor) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in values]
