"""Generated scenes (:mod:`attnkit.data.scenes`), whose ground truth is known: caption and translation quality,
and grounding of both attentions (the pointing game and in-box mass for images, the alignment error rate for
text), per extraction, word kind, layer and head."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm import tqdm

from attnkit.analysis import (
    EMITTING,
    EXTRACTIONS,
    Agreement,
    ImageGrounding,
    TextGrounding,
    agreement_means,
    image_grounding,
    summarise,
    text_grounding,
)
from attnkit.comparison.core import MODALITIES, AttentionComparer, Comparison
from attnkit.comparison.word_groups import add_erasure_by_group, erasure_groups, summarise_erasure_by_group
from attnkit.data.scenes import CONTENT_KINDS, Scene, word_kind
from attnkit.errors import UserError
from attnkit.importance import ImportanceSettings, as_settings, importance_distribution, norm_weighted_attention
from attnkit.metrics import caption_scores, translation_scores


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
        boxes = [item.drawn_box for item in scene.objects]  # the pixels each shape covers
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
                words = [e for e, k in enumerate(kinds) if k == kind]
                self.text_by_kind[kind] += text_grounding(text, sure, possible, len(sentence.english), sentence=number, scored=words)

    def grounding(self) -> dict:
        image_score, text_score = sum(self.image_by_kind.values(), ImageGrounding()), sum(self.text_by_kind.values(), TextGrounding())
        content = sum((score for kind, score in self.text_by_kind.items() if kind in CONTENT_KINDS), TextGrounding())
        return {
            "image_referring_words": image_score.words,
            "pointing_hit_rate": round(100 * image_score.hit_rate, 2),
            "in_box_mass": round(image_score.mean_mass, 4),
            "text_words": text_score.words,
            "aer": round(text_score.aer, 4),
            "content_words": content.words,
            "aer_content_words": round(content.aer, 4),  # size, colour, shape and relation words (data.scenes.CONTENT_KINDS)
            "text_peak_on_aligned": round(100 * text_score.peak_on_aligned_rate, 2),
            "pointing_hit_rate_by_word_kind": {kind: round(100 * score.hit_rate, 2) for kind, score in sorted(self.image_by_kind.items())},
            # where the misses land: on another object (the rest on background), per kind of word
            "misses_on_other_objects_by_word_kind": {kind: score.misses_on_other_objects for kind, score in sorted(self.image_by_kind.items())},
            "misses_by_word_kind": {kind: score.words - score.hits for kind, score in sorted(self.image_by_kind.items())},
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


def _score_every_head(
    tables: dict[str, dict[tuple[int, int], _SceneGrounding]], scene: Scene, number: int, comparison: Comparison, extraction: str,
    view: Callable[[str, Tensor, int, int], Tensor],
) -> None:  # fmt: skip
    """Add one scene's first phrasing to ``tables`` (modality -> (layer, head) -> grounding), for every layer's every
    head and (head -1) every layer's heads together, as ``view(modality, heads (W, N, h, L), layer, head)`` (W, L)
    reads them from the words' attention under ``extraction``."""
    for modality, heads in zip(MODALITIES, comparison.head_attention(extraction)):  # (W, N, h, L), (W, N', h', S)
        for layer, head in itertools.product(range(heads.shape[1]), range(-1, heads.shape[2])):
            rows = view(modality, heads, layer, head)  # (W, L)
            if modality == "image":
                tables[modality][layer, head].add_image(scene, rows, comparison.grid)
            else:
                tables[modality][layer, head].add_text(scene, number, rows)


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


def require_scene_words(comparer: AttentionComparer, scenes: Sequence[Scene]) -> None:
    """One clear error when the models split a scene's forced sentences into other words than its ground truth does
    (on spaces). The gold links index the French words and the referents the English ones: Moses splits "d'" from
    the next word, and every French position after it would be scored one off (a perfect aligner scored AER 0.43)."""
    splits = (("French", comparer.translator.pipeline.source_tokenizer.tokenize), ("English", comparer.captioner.pipeline.tokenizer.tokenize))
    for scene in scenes:
        sentence = scene.sentences[0]
        for (language, split), text, gold in zip(splits, (sentence.french_text, sentence.english_text), (sentence.french, sentence.english)):
            words = split(text)
            if words != list(gold):
                raise UserError(
                    f"scene scoring reads a scene's words as its ground truth splits them, on spaces, and this model splits the"
                    f" {language} {text!r} into {' '.join(words)!r}: train the scene model with data.tokenizer.kind=space, as the scene recipes do"
                )


def evaluate_scenes(
    comparer: AttentionComparer, scenes: Sequence[Scene], beam_size: int | None = None, batch_size: int = 64, extraction: str = DEFAULT_EXTRACTION,
    importance: bool | ImportanceSettings = True, progress: bool | None = None,
) -> dict:  # fmt: skip
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
    ``importance``: also ``importance_grounding``, each importance estimator's maps (as distributions,
    :func:`attnkit.importance.importance_distribution`) scored exactly as the attention of the emitting step
    is (pointing game, in-box mass, AER), and ``agreement``: attention against importance per modality and
    estimator; True: the default estimators, or those an :class:`attnkit.importance.ImportanceSettings` names.
    With the ``norm_weighted`` estimator, ``norm_weighted_by_head``: that view of every layer's every head (and of
    each layer's heads together), scored as ``grounding_by_head`` scores the raw weights.
    ``progress``: a progress bar over the scenes as their comparisons are done (the slow part, above all with
    importance maps: docs/comparison.md gives the cost per scene); None shows it where standard error is a terminal.
    """
    if not scenes:
        raise UserError("no scenes to evaluate")
    if extraction not in EXTRACTIONS:
        raise UserError(f"unknown attention extraction '{extraction}'; choose one of {', '.join(EXTRACTIONS)}")
    require_scene_words(comparer, scenes)
    images = [scene.image() for scene in scenes]
    pipeline = comparer.captioner.pipeline
    captions = [pipeline.scored_words(best[0].words) for best in comparer.captioner.caption(images, beam_size, batch_size)]
    references = [[pipeline.tokenizer.words(sentence.english_text) for sentence in scene.sentences] for scene in scenes]
    caption_quality = caption_scores(captions, references, meteor=False)
    exact_captions = sum(caption in refs for caption, refs in zip(captions, references))

    pairs = [(sentence.french_text, sentence.english_text) for scene in scenes for sentence in scene.sentences]
    translations = [best[0] for best in comparer.translator.translate([s for s, _ in pairs], beam_size, batch_size)]
    target_tokenize = comparer.translator.pipeline.target_tokenizer.tokenize
    translation_quality = translation_scores([t.text for t in translations], [[ref] for _, ref in pairs], lowercase=True)
    exact_translations = sum(t.words == target_tokenize(ref) for t, (_, ref) in zip(translations, pairs))

    pooled = {name: _SceneGrounding() for name in EXTRACTIONS}
    by_head: dict[str, dict[tuple[int, int], _SceneGrounding]] = {modality: defaultdict(_SceneGrounding) for modality in MODALITIES}
    norm_weighted_by_head: dict[str, dict[tuple[int, int], _SceneGrounding]] = {modality: defaultdict(_SceneGrounding) for modality in MODALITIES}
    erased = erasure_groups()  # by word kind
    settings = as_settings(importance)
    by_importance = {form: _SceneGrounding() for form in settings.estimators} if settings is not None else {}
    agreed: dict[str, dict[str, list[Agreement]]] = {modality: defaultdict(list) for modality in MODALITIES}  # modality -> form -> parts
    bar = tqdm(total=len(scenes), desc="scenes compared", unit="scene", leave=False, mininterval=1.0, disable=None if progress is None else not progress)
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start : start + batch_size]
        compared = comparer.compare(
            images[start : start + batch_size], [s.sentences[0].french_text for s in chunk], [s.sentences[0].english_text for s in chunk], heads=True,
            importance=settings or False, each=bar.update,
        )  # fmt: skip
        for number, (scene, comparison) in enumerate(zip(chunk, compared), start):
            for name, scores in pooled.items():
                scores.add(scene, number, *comparison.word_attention(name), comparison.grid)
            if settings is not None:
                words = len(comparison.target_words) - 1
                maps = comparison.importance()
                for form, scores in by_importance.items():
                    image_rows, text_rows = (importance_distribution(maps[modality][form][:words]) for modality in MODALITIES)
                    scores.add(scene, number, image_rows, text_rows, comparison.grid)
                    for modality, found in comparison.agreement(form, extraction).items():
                        agreed[modality][form].append(found)
            _score_every_head(by_head, scene, number, comparison, extraction, lambda modality, heads, layer, head: _head_or_mean(heads, layer, head))
            if comparison.image_values is not None and comparison.text_values is not None:  # the norm_weighted view of every head
                values = dict(zip(MODALITIES, (comparison.image_values, comparison.text_values)))
                _score_every_head(  # at the emitting step, the importance maps' step
                    norm_weighted_by_head, scene, number, comparison, EMITTING,
                    lambda modality, heads, layer, head: norm_weighted_attention(heads, values[modality], layer, head),
                )  # fmt: skip
            add_erasure_by_group(erased, comparison, [word_kind(word) for word in scene.sentences[0].english])
    bar.close()

    with_importance = {}
    if settings is not None:
        with_importance = {
            "importance_grounding": {form: scores.grounding() for form, scores in by_importance.items()},
            **({"norm_weighted_by_head": _head_table(norm_weighted_by_head)} if norm_weighted_by_head["image"] else {}),
            "agreement": {modality: {form: agreement_means(parts) for form, parts in by_form.items()} for modality, by_form in agreed.items()},
        }
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
        **with_importance,
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
    for form, grounding in result.get("importance_grounding", {}).items():
        agreed = ", ".join(f"{modality} {by_form[form]['rank_correlation']} (shuffled {by_form[form]['shuffled_rank_correlation']})" for modality, by_form in result["agreement"].items())
        lines.append(
            f"  importance {form}: pointing {grounding['pointing_hit_rate']}%, in-box mass {grounding['in_box_mass']}, AER {grounding['aer']}; "
            f"its rank correlation with attention: {agreed}"
        )
    for modality, erased in result["erasure"].items():
        lines.append(
            f"  erasure, {modality}: log p(word) lost {erased['peak_drop']} (peak removed), {erased['random_drop']} (a random position), "
            f"{erased['lowest_drop']} (the lowest); the word changes {100 * erased['peak_flip']:.1f}% / {100 * erased['random_flip']:.1f}% "
            f"/ {100 * erased['lowest_flip']:.1f}% of the time"
        )
    return lines
