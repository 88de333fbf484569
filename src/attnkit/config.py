"""Experiment configuration: frozen dataclasses with commented defaults.

YAML lives only at the edge (``tasks/configs/*.yaml``); :func:`load_config`
reads it, applies dotted overrides (``--set decoder.hidden_size=512``) and
rejects unknown keys with the list of valid ones. The resolved config is stored
in every run folder and checkpoint and rebuilds the model.

Every value is checked when a config is built (from a dict or directly): its
type, and the rule declared with its field (``checked(default, rule)``), so a
bad value fails at once with its dotted key instead of deep in training.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from attnkit.errors import UserError
from attnkit.files import write_text_atomic

# The valid names of the choice fields that only configuration and data handling use. The names of what a
# model is built from (cells, decoder styles, attention scores, image backbones, ...) live beside the code
# that builds them, each listed once, and reach the rules below through `registered` (see there).
TASKS = ("translation", "captioning", "multitask", "pretrain")
SUBWORD_TOKENIZER = "sentencepiece"
TOKENIZERS = ("moses", "nltk", "space", SUBWORD_TOKENIZER)
SUBWORD_ALGORITHMS = ("unigram", "bpe")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DECODING_PRECISIONS = ("checkpoint", "fp32", "bf16")  # --precision of the commands that decode: the checkpoint's train.precision, or one of these
CAPTIONING_TASKS = ("captioning", "multitask")  # the tasks that caption photos: SCST and train.init_from serve them
OBJECTIVES = ("xe", "scst")  # train.objective: cross-entropy on the references | self-critical sequence training (attnkit.self_critical)
SCST_BASELINES = ("mean", "greedy")
MIN_IMAGE_SIZE = 32  # the ImageNet backbones reduce an image 32-fold: smaller ones give them no more than one cell

# Keys that older attnkit versions wrote (into checkpoints and run folders) and that no longer exist,
# with why; see drop_legacy_keys.
LEGACY_KEYS = {
    "search.n_best": "it was never read; give --n-best to attnkit translate or attnkit caption",
}


# -- value rules ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What a config value may be: ``test`` accepts it; ``text`` completes "must be ..."."""

    test: Callable[[Any], bool]
    text: str
    choices: Callable[[], Iterable[str]] | None = None  # a choice: the valid names, which the message lists

    def message(self, key: str, value: Any) -> str:
        if self.choices is not None:
            return f"config key {key}: unknown {self.text} {value!r}; choose one of {', '.join(self.choices())}"
        return f"config key {key} must be {self.text}, got {value!r}"


RULE = "rule"  # the metadata key of a field's rule


def checked(default: Any, rule: Rule) -> Any:
    """A field with a default and the rule its values must follow."""
    return field(default=default, metadata={RULE: rule})


def at_least(low: float) -> Rule:
    return Rule(lambda value: value >= low, f"at least {low}")


def above(low: float) -> Rule:
    return Rule(lambda value: value > low, f"greater than {low}")


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Rule:
    """``low <= value <= high``; an open end excludes its bound."""

    def test(value: float) -> bool:
        return (low < value if low_open else low <= value) and (value < high if high_open else value <= high)

    return Rule(test, f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")


PROBABILITY = between(0, 1)
BELOW_ONE = between(0, 1, high_open=True)  # dropout, label smoothing: 1 would drop (or smooth away) everything


def one_of(*choices: str, what: str) -> Rule:
    return Rule(lambda value: value in choices, what, lambda: choices)


def registered(module: str, name: str, what: str) -> Rule:
    """A choice among the names that ``module``'s ``name`` (a tuple, or a dict keyed by name) lists.

    The list lives beside the code that implements its entries (adding a score, a style or a backbone
    is one edit there) and is read when a value is checked, not when this module is imported: those
    modules import this one, and importing them here would be a cycle (and load torch for a config).
    """

    def names() -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(module), name))

    return Rule(lambda value: value in names(), what, names)


def matching(pattern: str, text: str) -> Rule:
    return Rule(lambda value: re.fullmatch(pattern, value) is not None, text)


NOT_EMPTY = Rule(bool, "a non-empty string")


# -- the config ----------------------------------------------------------------------------------------
class _Checked:
    """Base of the config sections: check every value when one is built (``from_dict``, directly, ``replace``)."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass(frozen=True)
class TokenizerConfig(_Checked):
    kind: str = checked("moses", one_of(*TOKENIZERS, what="tokenizer kind"))  # moses (sacremoses) | nltk (NLTKWordTokenizer) | space (split on whitespace) | sentencepiece (subwords; translation only)
    lowercase: bool = True  # lower-case before tokenising (and score BLEU lower-cased)
    # kind sentencepiece: a subword model per side, trained on the training split when training starts and
    # saved inside the checkpoint; its pieces are the vocabulary (min_freq and max_vocab do not apply)
    algorithm: str = checked("unigram", one_of(*SUBWORD_ALGORITHMS, what="subword algorithm"))  # unigram (Kudo 2018) | bpe
    vocab_size: int = checked(1000, at_least(8))  # pieces per subword model, the 4 specials included (1000 fits the embedded Tatoeba corpus; real corpora: 8000 and up)
    joint: bool = False  # one subword model trained on source and target text together (its pieces serve both sides)


@dataclass(frozen=True)
class DataConfig(_Checked):
    path: str = checked("data/tatoeba-fr-en", NOT_EMPTY)  # prepared dataset folder (see data_scripts/); relative to the project root
    source_lang: str = ""  # empty: the first language in the folder's dataset.json
    target_lang: str = ""  # empty: the second language in dataset.json
    min_freq: int = checked(1, at_least(1))  # words seen fewer times in training map to <unk>
    max_vocab: int = checked(0, at_least(0))  # keep at most this many words per side (0: no cap)
    max_source_length: int = checked(50, at_least(1))  # longer training pairs are skipped; longer inputs are truncated at translation
    max_target_length: int = checked(50, at_least(1))  # longer training pairs are skipped
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    feature_cache: str = "cache/features"  # captioning: the frozen image-encoder blocks' output cached here ("" : off)
    mosaic_share: float = checked(0.0, PROBABILITY)  # captioning: this share of the training photos is also seen in a 2 x 2 mosaic of training photos (seeded), with its own captions
    text_path: str = ""  # task multitask: the parallel-text dataset (data.path is then the captioning dataset)
    pretrain_text: str = ""  # task pretrain: a text file of more source-language sentences, one per line, pre-trained on besides the training split's source side (in its vocabulary)


@dataclass(frozen=True)
class TextEncoderConfig(_Checked):
    embedding_size: int = checked(256, at_least(1))
    hidden_size: int = checked(256, at_least(1))  # per direction; memory size D is 2x this when bidirectional
    num_layers: int = checked(1, at_least(1))
    rnn: str = checked("gru", registered("attnkit.encoders.text", "RNNS", what="text encoder RNN"))  # gru | lstm | none (memory = embedding + position code: each position holds only its word)
    bidirectional: bool = True
    dropout: float = checked(0.1, BELOW_ONE)  # on embeddings and between layers
    family: str = checked("rnn", registered("attnkit.encoders.text", "FAMILIES", what="text encoder family"))  # rnn: the rnn above | transformer: num_layers self-attention layers of hidden_size
    heads: int = checked(8, at_least(1))  # transformer: attention heads (must divide hidden_size)
    feedforward_size: int = checked(2048, at_least(1))  # transformer: the feed-forward layer's inner size
    positions: str = checked("sinusoidal", registered("attnkit.encoders.text", "POSITIONS", what="position code"))  # transformer: sinusoidal | learned (max_positions of them)
    max_positions: int = checked(256, at_least(1))  # transformer with learned positions: the longest source it can read
    init_from: str = ""  # task translation: a pretrain checkpoint (task: pretrain) whose encoder weights this encoder starts from; same data and tokenizer settings, same sizes
    frozen_steps: int = checked(0, at_least(0))  # with init_from: the loaded encoder stays as it is for this many optimizer steps (its learning rate 0), then trains

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.family != "transformer":
            return
        if not self.bidirectional:
            raise UserError("config key text_encoder.bidirectional: a transformer encoder's self-attention reads both sides; bidirectional belongs to the rnn family")
        if self.hidden_size % self.heads:
            raise UserError(f"config key text_encoder.heads: {self.heads} heads do not divide text_encoder.hidden_size {self.hidden_size} (the model size)")
        if self.embedding_size != self.hidden_size:
            raise UserError(f"config key text_encoder.embedding_size: a transformer encoder's embeddings have the model size (text_encoder.hidden_size {self.hidden_size}), got {self.embedding_size}")


@dataclass(frozen=True)
class ImageEncoderConfig(_Checked):
    backbone: str = checked("efficientnet_lite0", registered("attnkit.encoders.image", "BACKBONES", what="image backbone"))  # resnet18|34|50|101, mobilenet_v3_small|large, efficientnet_b0, efficientnet_lite0|1|2 (native sizes 224, 240, 260 px), local_cnn (small, from scratch)
    weights: str = checked("default", NOT_EMPTY)  # default: packaged ImageNet weights (efficientnet_lite0|1|2), random for others | none | PATH (torchvision state_dict)
    weights_sha256: str = checked("", matching(r"|none|[0-9a-f]{64}", "empty, none or a SHA-256 hex digest"))  # set by training: the digest of the weights file, so a checkpoint needs neither the file nor the package
    image_size: int = checked(224, at_least(MIN_IMAGE_SIZE))  # images are resized to image_size x image_size
    blocks: int = checked(0, at_least(0))  # keep only the backbone's first N blocks (0: all): an earlier cut gives finer, more local cells
    grid_size: int = checked(7, at_least(0))  # average-pool the feature map to grid_size x grid_size cells (0: keep the backbone's)
    memory_size: int = checked(512, at_least(0))  # project each cell to this size (0: keep the backbone's channels)
    trainable_blocks: int = checked(0, at_least(0))  # fine-tune the last N backbone blocks (0: frozen); the frozen blocks' output is cached either way
    backbone_lr: float = checked(0.0, at_least(0))  # learning rate of the fine-tuned blocks (0: train.lr)
    dropout: float = checked(0.0, BELOW_ONE)  # on the projected cells
    position_embedding: bool = False  # add a learned embedding of each cell's position to its memory vector (needs grid_size)
    self_attention_layers: int = checked(0, at_least(0))  # Transformer encoder layers over the projected cells (with a 2-D position code), so each cell's memory can read the others (0: none)
    heads: int = checked(8, at_least(1))  # self-attention heads (must divide memory_size)
    feedforward_size: int = checked(2048, at_least(1))  # the self-attention layers' feed-forward inner size

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.self_attention_layers and self.memory_size == 0:
            raise UserError("config key image_encoder.self_attention_layers: self-attention needs a projected memory (set image_encoder.memory_size)")
        if self.self_attention_layers and self.memory_size % self.heads:
            raise UserError(f"config key image_encoder.heads: {self.heads} heads do not divide image_encoder.memory_size {self.memory_size}")


@dataclass(frozen=True)
class DecoderConfig(_Checked):
    family: str = checked("rnn", registered("attnkit.decoders", "FAMILIES", what="decoder family"))  # rnn: an RNN with one attention | transformer: self-attention + multi-head cross-attention layers
    embedding_size: int = checked(256, at_least(1))  # transformer: must equal hidden_size (the model size)
    hidden_size: int = checked(512, at_least(1))  # rnn: the RNN's state | transformer: the model size
    num_layers: int = checked(1, at_least(1))
    rnn: str = checked("gru", registered("attnkit.cells", "CELLS", what="decoder RNN"))  # gru | lstm
    style: str = checked("luong", registered("attnkit.decoders.rnn", "STYLES", what="decoder style"))  # luong: RNN then attend with the new state | bahdanau: attend with the previous state, context into the RNN
    score: str = checked("general", registered("attnkit.attention", "SCORE_FUNCTIONS", what="attention score"))  # dot | general | concat | additive | scaled_dot | none (no attention: the context is the memory's mean)
    attention_size: int = checked(256, at_least(1))  # hidden size inside concat / additive scores
    normaliser: str = checked("softmax", registered("attnkit.attention", "NORMALISERS", what="attention normaliser"))  # softmax | sparsemax | entmax15 (exact zeros far below the best score); transformer: its cross-attention
    input_feeding: bool = False  # luong: feed the previous attentional vector into the RNN
    context_gate: bool = False  # bahdanau: Show-Attend-Tell gate beta = sigmoid(W s) on the context
    readout_size: int = checked(0, at_least(0))  # size of the vector before the output layer (0: hidden_size; tied embeddings force embedding_size)
    dropout: float = checked(0.1, BELOW_ONE)  # on embeddings, between layers and before the output layer
    tie_embeddings: bool = False  # output layer shares the target embedding matrix
    init: str = checked("bridge", registered("attnkit.decoders.rnn", "INITS", what="decoder init"))  # bridge: tanh(W init_state) | zeros
    heads: int = checked(8, at_least(1))  # transformer: attention heads (must divide hidden_size)
    feedforward_size: int = checked(2048, at_least(1))  # transformer: the position-wise feed-forward layer's inner size
    attention_layer: int = checked(-1, at_least(-1))  # transformer: the layer whose heads' mean is "the" attention (plots, statistics, losses); -1: the last
    attention_head: int = checked(-1, at_least(-1))  # transformer: one head of that layer instead of their mean (-1: the mean of all heads)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.input_feeding and self.style != "luong":
            raise UserError("config key decoder.input_feeding applies to the luong style only (bahdanau already feeds the context)")
        if self.context_gate and self.style != "bahdanau":
            raise UserError("config key decoder.context_gate (Show-Attend-Tell beta) applies to the bahdanau style only")
        if self.score == "none" and self.normaliser != "softmax":  # attention.NO_ATTENTION: no scores, nothing to normalise
            raise UserError(
                f"config key decoder.normaliser: {self.normaliser} normalises attention scores, and decoder.score=none has none "
                "(the context is the memory's mean); leave decoder.normaliser at softmax or choose a score"
            )
        if self.family == "transformer":
            self._check_transformer()

    def _check_transformer(self) -> None:
        """Sizes a Transformer needs, and the RNN-only options it has no use for (refused rather than ignored)."""
        for key, given, rnn_only in (
            ("style", self.style == "bahdanau", "the bahdanau style"),
            ("input_feeding", self.input_feeding, "input feeding"),
            ("context_gate", self.context_gate, "the Show-Attend-Tell gate"),
            ("score", self.score not in ("general", "scaled_dot"), f"the '{self.score}' score (its cross-attention is multi-head scaled dot product)"),
        ):
            if given:
                raise UserError(f"config key decoder.{key}: {rnn_only} belongs to the rnn decoder family, not to decoder.family=transformer")
        if self.hidden_size % self.heads:
            raise UserError(f"config key decoder.heads: {self.heads} heads do not divide decoder.hidden_size {self.hidden_size} (the model size)")
        if self.embedding_size != self.hidden_size:
            raise UserError(f"config key decoder.embedding_size: a transformer decoder's embeddings have the model size (decoder.hidden_size {self.hidden_size}), got {self.embedding_size}")
        if self.attention_layer >= self.num_layers:
            raise UserError(f"config key decoder.attention_layer: layer {self.attention_layer} does not exist (decoder.num_layers is {self.num_layers}; -1 is the last)")
        if self.attention_head >= self.heads:
            raise UserError(f"config key decoder.attention_head: head {self.attention_head} does not exist (decoder.heads is {self.heads}; -1 is their mean)")


@dataclass(frozen=True)
class TrainConfig(_Checked):
    batch_size: int = checked(64, at_least(1))  # sentences per batch (batches are bucketed by length)
    batch_tokens: int = checked(0, at_least(0))  # cut batches by size instead: as many examples as fit in this many target tokens, padding and <bos>/<eos> included (CUDA's padding to multiples of 8 is not), per process (wins over batch_size; 0: off; attnkit.data.batching.BatchLimit)
    epochs: int = checked(20, at_least(1))
    lr: float = checked(1e-3, above(0))  # Adam
    weight_decay: float = checked(0.0, at_least(0))
    clip_norm: float = checked(1.0, at_least(0))  # gradient norm clipping (0: off)
    label_smoothing: float = checked(0.0, BELOW_ONE)
    attention_regularization: float = checked(0.0, at_least(0))  # Xu et al.'s lambda: a caption's loss is -log p(y|x) + lambda * sum_l (1 - sum_t alpha_tl)^2, a batch's the sum of its captions' over its target tokens (attnkit.losses)
    attention_supervision: float = checked(0.0, at_least(0))  # weight of KL(gold || attention) per word with gold positions (scene data only; 0: off)
    importance_distillation: float = checked(0.0, at_least(0))  # weight of KL(importance || attention) per distilled caption: attention pulled towards what each word rests on (attnkit.distillation; task captioning; 0: off)
    distillation_share: float = checked(0.1, between(0, 1, low_open=True))  # share of each batch's captions distilled (each runs every step again once per window of cells)
    teacher_forcing: float = checked(1.0, PROBABILITY)  # probability of feeding the gold previous word (below 1: scheduled sampling)
    warmup_steps: int = checked(0, at_least(0))  # the learning rate climbs linearly to lr over this many optimizer steps (attnkit.optim; 0: none)
    lr_patience: int = checked(1, at_least(0))  # validations without improvement let pass; the next one without it multiplies the LR by lr_factor
    lr_factor: float = checked(0.5, between(0, 1, low_open=True, high_open=True))
    min_lr: float = checked(1e-5, at_least(0))
    decay_epochs: int = checked(0, at_least(0))  # the last N of train.epochs (all of them when N is more): the rate falls linearly, step by step, from the rate reached to 0 at the end of the last epoch, and plateaus no longer change it (warm-up, stable, decay; attnkit.optim; 0: off)
    patience: int = checked(5, at_least(0))  # early stopping: validations without improvement before training stops (0: never)
    max_minutes: float = checked(0.0, at_least(0))  # time budget of training and validation (checkpoint writes not counted): no epoch starts that would, at the last epoch's pace, end past it (0: none)
    ema_decay: float = checked(0.0, BELOW_ONE)  # validate and save an exponential moving average of the weights over the optimizer steps with this decay, e.g. 0.999 (attnkit.optim.WeightAverage; 0: the weights themselves)
    keep_epochs: int = checked(0, at_least(0))  # also keep the weights after each of the last N epochs (epoch-<k>.pt), for attnkit average (0: none)
    valid_beam_size: int = checked(1, at_least(1))  # beam used by validation decoding (1: greedy; at most the tokens the model can output)
    valid_max_examples: int = checked(0, at_least(0))  # decode at most this many validation examples (0: all)
    device: str = checked("auto", matching(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N"))  # auto (cuda when present) | cpu | cuda | cuda:N
    precision: str = checked("auto", one_of(*PRECISIONS, what="precision"))  # auto (fp32 everywhere, TF32 products on CUDA: docs/scaling.md) | fp32 | bf16 (on an x86 CPU without bf16 instructions far slower: the run warns) | fp16
    compile: bool = False  # torch.compile, with dynamic shapes, each part a step runs many times (Transformer layers, the RNN decoder's attention and cell step; attnkit.train.compile_layers): fewer kernel launches on a GPU, each new shape compiled first (docs/scaling.md)
    num_workers: int = checked(0, at_least(0))  # data loader workers (0: none on a CPU; on CUDA this process's share of the cores less one, at most 8)
    threads: int = checked(0, at_least(0))  # torch CPU threads (0: the cores this process may use, shared among the ranks of a torchrun job on this machine)
    seed: int = checked(1, between(0, 2**32 - 1))  # the range every seeded generator (torch, numpy, random) accepts
    log_every: int = checked(50, at_least(1))  # progress-bar refresh of the running loss, in batches
    tensorboard: bool = False  # also write TensorBoard scalars and, at every validation, one fixed validation example's attention to <run>/tensorboard (pip install 'attnkit[tensorboard]')
    caption_share: float = checked(0.5, PROBABILITY)  # task multitask: share of the batches that are captioning batches (the rest translate)
    init_from: str = ""  # task captioning or multitask: a checkpoint of the same task whose weights (and vocabularies) this new run starts from, e.g. the cross-entropy run before SCST; same model keys
    objective: str = checked("xe", one_of(*OBJECTIVES, what="objective"))  # xe: cross-entropy on the reference captions | scst: self-critical sequence training, CIDEr-D of sampled captions (task captioning; task multitask: its caption batches, translation stays xe; attnkit.self_critical)
    scst_samples: int = checked(5, at_least(1))  # objective scst: captions sampled per photo each step
    scst_baseline: str = checked("mean", one_of(*SCST_BASELINES, what="SCST baseline"))  # objective scst: a sample's reward is compared with the mean of the photo's other samples (Luo 2020) | the greedy caption's (Rennie et al. 2017)


def widened_beam(beam_size: int | None, default: int, n_best: int) -> int:
    """The beam a search for ``n_best`` outputs runs: ``beam_size`` when given, else ``default`` (a checkpoint's
    ``search.beam_size``) widened to ``n_best``, since a beam of K keeps at most K outputs (the commands' ``--n-best``
    and the library's ``n_best`` alike)."""
    return beam_size or max(default, n_best)


@dataclass(frozen=True)
class SearchConfig(_Checked):
    beam_size: int = checked(5, at_least(1))  # 1: greedy; at most the tokens the model can output
    length_penalty: float = checked(1.0, at_least(0))  # GNMT alpha: score / ((5 + len) / 6) ** alpha (0: raw log-probability)
    max_length_ratio: float = checked(2.0, at_least(0))  # stop after max_length_ratio * source length + max_length_offset steps
    max_length_offset: int = checked(10, at_least(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_length_ratio + self.max_length_offset < 1:  # a one-word source (or one cell) would get no word
            raise UserError(
                f"config keys search.max_length_ratio and search.max_length_offset: {self.max_length_ratio:g} x source length + "
                f"{self.max_length_offset} allows no word for a one-word source; raise either"
            )


@dataclass(frozen=True)
class ExperimentConfig(_Checked):
    name: str = checked("experiment", NOT_EMPTY)
    task: str = checked("translation", one_of(*TASKS, what="task"))  # translation | captioning | multitask (one decoder, an image and a text encoder) | pretrain (masked-LM pre-training of a Transformer text encoder)
    output_dir: str = ""  # empty: runs/<name>
    data: DataConfig = field(default_factory=DataConfig)
    text_encoder: TextEncoderConfig = field(default_factory=TextEncoderConfig)  # task translation
    image_encoder: ImageEncoderConfig = field(default_factory=ImageEncoderConfig)  # task captioning
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    search: SearchConfig = field(default_factory=SearchConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task == "captioning" and self.data.tokenizer.kind == SUBWORD_TOKENIZER:
            raise UserError("data.tokenizer.kind: sentencepiece serves translation (and the joint model); a captioning model reads words: use moses, nltk or space")
        text = self.text_encoder
        if text.family == "transformer" and text.positions == "learned" and text.max_positions < self.data.max_source_length:
            raise UserError(
                f"config key text_encoder.max_positions: {text.max_positions} learned positions cannot read sources of "
                f"data.max_source_length {self.data.max_source_length}; raise it or use positions: sinusoidal"
            )
        if self.data.mosaic_share > 0 and self.task == "translation":
            raise UserError("config key data.mosaic_share: mosaics are made of training photos (task captioning or multitask); task translation has none")
        if self.data.mosaic_share > 0 and self.train.attention_supervision > 0:
            raise UserError("config key data.mosaic_share cannot go with train.attention_supervision: the gold cells are those of one photo's grid, not a mosaic's")
        if self.train.importance_distillation > 0 and self.task != "captioning":
            raise UserError(f"config key train.importance_distillation: it distils importance over a photo's grid into a captioner's attention (task captioning), not task {self.task}")
        if self.data.pretrain_text and self.task != "pretrain":
            raise UserError(f"config key data.pretrain_text: more text to pre-train on belongs to task pretrain, not task {self.task}")
        if text.init_from and self.task != "translation":
            raise UserError(f"config key text_encoder.init_from: a pre-trained encoder starts a translator (task translation), not task {self.task}")
        if text.frozen_steps and not text.init_from:
            raise UserError("config key text_encoder.frozen_steps: it holds a pre-trained encoder still; set text_encoder.init_from too")
        if self.decoder.family == "transformer" and self.train.teacher_forcing < 1:
            raise UserError("config key train.teacher_forcing: scheduled sampling belongs to the rnn decoder family (a transformer decoder trains on the gold prefix in parallel)")
        if self.train.init_from and self.task not in CAPTIONING_TASKS:
            raise UserError(f"config key train.init_from: a run started from another run's weights is built for SCST after cross-entropy (task captioning or multitask), not task {self.task}")
        self._check_self_critical()

    def _check_self_critical(self) -> None:
        """``train.objective: scst`` rewards sampled captions with CIDEr-D against each photo's references: what it
        cannot go with is refused here, before any data is read."""
        train = self.train
        if train.objective != "scst":
            return
        if self.task not in CAPTIONING_TASKS:
            raise UserError(f"config key train.objective: scst rewards captions with CIDEr-D against a photo's references (task captioning or multitask), not task {self.task}; use xe")
        if self.task == "multitask" and train.caption_share == 0:
            raise UserError("config key train.caption_share: 0 leaves the joint model no caption batch for train.objective=scst to train; raise it, or use xe")
        if train.scst_baseline == "mean" and train.scst_samples < 2:
            raise UserError("config key train.scst_samples: the mean baseline compares each sample with the photo's other samples; sample at least 2, or use train.scst_baseline=greedy")
        # A joint model's translation batches still train on cross-entropy, label smoothing included.
        for key, value, why in (
            ("train.label_smoothing", train.label_smoothing if self.task == "captioning" else 0.0, "smooths the cross-entropy targets"),
            ("train.attention_supervision", train.attention_supervision, "is a loss on the reference captions' words"),
            ("train.importance_distillation", train.importance_distillation, "is a loss on the reference captions' words"),
            ("data.mosaic_share", self.data.mosaic_share, "adds mosaics whose references are one quadrant's"),
            ("train.batch_tokens", train.batch_tokens, "cuts batches by the reference captions' lengths"),
        ):
            if value > 0:
                raise UserError(f"config key {key}: it {why}, which train.objective=scst does not train on; set it to 0 for the SCST run")
        if train.teacher_forcing < 1:
            raise UserError("config key train.teacher_forcing: scheduled sampling mixes in the reference words, which train.objective=scst does not read; set it to 1")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


# -- checking --------------------------------------------------------------------------------------------
@cache
def _sections() -> dict[type, str]:
    """Each section's dotted name in an ExperimentConfig ("" for the top level), for error messages."""
    names: dict[type, str] = {}

    def walk(cls: type, prefix: str) -> None:
        names[cls] = prefix
        for name, kind in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(kind):
                walk(kind, f"{prefix}{name}.")

    walk(ExperimentConfig, "")
    return names


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _has_type(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_values(config: Any) -> None:
    """Raise a :class:`UserError` naming the first value of ``config`` (one section) that is not valid."""
    cls = type(config)
    prefix, hints = _sections().get(cls, ""), _hints(cls)
    for item in dataclasses.fields(config):
        key, kind, value = prefix + item.name, hints[item.name], getattr(config, item.name)
        if not _has_type(kind, value):
            expected = "a mapping" if dataclasses.is_dataclass(kind) else kind.__name__
            raise UserError(f"config key {key} must be {expected}, got {value!r}")
        if kind is str and "\0" in value:  # no file name, language or setting holds one; the OS refuses it in a path
            raise UserError(f"config key {key} holds a NUL character (\\0), which no name or path can: {value!r}")
        if kind is float and not math.isfinite(value):
            raise UserError(f"config key {key} must be a finite number, got {value!r}")
        rule: Rule | None = item.metadata.get(RULE)
        if rule is not None and not rule.test(value):
            raise UserError(rule.message(key, value))
        if kind is int and abs(value) >= 2**53:  # no count or size is that large: torch cannot even make a tensor of it
            raise UserError(f"config key {key} is too large: {_short_number(value)}")


# -- what a model is ------------------------------------------------------------------------------------
# The keys (or whole sections) that build a trained model's network and its vocabularies. A checkpoint resumed,
# or averaged with others, must agree on them; the rest (where the data lies, how long and how fast training goes,
# on which device, how outputs are decoded) may differ.
MODEL_KEYS = ("task", "data.source_lang", "data.target_lang", "data.min_freq", "data.max_vocab", "data.tokenizer", "text_encoder", "image_encoder", "decoder")
# Within them, not these: regularisation while training, the backbone's learning rate, where the pretrained weights
# were read (weights_sha256 says which they were), which attention the analysis reads (chosen after training), and
# how long a pre-trained encoder is held still (init_from itself is: it sets the optimizer's parameter groups).
NOT_MODEL_KEYS = (
    "text_encoder.dropout", "image_encoder.dropout", "decoder.dropout", "image_encoder.backbone_lr", "image_encoder.weights",
    "decoder.attention_layer", "decoder.attention_head", "text_encoder.frozen_steps",
)  # fmt: skip
RESOLVED_KEYS = ("data.source_lang", "data.target_lang", "image_encoder.weights_sha256")  # training fills them in when empty


def defines_model(key: str) -> bool:
    """Is dotted ``key`` part of what a trained model is (:data:`MODEL_KEYS`)?"""
    return key not in NOT_MODEL_KEYS and any(_within(key, part) for part in MODEL_KEYS)


def _within(key: str, part: str) -> bool:
    """Is dotted ``key`` the key or section ``part``, or one of that section's keys?"""
    return key == part or key.startswith(part + ".")


def model_differences(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[str]:
    """The keys that define a model on which two configs (plain dicts, :func:`to_dict`) differ, each as
    ``key first vs second``; a key that training fills in counts only where both configs give it, and one that
    neither config's model reads (:func:`unread_keys`: ``decoder.rnn`` of two Transformers) not at all."""
    one, other = _flat(first), _flat(second)
    unread = _unread_in(first).keys() & _unread_in(second).keys()
    return [
        f"{key} {one.get(key)!r} vs {other.get(key)!r}"
        for key in dict.fromkeys([*one, *other])
        if defines_model(key)
        and one.get(key) != other.get(key)
        and not (key in RESOLVED_KEYS and "" in (one.get(key), other.get(key)))
        and not any(_within(key, part) for part in unread)
    ]


def _unread_in(values: Mapping[str, Any]) -> dict[str, str]:
    """:func:`unread_keys` of a stored config dict; none where this version cannot build it (every key then counts)."""
    try:
        return unread_keys(from_dict(ExperimentConfig, drop_legacy_keys(values)))
    except UserError:
        return {}


def unread_keys(config: ExperimentConfig) -> dict[str, str]:
    """The model sections and keys that the model ``config`` builds never reads, each with why, e.g.
    ``{"decoder.rnn": "the transformer decoder family has no RNN cell"}``: every section holds every key, so a
    Transformer's saved config.yaml still says ``rnn: gru``, which :func:`save_config` marks as not read.

    Only what builds and runs the network is listed (tests/test_config.py changes each key listed here and builds
    the very same model); settings the config refuses to change for a family (a Transformer's ``decoder.style``)
    are left unmarked."""
    unread = {section: f"task {config.task} has no {what}" for section, what in _ABSENT_PARTS.get(config.task, ())}
    text, image, decoder = config.text_encoder, config.image_encoder, config.decoder
    if "text_encoder" not in unread:
        if text.family == "transformer":
            unread["text_encoder.rnn"] = "the transformer text encoder family has no RNN"
            if text.positions != "learned":
                unread["text_encoder.max_positions"] = "sinusoidal positions read sources of any length"
        else:
            for key in ("heads", "feedforward_size", "positions", "max_positions"):
                unread[f"text_encoder.{key}"] = "the transformer family's; text_encoder.family is rnn"
            if text.rnn == "none":
                for key in ("hidden_size", "num_layers", "bidirectional"):
                    unread[f"text_encoder.{key}"] = "text_encoder.rnn is none: the memory is the embeddings with their positions"
    if "image_encoder" not in unread and image.self_attention_layers == 0:
        for key in ("heads", "feedforward_size"):
            unread[f"image_encoder.{key}"] = "the self-attention layers'; image_encoder.self_attention_layers is 0"
    if "decoder" not in unread:
        if decoder.family == "transformer":
            unread["decoder.rnn"] = "the transformer decoder family has no RNN cell"
            unread["decoder.score"] = "the transformer decoder's cross-attention is multi-head scaled dot product"
            for key in ("attention_size", "readout_size", "init"):
                unread[f"decoder.{key}"] = "the rnn decoder family's; decoder.family is transformer"
        else:
            for key in ("heads", "feedforward_size", "attention_layer", "attention_head"):
                unread[f"decoder.{key}"] = "the transformer decoder family's; decoder.family is rnn (one attention)"
            if decoder.score not in importlib.import_module("attnkit.attention").SIZED_SCORES:
                unread["decoder.attention_size"] = f"the '{decoder.score}' score has no hidden layer"
            if decoder.tie_embeddings:
                unread["decoder.readout_size"] = "tied embeddings make the readout decoder.embedding_size"
    return unread


def unread_given(config: ExperimentConfig, keys: Iterable[str]) -> dict[str, str]:
    """Those of the dotted ``keys`` (what a recipe or ``--set`` gave) that ``config``'s model never reads, with why."""
    unread = unread_keys(config)
    return {key: why for key in keys for part, why in unread.items() if _within(key, part)}


def recipe_keys(recipe: Mapping[str, Any]) -> list[str]:
    """The dotted keys a recipe sets (its settings as :func:`read_recipe` gives them)."""
    return list(_flat(recipe))


# The model sections a task builds nothing from, for unread_keys.
_ABSENT_PARTS = {
    "translation": (("image_encoder", "image encoder"),),
    "captioning": (("text_encoder", "text encoder"),),
    "pretrain": (("image_encoder", "image encoder"), ("decoder", "decoder (masked-LM pre-training trains the text encoder alone)")),
}


def _flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{dotted key: value}``."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


# -- dicts and YAML --------------------------------------------------------------------------------------
def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict (str, int, float, bool only): YAML-, JSON- and ``weights_only``-safe."""
    return dataclasses.asdict(config)


def from_dict(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``values``; unknown keys, wrong types and invalid values are :class:`UserError`."""
    if not isinstance(values, Mapping):
        raise UserError(f"config section '{where or 'top level'}' must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    prefix = f"{where}." if where else ""
    unknown = sorted(_shown(k) for k in values if k not in fields)
    if unknown:
        legacy = [f"{prefix}{k} was removed: {LEGACY_KEYS[prefix + k]}" for k in unknown if prefix + k in LEGACY_KEYS]
        raise UserError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(prefix + k for k in unknown)}; "
            f"valid keys{' in ' + where if where else ''}: {', '.join(fields)}" + "".join(f" ({note})" for note in legacy)
        )
    kwargs = {}
    for name, value in values.items():
        kwargs[name] = _coerce(hints[name], value, prefix + name)
    return cls(**kwargs)


def _shown(key: Any) -> str:
    """A key as a message shows it: YAML keys may be numbers or null, a damaged file's may hold control bytes."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def drop_legacy_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a stored config dict (a checkpoint's) without the keys older versions wrote and this one dropped."""
    values = dict(values)
    for dotted in LEGACY_KEYS:
        *sections, key = dotted.split(".")
        node = values
        for section in sections:  # copy the sections on the way down: the caller's dict stays as it was
            if not isinstance(node.get(section), Mapping):
                break
            copied = dict(node[section])
            node[section] = copied
            node = copied
        else:
            node.pop(key, None)
    return values


def _coerce(kind: type, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return from_dict(kind, value, key)
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer past float's range
                raise UserError(f"config key {key} is too large: {_short_number(value)}") from None
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no decimal point) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - every field above is one of these
        raise TypeError(f"unsupported config field type {kind} for {key}")
    raise UserError(f"config key {key} must be {kind.__name__}, got {value!r}")


class _ConfigLoader(yaml.SafeLoader):
    """YAML as configs need it: PyYAML's safe loader with YAML 1.2's plain scalars instead of 1.1's, and no key
    given twice in one mapping.

    YAML 1.1 reads ``010`` as octal 8, ``1:04`` as 64 (base 60), ``no``/``yes``/``on``/``off`` as booleans (so
    ``data.source_lang: no``, Norwegian, was False) and dates as dates; here those are decimal integers and text,
    as YAML 1.2's core schema and most other readers have them (``true``/``false``, ``null``/``~``, ``0x``/``0o``,
    ``1e-3`` stay as they are). A key given twice was merged silently, the last one winning: a second ``train:``
    section dropped the whole first one."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults": its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, collections.abc.Hashable):  # a list as a key: PyYAML's own check says so below
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node) -> int:
        text = self.construct_scalar(node).replace("_", "")
        sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
        base = {"0x": 16, "0o": 8}.get(digits[:2].lower(), 10)
        return sign * int(digits[2:] if base != 10 else digits, base)


_YAML_1_1_TYPES = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in _YAML_1_1_TYPES] for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:[0-9][0-9_]*|0x[0-9a-fA-F][0-9a-fA-F_]*|0o[0-7][0-7_]*)$"), list("-+0123456789"))
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)
_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def read_yaml(text: str) -> Any:
    """``text`` read as a config's YAML (:class:`_ConfigLoader`); a :class:`yaml.YAMLError` when it is not, or when it
    holds a value Python cannot make (an integer of over 4,300 digits)."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506  (a SafeLoader: no object is built from a tag)
    except (ValueError, OverflowError) as error:
        raise yaml.YAMLError(f"a value it cannot hold ({error})") from None


class _ConfigDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting every string that YAML 1.1 or :class:`_ConfigLoader` would read as something
    else: a saved config.yaml reads back as it was, in this version (``name: '1e5'``) and in older ones (``'no'``)."""


_ConfigDumper.yaml_implicit_resolvers = {
    first: [*yaml.SafeDumper.yaml_implicit_resolvers.get(first, []), *_ConfigLoader.yaml_implicit_resolvers.get(first, [])]
    for first in {*yaml.SafeDumper.yaml_implicit_resolvers, *_ConfigLoader.yaml_implicit_resolvers}
}


def _short_number(value: int) -> str:
    """An integer for a message: whole up to 24 digits, else its first digits and how many there are."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


def _one_line(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what PyYAML expected, its problem and where (PyYAML's own text spans several
    lines): "expected a single document in the stream, but found another document at line 3, column 1"."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if not problem:
        return " ".join(str(error).split())
    context = getattr(error, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{context + ', ' if context else ''}{problem}{where}".split())


def apply_overrides(values: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b=c`` overrides (values parsed as YAML scalars) to a nested dict, in place."""
    for override in overrides:
        dotted, equals, raw = override.partition("=")
        parts = dotted.strip().split(".")
        if not equals or not all(parts):
            raise UserError(f"override '{override}' must look like section.key=value")
        try:
            value = read_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as error:
            raise UserError(f"override '{override}': the value is not valid YAML ({_one_line(error)}); quote it if it is text") from None
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override '{override}': {part} is not a section")
        node[parts[-1]] = value
    return values


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Config from a YAML file (or the defaults when ``path`` is None) plus overrides."""
    return from_dict(ExperimentConfig, apply_overrides(read_recipe(path) if path is not None else {}, overrides))


def read_recipe(path: str | Path) -> dict[str, Any]:
    """A recipe file's settings as nested dicts, read once (what :func:`recipe_keys` lists and :func:`load_config`
    builds from); every way the file can be wrong is one UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"config file not found: {path}")
    if path.is_dir():
        raise UserError(f"config file {path} is a directory; give a YAML file such as tasks/configs/demo.yaml")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read config file {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise UserError(f"config file {path} is not UTF-8 text (line {line} is not); save it as UTF-8") from None
    try:
        values = read_yaml(text)
    except yaml.YAMLError as error:
        raise UserError(f"config file {path} is not valid YAML: {_one_line(error)}") from None
    if values is None:  # an empty file, or only comments: not the defaults by accident
        raise UserError(f"config file {path} holds no settings (it is empty or only comments); give a recipe such as tasks/configs/demo.yaml")
    if not isinstance(values, dict):
        raise UserError(f"config file {path} must hold a mapping of sections, not {type(values).__name__} {values!r:.40}")
    return values


def save_config(config: ExperimentConfig, path: str | Path) -> None:
    write_text_atomic(path, config_yaml(config))


def config_yaml(config: ExperimentConfig) -> str:
    """``config`` as the YAML a run folder keeps: every key, and a ``# not read: ...`` comment on each model
    section or key that the model never reads (:func:`unread_keys`):

        decoder:
          family: transformer
          rnn: gru  # not read: the transformer decoder family has no RNN cell

    The comments never change what the file holds: where one would (a value YAML writes over several lines),
    the file is written without them."""
    values = to_dict(config)
    plain = yaml.dump(values, Dumper=_ConfigDumper, sort_keys=False)
    marked = _mark_unread(plain, unread_keys(config))
    try:
        return marked if read_yaml(marked) == values else plain
    except yaml.YAMLError:
        return plain


_YAML_KEY_LINE = re.compile(r"( *)([A-Za-z_][A-Za-z0-9_]*):( .*)?")  # "  key: value" or "section:", as yaml.dump writes them


def _mark_unread(text: str, unread: Mapping[str, str]) -> str:
    """The block-style YAML ``text`` (two spaces a level, as yaml.dump writes it) with ``  # not read: why`` after
    each key whose dotted name ``unread`` holds."""
    lines, path = [], []
    for line in text.splitlines():
        key_line = _YAML_KEY_LINE.fullmatch(line)
        if key_line is not None:
            depth = len(key_line[1]) // 2
            path = [*path[:depth], key_line[2]]
            why = unread.get(".".join(path))
            if why is not None:
                line += f"  # not read: {why}"
        lines.append(line)
    return "\n".join(lines) + "\n"
