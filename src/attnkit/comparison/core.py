"""One comparison: a target sentence forced through an image encoder and a text encoder, for the same words.

Legend: T target steps (words + <eos>), L grid cells, S source words, N examples.

A captioner and a translator that write the same language (the two faces of one joint model, or two separate
models) are *forced* through the same target sentence: each step's attention then belongs to the same word in
both modalities, and :mod:`attnkit.analysis` measures both with the same functions. A mosaic comparison forces
it over four inputs side by side (a 2 x 2 mosaic of photos and four joined source sentences).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from attnkit.analysis import (
    EMITTING,
    EXTRACTIONS,
    READING,
    Agreement,
    Erasure,
    agreement,
    agreement_means,
    erasure,
    erasure_means,
    forced_attention,
    forced_attention_by_head,
    json_number,
    localisation,
    quadrant_weights,
    span_weights,
    summarise,
    word_attention,
)
from attnkit.captioning import Captioner, ImageInput
from attnkit.checkpoint import load_checkpoint
from attnkit.data.batching import pad_sequences
from attnkit.data.images import MOSAIC_PHOTOS, mosaic, open_rgb
from attnkit.errors import UserError
from attnkit.importance import MODALITIES, NORM_WEIGHTED, ImportanceSettings, as_settings, importance_label, importance_maps, real_values
from attnkit.interfaces import EncoderOutput
from attnkit.model import model_from_checkpoint
from attnkit.translation import Translator
from attnkit.vocab import EOS


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
    image_importance: dict[str, Tensor] | None = None  # importance estimator -> (T, L) how much each step's token rests on each cell
    text_importance: dict[str, Tensor] | None = None  # estimator -> (T, S) per source word (compare(importance=...))
    image_values: Tensor | None = None  # (N, h, L, M) what each cell adds through each head (with the norm_weighted estimator)
    text_values: Tensor | None = None  # (N, h, S, M)
    hidden_at: dict[str, str] | None = None  # where the importance estimators hid each modality's positions (ImportanceSettings.hide_at)

    def importance_label(self, form: str, modality: str | None = None) -> str:
        """Estimator ``form``'s name in figures and reports, with where it hid ``modality``'s positions (None: both's)."""
        places = self.hidden_at or {}
        if modality is not None:
            places = {modality: places[modality]} if modality in places else {}
        return importance_label(form, places)

    def importance(self) -> dict[str, dict[str, Tensor]]:
        """Per modality and importance estimator (:mod:`attnkit.importance`), the (T, L) map of every step."""
        if self.image_importance is None or self.text_importance is None:
            raise ValueError("this comparison holds no importance maps (compare(importance=True))")
        return {"image": self.image_importance, "text": self.text_importance}

    def estimators(self) -> tuple[str, ...]:
        """The importance estimators this comparison holds maps of, in the order they were asked for (none: ())."""
        return tuple(self.image_importance) if self.image_importance is not None else ()

    def agreement(self, form: str, extraction: str = EMITTING) -> dict[str, Agreement]:
        """Per modality, how each target word's attention (under ``extraction``) agrees with its importance in
        ``form``: the importance of the word's own probability, the attention of the step ``extraction`` names.
        The shuffled baseline is seeded, so a comparison's figures are the same every time."""
        words = len(self.target_words) - 1
        maps = self.importance()
        return {
            modality: agreement(rows, maps[modality][form][:words], generator=torch.Generator().manual_seed(0))
            for modality, rows in zip(MODALITIES, self.word_attention(extraction))
        }

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
        step that emits the word and (``reading``, words only) at the step whose query has read it; with erasure,
        each word's erasure figures and their means; with importance maps, each word's maps (``importance``: per
        modality and form, the log-probability lost per position) and its attention's agreement with them, and
        the means of that agreement (``agreement``)."""
        image, text = summarise(self.image_attention), summarise(self.text_attention)
        reading = None
        if self.image_reading is not None and self.text_reading is not None:
            reading = {"image": summarise(self.image_reading), "text": summarise(self.text_reading)}

        def at(summary, t: int) -> dict:
            return {"entropy": summary.entropy[t], "peak": summary.peak[t], "effective_positions": summary.effective_positions[t]}

        erased = {"image": self.image_erasure, "text": self.text_erasure} if self.image_erasure is not None and self.text_erasure is not None else None

        def erasure_at(found: Erasure, t: int) -> dict:
            return {name: round(float(getattr(found, name)[t]), 4) for name in Erasure.__dataclass_fields__}

        maps = self.importance() if self.image_importance is not None and self.text_importance is not None else None
        agreed = {form: self.agreement(form) for form in self.estimators()} if maps is not None else None  # form -> modality -> Agreement

        def importance_at(t: int) -> dict:
            """Word t's importance maps (null where there is none: a source of one position) and, for a word, its
            attention's agreement with them."""
            found = {}
            for modality, by_form in maps.items():
                found[modality] = {form: [json_number(v) for v in by_form[form][t]] for form in self.estimators()}
                if t < len(self.target_words) - 1:
                    found[modality]["agreement"] = {
                        form: {name: json_number(getattr(agreed[form][modality], name)[t]) for name in ("rank_correlation", "peak_match", "top_mass")}
                        for form in self.estimators()
                    }
            return found

        per_word = []
        for t, word in enumerate(self.target_words):
            record = {"word": word, "image": at(image, t), "text": at(text, t)}
            if reading is not None and t < len(self.target_words) - 1:
                record["reading"] = {modality: at(summary, t) for modality, summary in reading.items()}
            if erased is not None:
                record["erasure"] = {modality: erasure_at(found, t) for modality, found in erased.items()}
            if maps is not None:
                record["importance"] = importance_at(t)
            per_word.append(record)
        means = {"image": image.mean(), "text": text.mean(), "per_word": per_word}
        if reading is not None:
            means["reading"] = {modality: summary.mean() for modality, summary in reading.items()}
        if erased is not None:
            words = slice(0, len(self.target_words) - 1)  # the words' means, as the agreement's and the studies': <eos> is no word
            means["erasure"] = {modality: erasure_means([found.steps(words)]) for modality, found in erased.items()}
        if agreed is not None:
            means["agreement"] = {modality: {form: agreement_means([agreed[form][modality]]) for form in self.estimators()} for modality in MODALITIES}
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
        cls,
        joint: str | Path | None = None,
        captioning: str | Path | None = None,
        translation: str | Path | None = None,
        device: str = "auto",
        precision: str = "checkpoint",
    ) -> "AttentionComparer":
        """A joint checkpoint (it captions and translates), or a captioning and a translation checkpoint; ``precision``:
        what they decode in (:func:`attnkit.distributed.decoding_precision`)."""
        if joint is not None:
            if captioning is not None or translation is not None:
                raise UserError("give a joint checkpoint, or a captioning and a translation checkpoint, not both")
            checkpoint = load_checkpoint(joint, task="multitask")
            model = model_from_checkpoint(checkpoint)  # built once: both faces share it
            return cls(
                Captioner.from_checkpoint(checkpoint, device=device, model=model, precision=precision),
                Translator.from_checkpoint(checkpoint, device=device, model=model, precision=precision),
            )
        if captioning is None or translation is None:
            raise UserError("give a joint checkpoint, or both a captioning and a translation checkpoint")
        return cls(Captioner.from_checkpoint(captioning, device=device, precision=precision), Translator.from_checkpoint(translation, device=device, precision=precision))

    def target_words(self, target: str) -> list[str]:
        """``target``'s words as both models tokenise it; a :class:`UserError` when they split it differently,
        when it is empty, or when every word is unknown to one of them."""
        caption_side, text_side = self.captioner.pipeline, self.translator.pipeline
        as_caption, as_translation = caption_side.tokenizer.tokenize(target), text_side.target_tokenizer.tokenize(target)
        if not as_caption:
            raise UserError("empty target sentence")
        if as_caption != as_translation:
            raise UserError(
                f"the two models split the target sentence differently ({' '.join(as_caption)!r} vs {' '.join(as_translation)!r}); "
                "give a target sentence both read the same way"
            )
        for model, unknown in self.unknown_words(as_caption).items():
            if len(unknown) == len(as_caption):
                raise UserError(f"every word of the target sentence {target!r} is unknown to the {model}: there is nothing to compare")
        return as_caption

    def unknown_words(self, words: Sequence[str]) -> dict[str, list[str]]:
        """Per model ("captioner", "translator"), the ``words`` its target vocabulary lacks: each is forced as <unk>."""
        vocabularies = {"captioner": self.captioner.pipeline.vocab, "translator": self.translator.pipeline.target_vocab}
        return {model: [word for word in words if word not in vocab] for model, vocab in vocabularies.items()}

    def _target_ids(self, targets: Sequence[str]) -> tuple[list[list[str]], Tensor, Tensor]:
        """Target words as both models tokenise them (they must agree) and as each model's ids (B, T)."""
        words = [self.target_words(target) for target in targets]
        caption_ids = pad_sequences([self.captioner.pipeline.vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        text_ids = pad_sequences([self.translator.pipeline.target_vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        return words, caption_ids, text_ids

    def compare(
        self, images: Sequence[ImageInput], sources: Sequence[str], targets: Sequence[str] | None = None, erase: bool = True, heads: bool = False,
        importance: bool | ImportanceSettings = False, each: Callable[[], object] | None = None,
    ) -> list[Comparison]:  # fmt: skip
        """Force each target (default: the caption decoded from the image) through both encoders' outputs.

        ``images``, ``sources`` and ``targets`` are parallel: example i is (image i, source i, target i).
        ``erase``: also measure what erasing memory positions from each step's attention does
        (:func:`attnkit.analysis.erasure`, random draws seeded by the example's position).
        ``heads``: also keep every layer's and head's attention (a Transformer's; an RNN's one attention).
        ``importance``: also the importance maps of every position in both modalities, by the estimators and settings
        it names (:class:`attnkit.importance.ImportanceSettings`; True: the default ones, through attention and from
        the input), batched passes per estimator and example.
        ``each``: called once as each example's comparison is done (e.g. a progress bar's ``update``).
        """
        if len(images) != len(sources) or (targets is not None and len(targets) != len(images)):
            raise UserError("give as many images as source sentences (and target sentences)")
        if targets is None:
            targets = self.decoded_targets(images)
        words, caption_ids, text_ids = self._target_ids(targets)
        text_encoded, source_words = self.translator.encode(list(sources))
        settings = as_settings(importance)
        hideable = (images, settings) if settings is not None else None
        return self._compare_encoded(words, caption_ids, text_ids, self.captioner.encode(images), text_encoded, source_words, erase, heads, hideable, each)

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
        source_words: list[list[str]], erase: bool, heads: bool, hideable: tuple[Sequence[ImageInput], ImportanceSettings] | None = None,
        each: Callable[[], object] | None = None,
    ) -> list[Comparison]:  # fmt: skip
        """Force the target ids (B, T) through both encoders' outputs (see ``compare``); ``hideable``: the images and
        the importance settings, for importance maps; ``each``: called as each example is done."""
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
                    erasure(decoder, encoded.row(i), ids[i, : len(w) + 2], generator=torch.Generator().manual_seed(i))
                    for decoder, encoded, ids in ((image_decoder, image_encoded, caption_ids), (text_decoder, text_encoded, text_ids))
                )
            maps = values = (None, None)
            if hideable is not None:
                images, settings = hideable
                image_ids, text_target = caption_ids[i, : len(w) + 2], text_ids[i, : len(w) + 2]
                maps = (
                    importance_maps(image_decoder, image_encoded.row(i), self.captioner.hideable(images[i], grid), image_ids.to(self.captioner.device), settings),
                    importance_maps(text_decoder, text_encoded.row(i), self.translator.hideable(source), text_target.to(self.translator.device), settings),
                )
                if NORM_WEIGHTED in settings.estimators:  # kept for the per-head view (evaluate_scenes' norm_weighted_by_head)
                    values = tuple(real_values(decoder, encoded.row(i)) for decoder, encoded in ((image_decoder, image_encoded), (text_decoder, text_encoded)))
            comparisons.append(
                Comparison(
                    [*w, EOS], image[: len(w) + 1], grid, source, text[: len(w) + 1], image_reading, text_reading, *erased,
                    image_every[i], text_every[i], image_decoder.reading_offset, text_decoder.reading_offset, *maps, *values,
                    None if hideable is None else dict(hideable[1].hide_at),
                )
            )  # fmt: skip
            if each is not None:
                each()
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
