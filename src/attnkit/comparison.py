"""Attention over image regions next to attention over source words, for the same target words.

Legend: T target steps (words + <eos>), L grid cells, S source words, N examples.

A captioner and a translator that write the same language (the two faces of one
joint model, or two separate models) are *forced* through the same target
sentence: each step's attention then belongs to the same word in both
modalities, and :mod:`attnkit.analysis` measures both with the same functions.
On generated scenes (:mod:`attnkit.data.scenes`) the ground truth is known, so
:func:`evaluate_scenes` also scores grounding: the pointing game and in-box mass
for images, the alignment error rate for text, plus caption and translation quality.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from attnkit.analysis import (
    EMITTING,
    EXTRACTIONS,
    READING,
    Erasure,
    ImageGrounding,
    TextGrounding,
    forced_attention,
    forced_attention_by_head,
    image_grounding,
    localisation,
    quadrant_weights,
    span_weights,
    summarise,
    text_grounding,
    erasure,
    erasure_means,
    word_attention,
)
from attnkit.captioning import Captioner, ImageInput
from attnkit.checkpoint import load_checkpoint
from attnkit.data.batching import pad_sequences
from attnkit.data.images import MOSAIC_PHOTOS, mosaic, mosaic_arrangements, open_mosaic, open_rgb
from attnkit.data.scenes import Scene, word_kind
from attnkit.errors import UserError
from attnkit.interfaces import EncoderOutput
from attnkit.metrics import caption_scores, translation_scores
from attnkit.model import model_from_checkpoint
from attnkit.translation import Translator
from attnkit.vocab import EOS, Vocabulary


@dataclass(frozen=True)
class Comparison:
    """One target sentence's attention in both modalities."""

    target_words: list[str]  # forced target tokens, <eos> last: one per attention row
    image_attention: Tensor  # (T, L) over grid cells, row-major: the step that emits each token
    grid: tuple[int, int]  # (height, width) of the image grid
    source_words: list[str]  # what the text encoder read
    text_attention: Tensor  # (T, S)
    image_reading: Tensor | None = None  # (T - 1, L) each word's attention at the step whose query has read it
    text_reading: Tensor | None = None  # (T - 1, S) (see attnkit.analysis.word_attention)
    image_erasure: Erasure | None = None  # what removing image cells from each step's attention does to its token
    text_erasure: Erasure | None = None  # the same for source words
    image_heads: Tensor | None = None  # (T + 1, N, h, L) every layer's and head's attention of every step (compare(heads=True))
    text_heads: Tensor | None = None  # (T + 1, N, h, S); the steps of ``forced_attention(read_eos=True)``
    image_offset: int = 1  # the captioner's decoder.reading_offset
    text_offset: int = 1  # the translator's

    def head_attention(self, extraction: str) -> tuple[Tensor, Tensor]:
        """Every head's attention of the target words under ``extraction``: (W, N, h, L), (W, N', h', S)."""
        if self.image_heads is None or self.text_heads is None:
            raise ValueError("this comparison holds no per-head attention (compare(heads=True))")
        words = len(self.target_words) - 1
        image = word_attention(self.image_heads, words, self.image_offset, extraction)
        return image, word_attention(self.text_heads, words, self.text_offset, extraction)

    def word_attention(self, extraction: str) -> tuple[Tensor, Tensor]:
        """The image and text attention of the target *words* (not <eos>) under ``extraction``: (W, L), (W, S)."""
        words = len(self.target_words) - 1
        if extraction == EMITTING:
            return self.image_attention[:words], self.text_attention[:words]
        if extraction != READING:
            raise ValueError(f"unknown extraction '{extraction}'; choose one of {', '.join(EXTRACTIONS)}")
        if self.image_reading is None or self.text_reading is None:
            raise ValueError("this comparison holds no reading-step attention")
        return self.image_reading, self.text_reading

    def statistics(self) -> dict:
        """Mean statistics per modality and, per target word, entropy / peak / effective positions of both, at the
        step that emits the word and (``reading``, words only) at the step whose query has read it."""
        image, text = summarise(self.image_attention), summarise(self.text_attention)
        reading = None
        if self.image_reading is not None and self.text_reading is not None:
            reading = {"image": summarise(self.image_reading), "text": summarise(self.text_reading)}

        def at(summary, t: int) -> dict:
            return {"entropy": summary.entropy[t], "peak": summary.peak[t], "effective_positions": summary.effective_positions[t]}

        erased = {"image": self.image_erasure, "text": self.text_erasure} if self.image_erasure is not None and self.text_erasure is not None else None

        def erasure_at(found: Erasure, t: int) -> dict:
            return {name: round(float(getattr(found, name)[t]), 4) for name in Erasure.__dataclass_fields__}

        per_word = []
        for t, word in enumerate(self.target_words):
            record = {"word": word, "image": at(image, t), "text": at(text, t)}
            if reading is not None and t < len(self.target_words) - 1:
                record["reading"] = {modality: at(summary, t) for modality, summary in reading.items()}
            if erased is not None:
                record["erasure"] = {modality: erasure_at(found, t) for modality, found in erased.items()}
            per_word.append(record)
        means = {"image": image.mean(), "text": text.mean(), "per_word": per_word}
        if reading is not None:
            means["reading"] = {modality: summary.mean() for modality, summary in reading.items()}
        if erased is not None:
            means["erasure"] = {modality: erasure_means([found]) for modality, found in erased.items()}
        return means


class AttentionComparer:
    def __init__(self, captioner: Captioner, translator: Translator):
        caption_lang, translation_lang = captioner.pipeline.language, translator.pipeline.target_lang
        if caption_lang != translation_lang:
            raise UserError(f"the captioner writes '{caption_lang}' but the translator writes '{translation_lang}': compare models with one target language")
        self.captioner = captioner
        self.translator = translator

    @classmethod
    def from_checkpoints(
        cls, joint: str | Path | None = None, captioning: str | Path | None = None, translation: str | Path | None = None, device: str = "auto"
    ) -> "AttentionComparer":
        """A joint checkpoint (it captions and translates), or a captioning and a translation checkpoint."""
        if joint is not None:
            if captioning is not None or translation is not None:
                raise UserError("give a joint checkpoint, or a captioning and a translation checkpoint, not both")
            checkpoint = load_checkpoint(joint, task="multitask")
            model = model_from_checkpoint(checkpoint)  # built once: both faces share it
            return cls(Captioner.from_checkpoint(checkpoint, device=device, model=model), Translator.from_checkpoint(checkpoint, device=device, model=model))
        if captioning is None or translation is None:
            raise UserError("give a joint checkpoint, or both a captioning and a translation checkpoint")
        return cls(Captioner.from_checkpoint(captioning, device=device), Translator.from_checkpoint(translation, device=device))

    def _target_ids(self, targets: Sequence[str]) -> tuple[list[list[str]], Tensor, Tensor]:
        """Target words as both models tokenise them (they must agree) and as each model's ids (B, T)."""
        caption_side, text_side = self.captioner.pipeline, self.translator.pipeline
        words = []
        for target in targets:
            as_caption, as_translation = caption_side.tokenizer.tokenize(target), text_side.target_tokenizer.tokenize(target)
            if not as_caption:
                raise UserError("empty target sentence")
            if as_caption != as_translation:
                raise UserError(
                    f"the two models split the target sentence differently ({' '.join(as_caption)!r} vs {' '.join(as_translation)!r}); "
                    "give a target sentence both read the same way"
                )
            for vocab, model in ((caption_side.vocab, "captioner"), (text_side.target_vocab, "translator")):
                if all(word not in vocab for word in as_caption):
                    raise UserError(f"every word of the target sentence {target!r} is unknown to the {model}: there is nothing to compare")
            words.append(as_caption)
        caption_ids = pad_sequences([caption_side.vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        text_ids = pad_sequences([text_side.target_vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        return words, caption_ids, text_ids

    def compare(
        self, images: Sequence[ImageInput], sources: Sequence[str], targets: Sequence[str] | None = None, erase: bool = True, heads: bool = False
    ) -> list[Comparison]:
        """Force each target (default: the caption decoded from the image) through both encoders' outputs.

        ``images``, ``sources`` and ``targets`` are parallel: example i is (image i, source i, target i).
        ``erase``: also measure what erasing memory positions from each step's attention does
        (:func:`attnkit.analysis.erasure`, random draws seeded by the example's position).
        ``heads``: also keep every layer's and head's attention (a Transformer's; an RNN's one attention).
        """
        if len(images) != len(sources) or (targets is not None and len(targets) != len(images)):
            raise UserError("give as many images as source sentences (and target sentences)")
        if targets is None:
            targets = self.decoded_targets(images)
        words, caption_ids, text_ids = self._target_ids(targets)
        text_encoded, source_words = self.translator.encode(list(sources))
        return self._compare_encoded(words, caption_ids, text_ids, self.captioner.encode(images), text_encoded, source_words, erase, heads)

    def decoded_targets(self, images: Sequence[ImageInput]) -> list[str]:
        """The caption the captioner decodes from each image (its recipe's search): the default target to force."""
        captions = [best[0] for best in self.captioner.caption(images, beam_size=None)]
        for caption in captions:
            if caption.error:
                raise UserError(caption.error)
        if not all(caption.text for caption in captions):
            raise UserError("the caption decoded from the image is empty: give the target sentence yourself (--target)")
        return [caption.text for caption in captions]

    def _compare_encoded(
        self, words: list[list[str]], caption_ids: Tensor, text_ids: Tensor, image_encoded: EncoderOutput, text_encoded: EncoderOutput,
        source_words: list[list[str]], erase: bool, heads: bool,
    ) -> list[Comparison]:  # fmt: skip
        """Force the target ids (B, T) through both encoders' outputs (see ``compare``)."""
        image_decoder, text_decoder = self.captioner.model.decoder, self.translator.model.decoder
        image_steps, image_every = _forced(image_decoder, image_encoded, caption_ids.to(self.captioner.device), heads)
        text_steps, text_every = _forced(text_decoder, text_encoded, text_ids.to(self.translator.device), heads)
        grid = (image_encoded.layout.height, image_encoded.layout.width)
        comparisons = []
        for i, (w, image, source, text) in enumerate(zip(words, image_steps, source_words, text_steps)):  # (W + 2, L), (W + 2, S)
            image_reading = word_attention(image, len(w), image_decoder.reading_offset, READING)
            text_reading = word_attention(text, len(w), text_decoder.reading_offset, READING)
            erased = (None, None)
            if erase:
                erased = tuple(
                    erasure(decoder, _one(encoded, i), ids[i, : len(w) + 2], generator=torch.Generator().manual_seed(i))
                    for decoder, encoded, ids in ((image_decoder, image_encoded, caption_ids), (text_decoder, text_encoded, text_ids))
                )
            comparisons.append(
                Comparison(
                    [*w, EOS], image[: len(w) + 1], grid, source, text[: len(w) + 1], image_reading, text_reading, *erased,
                    image_every[i], text_every[i], image_decoder.reading_offset, text_decoder.reading_offset,
                )
            )  # fmt: skip
        return comparisons

    def join_sources(self, sentences: Sequence[str]) -> tuple[list[str], list[int]]:
        """Source sentences end to end as one source: its tokens and each sentence's token count.

        Each sentence is tokenised on its own (joining the strings could tokenise across the seam), so sentence
        k owns exactly positions sum(lengths[:k]) .. + lengths[k]. The joined source may be longer than the
        translator's data.max_source_length (a training filter, and where ``translate`` cuts its input), but
        not longer than the text encoder can read (learned positions): that is refused, not truncated, since
        a cut would take the last sentences' positions away."""
        pieces = [self.translator.pipeline.source_tokenizer.tokenize(sentence) for sentence in sentences]
        for number, words in enumerate(pieces, start=1):
            if not words:
                raise UserError(f"source sentence {number} of the joined source is empty")
        lengths = [len(words) for words in pieces]
        readable = self.translator.model.encoder_for("text").max_length
        if readable is not None and sum(lengths) > readable:
            raise UserError(
                f"the {len(sentences)} joined source sentences are {sum(lengths)} tokens ({' + '.join(map(str, lengths))}), longer than the "
                f"{readable} its text encoder reads (text_encoder.max_positions): give shorter sentences"
            )
        return [word for words in pieces for word in words], lengths

    def compare_mosaic(self, images: Sequence[ImageInput], sources: Sequence[str], target: str | None, own: int, heads: bool = False) -> "MosaicComparison":
        """Force ``target`` (a sentence about input ``own``; default: the caption decoded from its photo alone) over the
        2 x 2 mosaic of ``images`` and over ``sources`` joined.

        Input k is photo k in quadrant k (row-major) and sentence k in the joined source, so the localisation
        asks of both modalities the same thing: how much of each word's attention lies on its own input's part
        of the memory. ``images`` are files (read here; an unreadable one is an ImageError naming it) or PIL images."""
        if len(images) != MOSAIC_PHOTOS or len(sources) != MOSAIC_PHOTOS:
            raise UserError(f"a mosaic comparison needs {MOSAIC_PHOTOS} photos and their {MOSAIC_PHOTOS} source sentences, got {len(images)} and {len(sources)}")
        if not 0 <= own < MOSAIC_PHOTOS:
            raise UserError(f"the described input must be one of 0-{MOSAIC_PHOTOS - 1} (row-major quadrants), got {own}")
        size = self.captioner.model.encoder_for("image").config.image_size
        sheet = mosaic([image if isinstance(image, Image.Image) else open_rgb(image) for image in images], size)  # a file unreadable: ImageError naming it
        source_words, lengths = self.join_sources(sources)
        words, caption_ids, text_ids = self._target_ids([target if target is not None else self.decoded_targets([images[own]])[0]])
        image_encoded, text_encoded = self.captioner.encode([sheet]), self.translator.encode_words([source_words])
        comparison = self._compare_encoded(words, caption_ids, text_ids, image_encoded, text_encoded, [source_words], erase=False, heads=heads)[0]
        return MosaicComparison(comparison, sheet, own, tuple(lengths))


def _forced(decoder, encoded: EncoderOutput, ids: Tensor, heads: bool) -> tuple[list[Tensor], list[Tensor | None]]:
    """Every example's forced attention, and with ``heads`` every head's too, from one pass (read_eos: see ``compare``)."""
    if heads:
        return forced_attention_by_head(decoder, encoded, ids, read_eos=True)
    return forced_attention(decoder, encoded, ids, read_eos=True), [None] * ids.shape[0]


def _one(encoded: EncoderOutput, i: int) -> EncoderOutput:
    """Example ``i`` of a batch's encoder output (its layout is only for plots and is kept whole)."""
    return EncoderOutput(encoded.memory[i : i + 1], encoded.mask[i : i + 1], encoded.init_state[i : i + 1], encoded.layout)


# -- statistics of many comparisons, by groups of words ---------------------------------------------------------
MODALITIES = ("image", "text")

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


# -- mosaics: localisation without annotations ----------------------------------------------------------------
@dataclass(frozen=True)
class MosaicComparison:
    """One target sentence forced over four inputs side by side: a 2 x 2 mosaic and four joined source sentences."""

    comparison: Comparison  # its image attention is over the mosaic's grid, its text attention over the joined source
    image: Image.Image  # the mosaic itself (for plots)
    own: int  # the input the target describes: its quadrant (row-major) and its sentence's place in the joined source
    source_lengths: tuple[int, ...]  # tokens of each joined sentence, in order

    def regions(self) -> tuple[Tensor, Tensor]:
        """The own input's share of every grid cell (L,) and of every source position (S,)."""
        return quadrant_weights(self.comparison.grid, self.own), span_weights(self.source_lengths, self.own)

    def localisation(self, extraction: str = EMITTING) -> dict[str, tuple[Tensor, Tensor]]:
        """Per modality, each target word's attention mass on its own input and whether its peak lies there: (W,), (W,) bool."""
        return {modality: localisation(rows, region) for modality, rows, region in zip(MODALITIES, self.comparison.word_attention(extraction), self.regions())}

    def head_localisation(self, extraction: str = EMITTING) -> dict[str, tuple[Tensor, Tensor]]:
        """The same for every layer's head: (W, N, h) masses and hits per modality (needs ``compare_mosaic(heads=True)``)."""
        found = {}
        for modality, heads, region in zip(MODALITIES, self.comparison.head_attention(extraction), self.regions()):  # (W, N, h, L)
            mass, hits = localisation(heads.flatten(0, 2), region)  # (W * N * h,)
            found[modality] = (mass.view(heads.shape[:3]), hits.view(heads.shape[:3]))
        return found


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
        self.chance: list[float] = []  # each sentence's region share of the memory

    def add(self, groups: Sequence[str | None], mass: Tensor, hits: Tensor, region: Tensor, head_mass: Tensor | None = None, head_hits: Tensor | None = None) -> None:
        """One sentence: ``groups[t]`` of word t (None leaves it out), its (W,) masses and hits, the (L,) region; optionally (W, N, h)."""
        self.chance.append(float(region.mean()))
        for group in set(groups) - {None}:
            chosen = torch.tensor([g == group for g in groups])
            self.masses[group].append(mass[chosen])
            self.hits[group].append(hits[chosen].float())
        if head_mass is not None and head_hits is not None:
            content = torch.tensor([g == "content" for g in groups])
            self.head_masses.append(head_mass[content])
            self.head_hits.append(head_hits[content].float())

    def summary(self) -> dict:
        """``chance``, ``mass`` and ``pointing`` over every grouped word, ``by_group``, and ``content_by_head`` when heads were added."""

        def mean(parts: list[Tensor]) -> float:
            joined = torch.cat(parts) if parts else torch.empty(0)
            return round(float(joined.mean()), 4) if joined.numel() else float("nan")

        groups = sorted(self.masses)
        found = {
            "chance": round(sum(self.chance) / len(self.chance), 4) if self.chance else float("nan"),
            "mass": mean([part for group in groups for part in self.masses[group]]),
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
    it); with ``heads``, the same per layer and head for content words. ``arrangements`` records every mosaic's
    inputs in quadrant order. An input whose photo or sentences the models cannot read is skipped and said why."""
    arrangements = mosaic_arrangements(len(inputs), seed)
    tallies = {modality: LocalisationTally() for modality in MODALITIES}
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
    if len(skipped) == len(inputs):
        raise UserError(f"no mosaic could be compared: {skipped[0]['why']}")
    return {
        "mosaics": len(inputs) - len(skipped), "seed": seed, "skipped": skipped, "arrangements": arrangements,
        **{modality: tally.summary() for modality, tally in tallies.items()},
    }  # fmt: skip


def caption_attention_study(captioner: Captioner, items: Sequence[tuple[str | Path, str]], seed: int = 0, batch_size: int = 16) -> dict:
    """The image half of the study for a captioner alone (choosing an image memory needs no translator).

    ``items``: (photo, a caption of it). Each caption is forced over its photo: erasure per word group
    (what removing the peak cell, a random cell or the lowest cell does to the word); and over a mosaic of its
    photo and three others (arrangements from ``seed``, as :func:`mosaic_study`): localisation per word group;
    and the spread of each word's attention over its photo (normalised entropy, peak, effective cells).
    Words outside the captioner's vocabulary are left out."""
    decoder, vocab, tokenizer = captioner.model.decoder, captioner.pipeline.vocab, captioner.pipeline.tokenizer
    words = [tokenizer.tokenize(caption) for _, caption in items]
    groups = [[word_group(word, vocab) for word in sentence] for sentence in words]
    erased: dict[str, list[Erasure]] = defaultdict(list)
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
        for row, i in enumerate(chunk):
            ids = forced[row, : len(words[i]) + 2]
            add_erasure_parts(erased, erasure(decoder, _one(encoded, row), ids, generator=torch.Generator().manual_seed(i)), groups[i])
    attention = {group: {"words": len(values["peak"]), **{name: round(sum(v) / len(v), 4) for name, v in values.items()}} for group, values in sorted(spread.items())}
    tally = LocalisationTally()
    size = captioner.model.encoder_for("image").config.image_size
    arrangements = mosaic_arrangements(len(items), seed)
    for i, order in enumerate(arrangements):
        encoded = captioner.encode([open_mosaic([items[j][0] for j in order], size)])
        ids = torch.tensor([vocab.encode(words[i], add_bos=True, add_eos=True)], device=captioner.device)
        rows = forced_attention(decoder, encoded, ids)[0][: len(words[i])]  # (W, L): the step that emits each word
        region = quadrant_weights((encoded.layout.height, encoded.layout.width), order.index(i))
        tally.add(groups[i], *localisation(rows, region), region)
    return {
        "photos": len(items),
        "grid": [encoded.layout.height, encoded.layout.width],
        "attention_by_group": attention,
        "erasure": summarise_erasure_by_group({"image": erased})["image"],
        "mosaic": {"seed": seed, "arrangements": arrangements, **tally.summary()},
    }


def _rounded_table(values: Tensor) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in values]


# -- generated scenes: quality and grounding against the ground truth -------------------------------------------
# Which step's attention is a word's in reported scene figures unless told otherwise; both are always
# reported. Chosen on validation scenes (BENCHMARKS.md, "Scenes"), never on test scenes.
DEFAULT_EXTRACTION = EMITTING


@dataclass
class _SceneGrounding:
    """Grounding and attention statistics of forced scene sentences under one extraction, pooled over scenes."""

    image_by_kind: dict[str, ImageGrounding] = field(default_factory=lambda: defaultdict(ImageGrounding))
    text_by_kind: dict[str, TextGrounding] = field(default_factory=lambda: defaultdict(TextGrounding))
    image_entropy: list[float] = field(default_factory=list)
    text_entropy: list[float] = field(default_factory=list)
    image_peak: list[float] = field(default_factory=list)
    text_peak: list[float] = field(default_factory=list)

    def add(self, scene: Scene, number: int, image: Tensor, text: Tensor, grid: tuple[int, int]) -> None:
        """One scene's first phrasing: ``image`` (W, L) and ``text`` (W, S), one row per word."""
        self.add_image(scene, image, grid)
        self.add_text(scene, number, text)
        image_summary, text_summary = summarise(image), summarise(text)
        self.image_entropy += image_summary.normalised_entropy
        self.text_entropy += text_summary.normalised_entropy
        self.image_peak += image_summary.peak
        self.text_peak += text_summary.peak

    # Scored one kind of word at a time ("a", "of", size, colour, shape ...); every word has one
    # kind, so the kinds pooled give the totals.
    def add_image(self, scene: Scene, image: Tensor, grid: tuple[int, int]) -> None:
        """The pointing game of one scene's first phrasing, ``image`` (W, L)."""
        sentence = scene.sentences[0]
        boxes = [item.box for item in scene.objects]
        kinds = [word_kind(word) for word in sentence.english]
        for kind in set(kinds):
            referents = [r if k == kind else None for r, k in zip(sentence.referents, kinds)]
            if any(r is not None for r in referents):
                self.image_by_kind[kind] += image_grounding(image, referents, boxes, grid, (scene.size, scene.size))

    def add_text(self, scene: Scene, number: int, text: Tensor) -> None:
        """The alignment scores of one scene's first phrasing, ``text`` (W, S)."""
        sentence = scene.sentences[0]
        kinds = [word_kind(word) for word in sentence.english]
        for kind in set(kinds):
            sure, possible = ([(f, e) for f, e in links if kinds[e] == kind] for links in (sentence.sure, sentence.possible))
            if possible:
                self.text_by_kind[kind] += text_grounding(text, sure, possible, len(sentence.english), sentence=number)

    def grounding(self) -> dict:
        image_score, text_score = sum(self.image_by_kind.values(), ImageGrounding()), sum(self.text_by_kind.values(), TextGrounding())
        return {
            "image_referring_words": image_score.words,
            "pointing_hit_rate": round(100 * image_score.hit_rate, 2),
            "in_box_mass": round(image_score.mean_mass, 4),
            "text_words": text_score.words,
            "aer": round(text_score.aer, 4),
            "text_peak_on_aligned": round(100 * text_score.peak_on_aligned_rate, 2),
            "pointing_hit_rate_by_word_kind": {kind: round(100 * score.hit_rate, 2) for kind, score in sorted(self.image_by_kind.items())},
            "text_peak_on_aligned_by_word_kind": {kind: round(100 * score.peak_on_aligned_rate, 2) for kind, score in sorted(self.text_by_kind.items())},
            "words_by_word_kind": {kind: score.words for kind, score in sorted(self.text_by_kind.items())},
        }

    def attention(self) -> dict:
        def mean(values: list[float]) -> float:
            return round(sum(values) / len(values), 4)

        return {
            "image": {"normalised_entropy": mean(self.image_entropy), "peak": mean(self.image_peak)},
            "text": {"normalised_entropy": mean(self.text_entropy), "peak": mean(self.text_peak)},
        }

    def distributions(self) -> dict:
        return {"image_normalised_entropy": self.image_entropy, "text_normalised_entropy": self.text_entropy, "image_peak": self.image_peak, "text_peak": self.text_peak}


def _head_or_mean(attention: Tensor, layer: int, head: int) -> Tensor:
    """Every head's attention (W, N, h, L) -> one head's, or with ``head`` -1 the mean of the layer's heads (W, L)."""
    return attention[:, layer].mean(1) if head < 0 else attention[:, layer, head]


def _head_table(by_head: dict[str, dict[tuple[int, int], _SceneGrounding]]) -> dict:
    """Pointing hit rate of every image head and AER of every text head, as layers x heads tables (lists of
    rows), and the same of each layer's mean of heads (one value per layer)."""

    def table(scores: dict[tuple[int, int], _SceneGrounding], read) -> tuple[list[list[float]], list[float]]:
        layers, heads = (max(index[i] for index in scores) + 1 for i in (0, 1))
        rows = [[read(scores[layer, head].grounding()) for head in range(heads)] for layer in range(layers)]
        return rows, [read(scores[layer, -1].grounding()) for layer in range(layers)]

    pointing, pointing_means = table(by_head["image"], lambda g: g["pointing_hit_rate"])
    aer, aer_means = table(by_head["text"], lambda g: g["aer"])
    return {"image_pointing_hit_rate": pointing, "text_aer": aer, "image_pointing_hit_rate_layer_mean": pointing_means, "text_aer_layer_mean": aer_means}


def several_heads(grounding_by_head: dict) -> bool:
    """Whether ``grounding_by_head`` comes from a decoder of more than one layer or head (which of them ground?)."""
    return any(len(grounding_by_head[name]) * len(grounding_by_head[name][0]) > 1 for name in ("image_pointing_hit_rate", "text_aer"))


def choose_declared_attention(grounding_by_head: dict) -> tuple[int, int]:
    """The (layer, head) whose attention grounds best in a validation run's ``grounding_by_head`` (one decoder's
    heads in both modalities), by the pointing hit rate plus 100 x (1 - AER), as the extraction is chosen;
    head -1 is the mean of the layer's heads. Ties go to the earlier layer, and to the mean before a head."""
    pointing, aer = grounding_by_head["image_pointing_hit_rate"], grounding_by_head["text_aer"]
    if [len(row) for row in pointing] != [len(row) for row in aer]:
        raise ValueError("the image and the text attention come from decoders with different heads: no one choice serves both")
    means = zip(grounding_by_head["image_pointing_hit_rate_layer_mean"], grounding_by_head["text_aer_layer_mean"])
    candidates = [((layer, -1), p + 100 * (1 - a)) for layer, (p, a) in enumerate(means)]
    candidates += [((layer, head), p + 100 * (1 - a)) for layer, row in enumerate(pointing) for head, (p, a) in enumerate(zip(row, aer[layer]))]
    return max(candidates, key=lambda candidate: candidate[1])[0]  # max keeps the first of equals


def evaluate_scenes(
    comparer: AttentionComparer, scenes: Sequence[Scene], beam_size: int | None = None, batch_size: int = 64, extraction: str = DEFAULT_EXTRACTION
) -> dict:
    """Caption and translation quality, attention statistics and grounding on ``scenes``.

    Quality: the captions decoded from the images against every phrasing of their
    scene (BLEU-4, exact match), the translations of every French phrasing against
    its English twin (sacreBLEU, exact match). Grounding: each scene's first
    phrasing is forced through both encoders; the pointing game and in-box mass
    score the image attention of the words that name an object, the AER scores the
    text attention of every word against the gold links. ``grounding`` and
    ``attention`` read each word's attention as ``extraction`` says;
    ``grounding_by_extraction`` has the grounding under every extraction.
    ``erasure``: per modality (and word kind), what removing the attention peak, a
    random position or the lowest-weight one from a word's step does to its
    log-probability and its argmax (:func:`attnkit.analysis.erasure`).
    """
    if not scenes:
        raise UserError("no scenes to evaluate")
    if extraction not in EXTRACTIONS:
        raise UserError(f"unknown attention extraction '{extraction}'; choose one of {', '.join(EXTRACTIONS)}")
    images = [scene.image() for scene in scenes]
    tokenize = comparer.captioner.pipeline.tokenizer.tokenize
    captions = [best[0] for best in comparer.captioner.caption(images, beam_size, batch_size)]
    references = [[tokenize(sentence.english_text) for sentence in scene.sentences] for scene in scenes]
    caption_quality = caption_scores([c.words for c in captions], references, meteor=False)
    exact_captions = sum(c.words in refs for c, refs in zip(captions, references))

    pairs = [(sentence.french_text, sentence.english_text) for scene in scenes for sentence in scene.sentences]
    translations = [best[0] for best in comparer.translator.translate([s for s, _ in pairs], beam_size, batch_size)]
    target_tokenize = comparer.translator.pipeline.target_tokenizer.tokenize
    translation_quality = translation_scores([t.text for t in translations], [[ref] for _, ref in pairs], lowercase=True)
    exact_translations = sum(t.words == target_tokenize(ref) for t, (_, ref) in zip(translations, pairs))

    pooled = {name: _SceneGrounding() for name in EXTRACTIONS}
    by_head: dict[str, dict[tuple[int, int], _SceneGrounding]] = {modality: defaultdict(_SceneGrounding) for modality in MODALITIES}
    erased = erasure_groups()  # by word kind
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start : start + batch_size]
        compared = comparer.compare(
            images[start : start + batch_size], [s.sentences[0].french_text for s in chunk], [s.sentences[0].english_text for s in chunk], heads=True
        )
        for number, (scene, comparison) in enumerate(zip(chunk, compared), start):
            for name, scores in pooled.items():
                scores.add(scene, number, *comparison.word_attention(name), comparison.grid)
            image_heads, text_heads = comparison.head_attention(extraction)  # (W, N, h, L), (W, N', h', S)
            for layer, head in itertools.product(range(image_heads.shape[1]), range(-1, image_heads.shape[2])):  # -1: the layer's mean
                by_head["image"][layer, head].add_image(scene, _head_or_mean(image_heads, layer, head), comparison.grid)
            for layer, head in itertools.product(range(text_heads.shape[1]), range(-1, text_heads.shape[2])):
                by_head["text"][layer, head].add_text(scene, number, _head_or_mean(text_heads, layer, head))
            add_erasure_by_group(erased, comparison, [word_kind(word) for word in scene.sentences[0].english])

    return {
        "scenes": len(scenes),
        "captioning": {
            "bleu4": caption_quality["bleu4"],
            "cider_d": caption_quality["cider_d"],
            "exact_match": round(100 * exact_captions / len(scenes), 2),
        },
        "translation": {
            "sentences": len(pairs),
            "bleu": translation_quality["bleu"],
            "chrf": translation_quality["chrf"],
            "exact_match": round(100 * exact_translations / len(pairs), 2),
        },
        "extraction": extraction,
        "grounding": pooled[extraction].grounding(),
        "grounding_by_extraction": {name: scores.grounding() for name, scores in pooled.items()},
        "grounding_by_head": _head_table(by_head),
        "attention": pooled[extraction].attention(),
        "erasure": summarise_erasure_by_group(erased, "by_word_kind"),
        "distributions": {
            **pooled[extraction].distributions(),
            **{
                f"{modality}_{removed}_drop": torch.cat([getattr(part, f"{removed}_drop") for parts in by_kind.values() for part in parts]).nan_to_num(0.0).tolist()
                for modality, by_kind in erased.items()
                for removed in ("peak", "random")
            },
        },
    }


def describe_scene_result(result: dict) -> list[str]:
    """What :func:`evaluate_scenes` found, in a few lines: quality and grounding (under every extraction), then erasure."""
    grounding, caption, translation = result["grounding"], result["captioning"], result["translation"]
    lines = [
        f"caption BLEU-4 {caption['bleu4']} (exact {caption['exact_match']}%), translation BLEU {translation['bleu']} "
        f"(exact {translation['exact_match']}%), pointing {grounding['pointing_hit_rate']}%, in-box mass {grounding['in_box_mass']}, "
        f"AER {grounding['aer']} (attention of the {result['extraction']} step; "
        + ", ".join(f"{name}: pointing {g['pointing_hit_rate']}%, AER {g['aer']}" for name, g in result["grounding_by_extraction"].items())
        + ")"
    ]
    for modality, erased in result["erasure"].items():
        lines.append(
            f"  erasure, {modality}: log p(word) lost {erased['peak_drop']} (peak removed), {erased['random_drop']} (a random position), "
            f"{erased['lowest_drop']} (the lowest); the word changes {100 * erased['peak_flip']:.1f}% / {100 * erased['random_flip']:.1f}% "
            f"/ {100 * erased['lowest_flip']:.1f}% of the time"
        )
    return lines
