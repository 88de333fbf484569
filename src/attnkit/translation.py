"""Translation: text in, text out, through the shared encoder-decoder.

:class:`~attnkit.text_pipeline.TextPipeline` (the layer below, shared with
pre-training) turns raw sentences into ids and back. :class:`Translator` runs
batched search and returns detokenised text with the attention matrix of every
output. :func:`prepare_translation` is what
the task adds to the shared recipe (:func:`~attnkit.train.train_recipe`): its
data, model and validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import Checkpoint, load_checkpoint
from attnkit.config import ExperimentConfig, SearchConfig, from_dict, widened_beam
from attnkit.data.batching import pad_sequences
from attnkit.data.text import ParallelTextDataset, collate_pairs, read_parallel, resolve_languages
from attnkit.errors import UserError
from attnkit.files import write_text_atomic
from attnkit.importance import HideableSource
from attnkit.interfaces import EncoderOutput
from attnkit.metrics import translation_scores
from attnkit.losses import Seq2SeqObjective
from attnkit.model import MULTITASK, EncoderDecoder, build_translation_model, describe_parameters, model_from_checkpoint
from attnkit.pretraining import start_from_pretrained
from attnkit.search import Hypothesis, search
from attnkit.supervision import describe_gold, require_gold, scene_ground_truth, translation_gold
from attnkit.distributed import autocast, decoding_precision, resolve_device
from attnkit.text_pipeline import TextPipeline, describe_subwords
from attnkit.train import RunContext, TaskSetup, TrainingProgress, train_recipe, validation_subset
from attnkit.vocab import EOS, UNK
from attnkit.watch import DrawAttention

TASK = "translation"


@dataclass(frozen=True)
class Translation:
    source: str  # the input as given
    source_words: list[str]  # tokens the model saw (after truncation)
    words: list[str]  # output tokens
    text: str  # detokenised output
    score: float  # length-normalised log-probability
    attention: Tensor  # (T, S) rows: output steps (incl. <eos> when finished); columns: source_words
    finished: bool  # False when search hit the length limit before <eos>
    truncated: bool = False  # the input was longer than max_source_length and was cut
    error: str | None = None  # why this sentence was not translated (then text is empty)


class Translator:
    def __init__(self, model: EncoderDecoder, pipeline: TextPipeline, search: SearchConfig, device: torch.device, precision: torch.dtype = torch.float32):
        """``precision``: the autocast dtype decoding runs under (from a checkpoint: its training's, as validation ran)."""
        self.model = model.to(device).eval()
        self.pipeline = pipeline
        self.search = search
        self.device = device
        self.precision = precision

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | Path | Checkpoint, device: str = "auto", model: EncoderDecoder | None = None, precision: str = "checkpoint"
    ) -> "Translator":
        """A translator from a checkpoint file (or one already loaded); ``model``: its model when already built;
        ``precision``: what it decodes in (:func:`attnkit.distributed.decoding_precision`)."""
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = load_checkpoint(checkpoint, task=(TASK, MULTITASK))
        config = from_dict(ExperimentConfig, checkpoint.config)
        pipeline = TextPipeline.from_checkpoint(checkpoint)
        if model is None:
            model = model_from_checkpoint(checkpoint)
        device = resolve_device(device)
        return cls(model, pipeline, config.search, device, decoding_precision(precision, config.train.precision))

    def _prepare(self, sentence: str) -> tuple[list[str], bool]:
        """Source words for ``sentence``; raises UserError for input that cannot be translated."""
        words = self.pipeline.source_tokenizer.tokenize(sentence)
        if not words:
            raise UserError("empty sentence")
        vocab = self.pipeline.source_vocab
        if all(word not in vocab for word in words):
            raise UserError(f"every word of the sentence is unknown to the model ({self.pipeline.source_lang} vocabulary)")
        return self._cut(words)

    def _cut(self, words: list[str]) -> tuple[list[str], bool]:
        """The words the encoder reads (the first ``max_source_length``) and whether any were left out."""
        limit = self.pipeline.max_source_length
        return words[:limit], len(words) > limit

    def is_cut(self, sentence: str) -> bool:
        """Whether only the first ``max_source_length`` words of ``sentence`` would be read (``Translation.truncated``)."""
        return self._cut(self.pipeline.source_tokenizer.tokenize(sentence))[1]

    @torch.no_grad()
    def encode(self, sentences: list[str]) -> tuple[EncoderOutput, list[list[str]]]:
        """The text encoder's output for ``sentences`` and the source words it read (raises UserError for a bad sentence)."""
        words = [self._prepare(sentence)[0] for sentence in sentences]
        return self.encode_words(words), words

    @torch.no_grad()
    def encode_words(self, words: list[list[str]]) -> EncoderOutput:
        """The text encoder's output for sentences already split into the source tokenizer's tokens."""
        source = pad_sequences([self.pipeline.source_vocab.encode(w) for w in words]).to(self.device)
        return self.model.encode(source)

    def hideable(self, words: list[str]) -> HideableSource:
        """The source ``words`` (the source tokenizer's tokens) as a source whose words can be hidden: each keep mask
        (B, S) replaces the words it drops by ``<unk>`` and encodes the copies. The input of every estimator in
        :mod:`attnkit.importance`."""
        ids = torch.tensor(self.pipeline.source_vocab.encode(words), device=self.device)  # (S,)
        unknown = self.pipeline.source_vocab.unk_index

        @torch.no_grad()
        def encode_keeping(keep: Tensor) -> EncoderOutput:
            copies = torch.where(keep, ids, torch.full_like(ids, unknown))  # (B, S)
            return self.model.encode(pad_sequences(copies.tolist()).to(self.device))

        return HideableSource((len(words),), encode_keeping, "text")

    @torch.no_grad()
    def translate(
        self, sentences: list[str], beam_size: int | None = None, batch_size: int = 64, n_best: int = 1, replace_unknown: bool = False
    ) -> list[list[Translation]]:
        """The ``n_best`` translations of each sentence, in input order.

        Sentences that cannot be translated get one Translation with ``error`` set;
        overlong ones are truncated to ``max_source_length`` words (``truncated``).
        ``replace_unknown``: each ``<unk>`` of the output becomes the source word its step's attention
        peaks on (:func:`replace_unknown_words`). With no ``beam_size``, the checkpoint's beam is widened to ``n_best``.
        """
        beam = widened_beam(beam_size, self.search.beam_size, n_best)
        self.pipeline.target_vocab.check_beam(beam)
        results: list[list[Translation] | None] = [None] * len(sentences)
        prepared = {}
        for i, sentence in enumerate(sentences):
            try:
                prepared[i] = self._prepare(sentence)
            except UserError as error:
                results[i] = [Translation(sentence, [], [], "", float("-inf"), torch.zeros(0, 0), False, error=str(error))]
        order = sorted(prepared, key=lambda i: len(prepared[i][0]))  # similar lengths together: less padding
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            vocab = self.pipeline.target_vocab
            with autocast(self.device, self.precision):  # as validation decodes, so test and validation scores compare
                encoded = self.encode_words([prepared[i][0] for i in chunk])
                found = search(self.model.decoder, encoded, vocab.bos_index, vocab.eos_index, self.search, beam, n_best, never=vocab.never_output)
            for i, hypotheses in zip(chunk, found):
                words, truncated = prepared[i]
                results[i] = [self._translation(sentences[i], words, truncated, h, replace_unknown) for h in hypotheses]
        return results  # type: ignore[return-value]

    def _translation(self, sentence: str, source_words: list[str], truncated: bool, hypothesis: Hypothesis, replace_unknown: bool) -> Translation:
        words = self.pipeline.target_vocab.decode(hypothesis.tokens)
        if replace_unknown:
            words = replace_unknown_words(words, source_words, hypothesis.attention)
        return Translation(
            source=sentence,
            source_words=source_words,
            words=words,
            text=self.pipeline.target_tokenizer.detokenize(words),
            score=hypothesis.score,
            attention=hypothesis.attention,
            finished=hypothesis.finished,
            truncated=truncated,
        )

    def evaluate(
        self,
        pairs: list[tuple[str, str]],
        beam_size: int | None = None,
        batch_size: int = 64,
        hypotheses_file: str | Path | None = None,
        replace_unknown: bool = False,
        by_source: bool = True,
    ) -> dict:
        """sacreBLEU BLEU and chrF of the translations of ``pairs`` against their references.

        A source that several pairs share (Tatoeba keeps every translation of a sentence, one pair each) is translated
        once and scored once against all its references (:func:`references_by_source`): scored pair by pair, one
        output met each reference alone and the source counted again, so a perfect system scored about 96 BLEU on
        the embedded Tatoeba test. ``sentences`` counts the distinct sources, ``pairs`` the split's lines.
        ``by_source=False`` scores pair by pair (what validation during training does).
        ``hypotheses_file``, when given, receives the detokenised translations, one per pair (line for line with the split).
        """
        if not pairs:
            raise UserError("nothing to evaluate: no sentence pairs")
        if by_source:
            sources, references, source_of_pair = references_by_source(pairs)
        else:
            sources, references, source_of_pair = [s for s, _ in pairs], [[t] for _, t in pairs], list(range(len(pairs)))
        translations = self.translate(sources, beam_size, batch_size, replace_unknown=replace_unknown)
        hypotheses = [best[0].text for best in translations]
        if hypotheses_file is not None:
            write_text_atomic(hypotheses_file, "".join(hypotheses[source] + "\n" for source in source_of_pair))
        scores = translation_scores(hypotheses, references, lowercase=self.pipeline.target_tokenizer.config.lowercase)
        failed = sum(best[0].error is not None for best in translations)
        return {
            **scores,
            "sentences": len(sources),
            "pairs": len(pairs),
            "untranslatable": failed,
            "beam_size": beam_size or self.search.beam_size,
            "unknown_words_replaced": replace_unknown,
        }


def references_by_source(pairs: Sequence[tuple[str, str]]) -> tuple[list[str], list[list[str]], list[int]]:
    """The distinct sources of ``pairs`` in the order they first come, each with every reference the pairs give it,
    and for each pair the index of its source::

        pairs      (a, x) (b, y) (a, z)
        sources    a       b             references  [x, z]  [y]       source_of_pair  0 1 0
    """
    index: dict[str, int] = {}
    references: list[list[str]] = []
    source_of_pair = []
    for source, reference in pairs:
        if source not in index:
            index[source] = len(references)
            references.append([])
        references[index[source]].append(reference)
        source_of_pair.append(index[source])
    return list(index), references, source_of_pair


def draw_translation_attention(translation: Translation, path: str | Path) -> Path:
    """The source x output attention matrix of one translation (with its <eos> row when it finished)."""
    from attnkit.viz import plot_attention_matrix  # matplotlib: only when drawing

    rows = translation.words + ([EOS] if translation.finished else [])
    return plot_attention_matrix(translation.attention, translation.source_words, rows, path, title=translation.text)


def translation_attention_drawer(pipeline: TextPipeline, config: ExperimentConfig, source: str) -> DrawAttention:
    """Draws the attention of ``source`` (one fixed validation sentence) translated greedily by the model in training."""

    def draw(model: nn.Module, folder: Path) -> dict[str, Path]:
        translator = Translator(model, pipeline, config.search, next(model.parameters()).device)
        ((best, *_),) = translator.translate([source], beam_size=1)
        return {} if best.error else {"translation": draw_translation_attention(best, folder / "translation.png")}

    return draw


def replace_unknown_words(words: Sequence[str], source_words: Sequence[str], attention: Tensor) -> list[str]:
    """``words`` with each ``<unk>`` replaced by the source word that the attention of the step emitting it
    peaks on (Luong et al. 2015, "Addressing the Rare Word Problem"; OpenNMT's -replace_unk): a name or a
    number the vocabulary lacks is usually best copied. ``attention``: (T >= len(words), len(source_words))."""
    peaks = attention[: len(words)].argmax(dim=-1).tolist()  # (len(words),) the source position each output step looks at most
    return [source_words[peak] if word == UNK else word for word, peak in zip(words, peaks)]


def translation_validation(model: nn.Module, pipeline: TextPipeline, config: ExperimentConfig, pairs: list[tuple[str, str]]) -> dict:
    """BLEU and chrF of free-running decoding (``train.valid_beam_size``) on validation pairs."""
    translator = Translator(model, pipeline, config.search, next(model.parameters()).device)
    # Pair by pair, each line against its own reference: every recipe's schedule (plateaus, best.pt) was chosen and
    # measured under this score, and grouping the scenes' and Tatoeba's repeated sources would re-roll all of them.
    metrics = translator.evaluate(pairs, beam_size=config.train.valid_beam_size, batch_size=128, by_source=False)
    return {"bleu": metrics["bleu"], "chrf": metrics["chrf"]}


def translation_training_set(config: ExperimentConfig, pipeline: TextPipeline, pairs: list[tuple[str, str]], folder: str) -> ParallelTextDataset:
    """The training pairs as ids, with each pair's gold attention when ``train.attention_supervision`` asks for it
    (read from the scene folder that holds the dataset ``folder``)."""
    gold_of = translation_gold(scene_ground_truth(folder)) if config.train.attention_supervision > 0 else None
    dataset = pipeline.encode_pairs(pairs, config.data.max_source_length, config.data.max_target_length, gold_of)
    if gold_of is not None:
        require_gold(dataset.gold, f"training pairs of {folder}", "they must be the scene folder's own French -> English pairs, tokenised into its words, e.g. data.tokenizer.kind=space")
    return dataset


def prepare_translation(config: ExperimentConfig, resume: Checkpoint | None, context: RunContext) -> TaskSetup:
    """The translation task's data, model and validation (the vocabularies from ``resume`` when continuing)."""
    source_lang, target_lang = resolve_languages(config.data.path, config.data.source_lang, config.data.target_lang)
    config = replace(config, data=replace(config.data, source_lang=source_lang, target_lang=target_lang))
    train_pairs = read_parallel(config.data.path, "train", source_lang, target_lang)
    valid_pairs = validation_subset(read_parallel(config.data.path, "valid", source_lang, target_lang), config.train)
    pipeline = TextPipeline.from_checkpoint(resume) if resume is not None else TextPipeline.build(config, train_pairs, source_lang, target_lang)
    dataset = translation_training_set(config, pipeline, train_pairs, config.data.path)
    model = build_translation_model(config, pipeline.source_vocab, pipeline.target_vocab)
    started_from = []
    if config.text_encoder.init_from and resume is None:  # a resumed run's encoder is in its checkpoint
        started_from.append(start_from_pretrained(model.encoder_for("text"), config, pipeline.source_vocab))

    def validate(trained: nn.Module) -> dict:
        metrics = translation_validation(trained, pipeline, config, valid_pairs)
        return {**metrics, "score": metrics["bleu"]}

    notes = [
        *started_from,
        f"{source_lang}->{target_lang}: {len(dataset)} training pairs (of {len(train_pairs)}), {len(valid_pairs)} validation; "
        f"vocabulary {len(pipeline.source_vocab)} / {len(pipeline.target_vocab)}{describe_subwords(config.data.tokenizer)}",
        *describe_gold(dataset.gold, "training pairs"),
        describe_parameters(model),
    ]
    objective = Seq2SeqObjective.from_config(config.train, pipeline.target_vocab.pad_index)
    collate = partial(collate_pairs, gold=dataset.gold)
    return TaskSetup(
        config, model, objective, dataset, collate, validate, pipeline.vocabularies, frozen_encoder_groups(model, config),
        subword_models=pipeline.subword_models, validation_examples=len(valid_pairs), notes=notes,
        draw_attention=translation_attention_drawer(pipeline, config, valid_pairs[0][0]) if valid_pairs else None,
    )  # fmt: skip


def frozen_encoder_groups(model: EncoderDecoder, config: ExperimentConfig) -> list[dict] | None:
    """Adam's groups for a translator started from a pre-trained encoder: the encoder's, held still for its first
    ``text_encoder.frozen_steps`` (its rate 0: :class:`attnkit.optim.LearningRateSchedule`), and the rest; None (one
    group) otherwise. Two groups even without frozen steps, so that a resumed run may change their number."""
    if not config.text_encoder.init_from:
        return None
    encoder = list(model.encoder_for("text").parameters())
    held = {id(p) for p in encoder}
    return [{"params": encoder, "frozen_steps": config.text_encoder.frozen_steps}, {"params": [p for p in model.parameters() if id(p) not in held]}]


def train_translation(
    config: ExperimentConfig, resume: Checkpoint | None = None, overwrite: bool = False, progress_bar: bool = True, log=print
) -> TrainingProgress:
    """Train (or continue) a translation model as ``config`` says; checkpoints go to ``config.run_dir``."""
    return train_recipe(config, TASK, prepare_translation, resume, overwrite, progress_bar, log)

