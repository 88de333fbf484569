"""Masked-language-model pre-training of the Transformer text encoder (BERT, Devlin et al. 2019).

``task: pretrain`` trains the text encoder of a translation recipe, with an output head of its own, to
predict masked pieces of the *source side* of the recipe's training split: 15 % of the real, ordinary
pieces of each sentence are chosen; of those, 80 % are replaced by a mask piece, 10 % by a random
ordinary piece, 10 % are kept; the loss is the cross-entropy of the chosen pieces alone. Validation
masks the validation sources the same way with a fixed generator (the same pieces every epoch) and
reports masked-piece accuracy (the score) and perplexity.

The vocabularies are built exactly as the translation task builds them from the same ``data`` settings,
so a translator of the same recipe can start from the encoder (``text_encoder.init_from``). The mask
piece is the source vocabulary's ``<bos>``: a source sentence never holds one (sources are encoded
without specials), so its embedding row is free, and the vocabulary stays the translator's.

It runs through the one recipe path (:func:`attnkit.train.train_recipe`): the same run folder,
``--resume``, DDP and checkpoint rules as every other task.

Legend: B batch, S source length, M model size, V source vocabulary, N chosen pieces in a batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attnkit.analysis import HeadStatistics, is_punctuation
from attnkit.checkpoint import Checkpoint, load_checkpoint, load_weights
from attnkit.config import ExperimentConfig, from_dict
from attnkit.data.batching import Batch, pad_sequences
from attnkit.data.text import read_lines, read_parallel, resolve_languages
from attnkit.encoders.text import TransformerTextEncoder, build_text_encoder
from attnkit.errors import UserError
from attnkit.interfaces import PaddedTokens
from attnkit.losses import LossOutput
from attnkit.model import describe_parameters
from attnkit.text_pipeline import TextPipeline, describe_subwords
from attnkit.train import RunContext, TaskSetup, TrainingProgress, train_recipe, validation_subset
from attnkit.vocab import SPECIALS, Vocabulary

TASK = "pretrain"
MASK_ID = Vocabulary.bos_index  # the mask piece (module docstring: a source never holds <bos>)
FIRST_ORDINARY = len(SPECIALS)  # ids below it are specials: never chosen, never drawn as a random piece


@dataclass(frozen=True)
class Masking:
    """BERT's scheme: ``rate`` of the ordinary pieces chosen; of those, ``masked_share`` become the mask piece,
    ``random_share`` a random ordinary piece, and the rest stay as they are."""

    rate: float = 0.15
    masked_share: float = 0.8
    random_share: float = 0.1

    def __call__(self, source: PaddedTokens, vocab_size: int, generator: torch.Generator | None = None) -> tuple[PaddedTokens, Tensor]:
        """-> (the masked source, chosen (B, S) bool). Padding and special pieces are never chosen. With
        ``generator`` (on the ids' device) the draw is reproducible; without, it follows the global generator."""
        ids = source.ids  # (B, S)
        ordinary = ids >= FIRST_ORDINARY  # (B, S); padding (id 0) is special too
        draw = lambda: torch.rand(ids.shape, device=ids.device, generator=generator)  # noqa: E731
        chosen = ordinary & (draw() < self.rate)  # (B, S)
        action = draw()  # (B, S) one draw decides mask / random / keep
        to_mask = chosen & (action < self.masked_share)
        to_random = chosen & (action >= self.masked_share) & (action < self.masked_share + self.random_share)
        random_ids = torch.randint(FIRST_ORDINARY, vocab_size, ids.shape, device=ids.device, generator=generator)  # (B, S)
        masked = torch.where(to_mask, torch.full_like(ids, MASK_ID), torch.where(to_random, random_ids, ids))
        return PaddedTokens(masked, source.lengths, source.host_lengths), chosen


class MaskedLanguageModel(nn.Module):
    """The Transformer text encoder and BERT's output head: a dense layer, GELU, layer norm, then the
    encoder's own embedding matrix (tied) and a bias over the source vocabulary."""

    @classmethod
    def build(cls, config: ExperimentConfig, source_vocab: Vocabulary) -> "MaskedLanguageModel":
        """``config.text_encoder``'s encoder over ``source_vocab``, with the head."""
        encoder = build_text_encoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
        return cls(encoder, len(source_vocab))

    def __init__(self, encoder: TransformerTextEncoder, vocab_size: int):
        super().__init__()
        self.encoder = encoder
        size = encoder.output_size
        self.transform = nn.Sequential(nn.Linear(size, size), nn.GELU(), nn.LayerNorm(size))
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, source: PaddedTokens, positions: Tensor) -> Tensor:
        """Logits at ``positions`` (N,), indices into the source's B * S pieces in row-major order
        (:func:`chosen_positions`) -> (N, V)."""
        memory = self.encoder(source).memory  # (B, S, M)
        hidden = self.transform(memory.flatten(0, 1).index_select(0, positions))  # (N, M)
        return F.linear(hidden, self.encoder.embedding.weight, self.output_bias)  # (N, V)


def chosen_positions(chosen: Tensor) -> Tensor:
    """The chosen (B, S) pieces' indices into the B * S pieces, row-major (N,). Their number N is drawn, so finding
    them reads it back from the device: the one host synchronisation of a pre-training step (the model's head and
    the answers both take these indices, so it is made once)."""
    return chosen.flatten().nonzero().squeeze(1)


@dataclass(frozen=True)
class MaskedLanguageObjective:
    """``objective(model, batch)`` for the trainer: mask the batch's sources, predict the chosen pieces."""

    vocab_size: int
    masking: Masking = Masking()

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        masked, chosen = self.masking(batch.source, self.vocab_size)
        positions = chosen_positions(chosen)  # (N,)
        logits = model(masked, positions)  # (N, V): through the DDP wrapper when there is one
        answers = batch.source.ids.flatten().index_select(0, positions)  # (N,)
        nll_sum = F.cross_entropy(logits.float(), answers, reduction="sum")
        tokens = chosen.sum()
        examples = torch.full((), batch.source.ids.shape[0], device=answers.device)
        return LossOutput(nll_sum, tokens, nll_sum.new_zeros(()), examples, nll_sum.detach())


class SentenceDataset(torch.utils.data.Dataset):
    """Encoded source sentences (no specials); batches are bucketed by length."""

    def __init__(self, ids: Sequence[Sequence[int]]):
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[int, Sequence[int]]:
        return index, self.ids[index]

    @property
    def lengths(self) -> list[int]:
        return [len(sentence) for sentence in self.ids]


def collate_sentences(examples: Sequence[tuple[int, Sequence[int]]]) -> Batch:
    index, sentences = zip(*examples)
    return Batch(pad_sequences(sentences), None, torch.tensor(index))  # (B, S)


def source_batches(dataset: SentenceDataset, batch_size: int) -> Iterator[PaddedTokens]:
    """``dataset``'s sentences in order, ``batch_size`` at a time (evaluation: no bucketing, no shuffling)."""
    for start in range(0, len(dataset), batch_size):
        yield collate_sentences([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]).source


def encode_sources(pipeline: TextPipeline, sentences: Sequence[str], max_length: int) -> SentenceDataset:
    """The sentences as source ids; empty ones skipped, long ones cut to ``max_length`` pieces."""
    encoded = (pipeline.source_vocab.encode(pipeline.source_tokenizer.tokenize(sentence))[:max_length] for sentence in sentences)
    return SentenceDataset([ids for ids in encoded if ids])


MOSTLY_UNKNOWN = 0.5  # data.pretrain_text warns above this share of <unk>: text in another language, or another vocabulary


def more_text(pipeline: TextPipeline, path: str, max_length: int) -> tuple[SentenceDataset, int, list[str]]:
    """``data.pretrain_text``'s sentences as source ids (a blank line holds nothing to mask and is skipped), the
    number of lines read, and a warning where no line was used or where most of their words are unknown to the
    vocabulary (it is built from the training pairs: such words read as <unk>)."""
    lines = read_lines(path)
    dataset = encode_sources(pipeline, lines, max_length)
    if not dataset.ids:
        return dataset, len(lines), [f"warning: data.pretrain_text: no line of {path} holds a word; pre-training reads the training pairs alone"]
    pieces = [piece for sentence in dataset.ids for piece in sentence]
    unknown = sum(piece == Vocabulary.unk_index for piece in pieces) / len(pieces)
    if unknown <= MOSTLY_UNKNOWN:
        return dataset, len(lines), []
    return dataset, len(lines), [
        f"warning: data.pretrain_text: {unknown:.0%} of the words of {path} are not in the training pairs' vocabulary "
        f"(they read as <unk>, so little is learnt from them): is it {pipeline.source_lang} text?"
    ]


def masked_language_scores(model: MaskedLanguageModel, dataset: SentenceDataset, vocab_size: int, seed: int, batch_size: int = 128) -> dict[str, float]:
    """Masked-piece accuracy (%) and perplexity on ``dataset``, masked by a generator seeded with ``seed``
    (the same pieces every call)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    masking = Masking()
    correct = chosen_total = 0
    nll = 0.0
    for source in source_batches(dataset, batch_size):
        masked, chosen = masking(source, vocab_size, generator)  # drawn on the CPU: the same on any device
        positions = chosen_positions(chosen)  # (N,), found on the CPU
        logits = model(masked.to(device), positions.to(device)).float()  # (N, V)
        answers = source.ids.flatten()[positions].to(device)  # (N,)
        nll += F.cross_entropy(logits, answers, reduction="sum").item()
        correct += (logits.argmax(-1) == answers).sum().item()
        chosen_total += int(chosen.sum())
    if chosen_total == 0:
        raise UserError("the validation sentences are too few or too short to mask any piece")
    return {"accuracy": round(100.0 * correct / chosen_total, 2), "perplexity": round(math.exp(min(nll / chosen_total, 50.0)), 3)}


def prepare_pretraining(config: ExperimentConfig, resume: Checkpoint | None, context: RunContext) -> TaskSetup:
    """The pre-training task's data (the source side of the recipe's pairs), model and validation."""
    if config.text_encoder.family != "transformer":
        raise UserError("task pretrain trains a Transformer text encoder: set text_encoder.family: transformer")
    source_lang, target_lang = resolve_languages(config.data.path, config.data.source_lang, config.data.target_lang)
    config = replace(config, data=replace(config.data, source_lang=source_lang, target_lang=target_lang))
    train_pairs = read_parallel(config.data.path, "train", source_lang, target_lang)
    valid_pairs = validation_subset(read_parallel(config.data.path, "valid", source_lang, target_lang), config.train)
    # Built as the translation task builds it, so that a translator of the same data settings shares the vocabulary.
    pipeline = TextPipeline.from_checkpoint(resume) if resume is not None else TextPipeline.build(config, train_pairs, source_lang, target_lang)
    vocab_size = len(pipeline.source_vocab)
    longest = config.data.max_source_length  # within learned positions' reach: the config checks that
    from_pairs = encode_sources(pipeline, [source for source, _ in train_pairs], longest)
    extra = config.data.pretrain_text
    more, lines_read, warnings = more_text(pipeline, extra, longest) if extra else (SentenceDataset([]), 0, [])
    dataset = SentenceDataset([*from_pairs.ids, *more.ids])
    valid = encode_sources(pipeline, [source for source, _ in valid_pairs], longest)
    model = MaskedLanguageModel.build(config, pipeline.source_vocab)

    def validate(trained: nn.Module) -> dict:
        scores = masked_language_scores(trained, valid, vocab_size, seed=config.train.seed)
        return {**scores, "score": scores["accuracy"]}

    notes = [
        f"pretrain: masked pieces of {len(dataset)} {source_lang} sentences ({len(from_pairs)} from the training pairs"
        + (f", {len(more)} of the {lines_read} lines of {extra}" if extra else "") + f"), {len(valid)} validation; "
        f"vocabulary {vocab_size}{describe_subwords(config.data.tokenizer)}",
        *warnings,
        describe_parameters(model),
    ]
    return TaskSetup(
        config, model, MaskedLanguageObjective(vocab_size), dataset, collate_sentences, validate, pipeline.vocabularies,
        subword_models=pipeline.subword_models, validation_examples=len(valid), notes=notes,
    )  # fmt: skip


def pretrained_from_checkpoint(path: str | Path) -> tuple[MaskedLanguageModel, TextPipeline]:
    """A pre-training checkpoint's model (encoder and head, in eval mode) and its text pipeline."""
    checkpoint = load_checkpoint(path, task=TASK)
    config = from_dict(ExperimentConfig, checkpoint.config)
    pipeline = TextPipeline.from_checkpoint(checkpoint)
    model = MaskedLanguageModel.build(config, pipeline.source_vocab)
    load_weights(model, checkpoint)
    return model.eval(), pipeline


def encoder_head_statistics(encoder: TransformerTextEncoder, pipeline: TextPipeline, sentences: Sequence[str], batch_size: int = 64) -> dict:
    """What each self-attention head of ``encoder`` (a pre-trained one, or a translator's) looks at over
    ``sentences``: :class:`attnkit.analysis.HeadStatistics`' means, statistic -> layers -> heads."""
    vocab = pipeline.source_vocab
    punctuation_ids = torch.tensor([is_punctuation(piece) and i >= FIRST_ORDINARY for i, piece in enumerate(vocab.to_list())])  # (V,)
    dataset = encode_sources(pipeline, sentences, max_length=10**6)
    statistics = HeadStatistics()
    device = next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    with torch.no_grad():
        for source in source_batches(dataset, batch_size):
            maps = encoder.self_attention(source.to(device))  # one (B, h, S, S) per layer
            statistics.add(maps, source.lengths, punctuation_ids[source.ids])
    encoder.train(was_training)
    return statistics.means()


ENCODER_SHAPE = ("family", "hidden_size", "num_layers", "heads", "feedforward_size", "positions", "max_positions")  # what the weights' shapes follow


def start_from_pretrained(encoder: nn.Module, config: ExperimentConfig, source_vocab: Vocabulary) -> str:
    """Load ``text_encoder.init_from``'s encoder weights into ``encoder`` (a translator's, built from ``config``
    with ``source_vocab``) -> a line for the log. A folder, a missing file, a checkpoint of another task, an encoder of
    other sizes and a vocabulary that differs are each refused with the reason."""
    path = config.text_encoder.init_from
    option = f"config key text_encoder.init_from: {path}"
    if Path(path).is_dir():
        inside = Path(path) / "best.pt"
        hint = f"did you mean {inside}?" if inside.is_file() else "give a pre-training run's best.pt"
        raise UserError(f"{option} is a folder, not a checkpoint file ({hint})")
    if not Path(path).is_file():
        raise UserError(f"{option} does not exist (a pre-training run's best.pt: attnkit train --config a recipe with task: pretrain)")
    try:
        checkpoint = load_checkpoint(path, task=TASK)
    except UserError as error:
        raise UserError(f"config key text_encoder.init_from: {error}") from None
    pretrained = from_dict(ExperimentConfig, checkpoint.config).text_encoder
    differing = [f"{key} {getattr(pretrained, key)} there, {getattr(config.text_encoder, key)} here" for key in ENCODER_SHAPE if getattr(pretrained, key) != getattr(config.text_encoder, key)]
    if differing:
        raise UserError(f"{option} holds another encoder: text_encoder.{'; '.join(differing)}")
    theirs, ours = checkpoint.vocabularies["source"], source_vocab.to_list()
    if theirs != ours:
        first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
        at = lambda words: repr(words[first]) if first < len(words) else "nothing"  # noqa: E731
        raise UserError(
            f"{option} was pre-trained on another source vocabulary ({len(theirs)} pieces there, {len(ours)} here; "
            f"piece {first} is {at(theirs)} there and {at(ours)} here): pre-train with this recipe's data.path and data.tokenizer settings"
        )
    prefix = "encoder."
    weights = {name[len(prefix):]: tensor for name, tensor in checkpoint.model.items() if name.startswith(prefix)}
    try:
        encoder.load_state_dict(weights)
    except RuntimeError as error:
        raise UserError(f"{option}: its encoder weights do not fit ({str(error).splitlines()[0]}); the file is damaged or from another version") from None
    epoch = checkpoint.training.get("progress", {}).get("epoch", "?") if checkpoint.training else "?"
    frozen = config.text_encoder.frozen_steps
    return f"text encoder from {path} (pre-trained for {epoch} epochs)" + (f", held still for the first {frozen} steps" if frozen else "")


def train_pretraining(
    config: ExperimentConfig, resume: Checkpoint | None = None, overwrite: bool = False, progress_bar: bool = True, log=print
) -> TrainingProgress:
    """Pre-train (or continue pre-training) the Transformer text encoder as ``config`` says."""
    return train_recipe(config, TASK, prepare_pretraining, resume, overwrite, progress_bar, log)
