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

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from attnkit.analysis import ImageGrounding, TextGrounding, forced_attention, image_grounding, summarise, text_grounding
from attnkit.captioning import Captioner, ImageInput
from attnkit.checkpoint import load_checkpoint
from attnkit.data.batching import pad_sequences
from attnkit.data.scenes import Scene, word_kind
from attnkit.errors import UserError
from attnkit.metrics import caption_scores, translation_scores
from attnkit.translation import Translator
from attnkit.vocab import EOS


@dataclass(frozen=True)
class Comparison:
    """One target sentence's attention in both modalities."""

    target_words: list[str]  # forced target tokens, <eos> last: one per attention row
    image_attention: Tensor  # (T, L) over grid cells, row-major
    grid: tuple[int, int]  # (height, width) of the image grid
    source_words: list[str]  # what the text encoder read
    text_attention: Tensor  # (T, S)

    def statistics(self) -> dict:
        """Mean statistics per modality and, per target word, entropy / peak / effective positions of both."""
        image, text = summarise(self.image_attention), summarise(self.text_attention)
        per_word = []
        for t, word in enumerate(self.target_words):
            per_word.append(
                {
                    "word": word,
                    "image": {"entropy": image.entropy[t], "peak": image.peak[t], "effective_positions": image.effective_positions[t]},
                    "text": {"entropy": text.entropy[t], "peak": text.peak[t], "effective_positions": text.effective_positions[t]},
                }
            )
        return {"image": image.mean(), "text": text.mean(), "per_word": per_word}


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
            return cls(Captioner.from_checkpoint(checkpoint, device=device), Translator.from_checkpoint(checkpoint, device=device))
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
            words.append(as_caption)
        caption_ids = pad_sequences([caption_side.vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        text_ids = pad_sequences([text_side.target_vocab.encode(w, add_bos=True, add_eos=True) for w in words]).ids
        return words, caption_ids, text_ids

    def compare(self, images: Sequence[ImageInput], sources: Sequence[str], targets: Sequence[str] | None = None) -> list[Comparison]:
        """Force each target (default: the caption decoded from the image) through both encoders' outputs.

        ``images``, ``sources`` and ``targets`` are parallel: example i is (image i, source i, target i).
        """
        if len(images) != len(sources) or (targets is not None and len(targets) != len(images)):
            raise UserError("give as many images as source sentences (and target sentences)")
        if targets is None:
            captions = [best[0] for best in self.captioner.caption(images, beam_size=None)]
            for caption in captions:
                if caption.error:
                    raise UserError(caption.error)
            targets = [caption.text for caption in captions]
            if not all(targets):
                raise UserError("the caption decoded from the image is empty: give the target sentence yourself (--target)")
        words, caption_ids, text_ids = self._target_ids(targets)
        image_encoded = self.captioner.encode(images)
        text_encoded, source_words = self.translator.encode(list(sources))
        image_rows = forced_attention(self.captioner.model.decoder, image_encoded, caption_ids.to(self.captioner.device))
        text_rows = forced_attention(self.translator.model.decoder, text_encoded, text_ids.to(self.translator.device))
        grid = (image_encoded.layout.height, image_encoded.layout.width)
        return [
            Comparison([*w, EOS], image_attention, grid, source, text_attention)
            for w, image_attention, source, text_attention in zip(words, image_rows, source_words, text_rows)
        ]


# -- generated scenes: quality and grounding against the ground truth -------------------------------------------
def evaluate_scenes(comparer: AttentionComparer, scenes: Sequence[Scene], beam_size: int | None = None, batch_size: int = 64) -> dict:
    """Caption and translation quality, attention statistics and grounding on ``scenes``.

    Quality: the captions decoded from the images against every phrasing of their
    scene (BLEU-4, exact match), the translations of every French phrasing against
    its English twin (sacreBLEU, exact match). Grounding: each scene's first
    phrasing is forced through both encoders; the pointing game and in-box mass
    score the image attention of the words that name an object, the AER scores the
    text attention of every word against the gold links.
    """
    if not scenes:
        raise UserError("no scenes to evaluate")
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

    image_by_kind: dict[str, ImageGrounding] = defaultdict(ImageGrounding)
    text_by_kind: dict[str, TextGrounding] = defaultdict(TextGrounding)
    image_entropy, text_entropy, image_peak, text_peak = [], [], [], []
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start : start + batch_size]
        compared = comparer.compare(images[start : start + batch_size], [s.sentences[0].french_text for s in chunk], [s.sentences[0].english_text for s in chunk])
        for number, (scene, comparison) in enumerate(zip(chunk, compared), start):
            sentence = scene.sentences[0]
            words = len(sentence.english)  # rows of the words; the last row is <eos>
            boxes = [item.box for item in scene.objects]
            # Scored one kind of word at a time ("a", "of", size, colour, shape ...); every word has one
            # kind, so the kinds pooled give the totals.
            kinds = [word_kind(word) for word in sentence.english]
            for kind in set(kinds):
                referents = [r if k == kind else None for r, k in zip(sentence.referents, kinds)]
                if any(r is not None for r in referents):
                    image_by_kind[kind] += image_grounding(comparison.image_attention, referents, boxes, comparison.grid, (scene.size, scene.size))
                sure, possible = ([(f, e) for f, e in links if kinds[e] == kind] for links in (sentence.sure, sentence.possible))
                if possible:
                    text_by_kind[kind] += text_grounding(comparison.text_attention, sure, possible, words, sentence=number)
            image_summary, text_summary = summarise(comparison.image_attention[:words]), summarise(comparison.text_attention[:words])
            image_entropy += image_summary.normalised_entropy
            text_entropy += text_summary.normalised_entropy
            image_peak += image_summary.peak
            text_peak += text_summary.peak

    image_score, text_score = sum(image_by_kind.values(), ImageGrounding()), sum(text_by_kind.values(), TextGrounding())

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 4)

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
        "grounding": {
            "image_referring_words": image_score.words,
            "pointing_hit_rate": round(100 * image_score.hit_rate, 2),
            "in_box_mass": round(image_score.mean_mass, 4),
            "text_words": text_score.words,
            "aer": round(text_score.aer, 4),
            "text_peak_on_aligned": round(100 * text_score.peak_on_aligned_rate, 2),
            "pointing_hit_rate_by_word_kind": {kind: round(100 * score.hit_rate, 2) for kind, score in sorted(image_by_kind.items())},
            "text_peak_on_aligned_by_word_kind": {kind: round(100 * score.peak_on_aligned_rate, 2) for kind, score in sorted(text_by_kind.items())},
            "words_by_word_kind": {kind: score.words for kind, score in sorted(text_by_kind.items())},
        },
        "attention": {
            "image": {"normalised_entropy": mean(image_entropy), "peak": mean(image_peak)},
            "text": {"normalised_entropy": mean(text_entropy), "peak": mean(text_peak)},
        },
        "distributions": {"image_normalised_entropy": image_entropy, "text_normalised_entropy": text_entropy, "image_peak": image_peak, "text_peak": text_peak},
    }
