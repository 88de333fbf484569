"""Experiment configuration: frozen dataclasses with commented defaults.

YAML lives only at the edge (``tasks/configs/*.yaml``); :func:`load_config`
reads it, applies dotted overrides (``--set decoder.hidden_size=512``) and
rejects unknown keys with the list of valid ones. The resolved config is stored
in every run folder and checkpoint and rebuilds the model.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnkit.errors import UserError


@dataclass(frozen=True)
class TokenizerConfig:
    kind: str = "moses"  # moses (sacremoses) | nltk (NLTKWordTokenizer) | space (split on whitespace)
    lowercase: bool = True  # lower-case before tokenising (and score BLEU lower-cased)


@dataclass(frozen=True)
class DataConfig:
    path: str = "data/tatoeba-fr-en"  # prepared dataset folder (see data_scripts/); relative to the project root
    source_lang: str = ""  # empty: the first language in the folder's dataset.json
    target_lang: str = ""  # empty: the second language in dataset.json
    min_freq: int = 1  # words seen fewer times in training map to <unk>
    max_vocab: int = 0  # keep at most this many words per side (0: no cap)
    max_source_length: int = 50  # longer training pairs are skipped; longer inputs are truncated at translation
    max_target_length: int = 50  # longer training pairs are skipped
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    feature_cache: str = "cache/features"  # captioning with a frozen image encoder: grid features cached here ("" : off)
    text_path: str = ""  # task multitask: the parallel-text dataset (data.path is then the captioning dataset)


@dataclass(frozen=True)
class TextEncoderConfig:
    embedding_size: int = 256
    hidden_size: int = 256  # per direction; memory size D is 2x this when bidirectional
    num_layers: int = 1
    rnn: str = "gru"  # gru | lstm | none (memory = embedding + position code: each position holds only its word)
    bidirectional: bool = True
    dropout: float = 0.1  # on embeddings and between layers


@dataclass(frozen=True)
class ImageEncoderConfig:
    backbone: str = "efficientnet_lite0"  # resnet18|34|50|101, mobilenet_v3_small|large, efficientnet_b0, efficientnet_lite0, local_cnn (small, from scratch)
    weights: str = "default"  # default: packaged ImageNet weights (efficientnet_lite0), random for others | none | PATH (torchvision state_dict)
    weights_sha256: str = ""  # set by training: the digest of the weights file, so a checkpoint needs neither the file nor the package
    image_size: int = 224  # images are resized to image_size x image_size
    blocks: int = 0  # keep only the backbone's first N blocks (0: all): an earlier cut gives finer, more local cells
    grid_size: int = 7  # average-pool the feature map to grid_size x grid_size cells (0: keep the backbone's)
    memory_size: int = 512  # project each cell to this size (0: keep the backbone's channels)
    trainable_blocks: int = 0  # fine-tune the last N backbone blocks (0: frozen; then features can be cached)
    backbone_lr: float = 0.0  # learning rate of the fine-tuned blocks (0: train.lr)
    dropout: float = 0.0  # on the projected cells
    position_embedding: bool = False  # add a learned embedding of each cell's position to its memory vector (needs grid_size)


@dataclass(frozen=True)
class DecoderConfig:
    embedding_size: int = 256
    hidden_size: int = 512
    num_layers: int = 1
    rnn: str = "gru"  # gru | lstm
    style: str = "luong"  # luong: RNN then attend with the new state | bahdanau: attend with the previous state, context into the RNN
    score: str = "general"  # dot | general | concat | additive | scaled_dot | none (no attention: the context is the memory's mean)
    attention_size: int = 256  # hidden size inside concat / additive scores
    input_feeding: bool = False  # luong: feed the previous attentional vector into the RNN
    context_gate: bool = False  # bahdanau: Show-Attend-Tell gate beta = sigmoid(W s) on the context
    readout_size: int = 0  # size of the vector before the output layer (0: hidden_size; tied embeddings force embedding_size)
    dropout: float = 0.1  # on embeddings, between RNN layers and before the output layer
    tie_embeddings: bool = False  # output layer shares the target embedding matrix
    init: str = "bridge"  # bridge: tanh(W init_state) | zeros


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 64  # sentences per batch (batches are bucketed by length)
    epochs: int = 20
    lr: float = 1e-3  # Adam
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # gradient norm clipping (0: off)
    label_smoothing: float = 0.0
    attention_regularization: float = 0.0  # lambda of the doubly stochastic term sum_l (1 - sum_t alpha_tl)^2
    teacher_forcing: float = 1.0  # probability of feeding the gold previous word (below 1: scheduled sampling)
    lr_patience: int = 1  # validations without improvement before the LR is multiplied by lr_factor
    lr_factor: float = 0.5
    min_lr: float = 1e-5
    patience: int = 5  # early stopping: validations without improvement before training stops (0: never)
    max_minutes: float = 0.0  # time budget: no epoch starts that would, at the last epoch's pace, end past it (0: none)
    valid_beam_size: int = 1  # beam used by validation decoding (1: greedy)
    valid_max_examples: int = 0  # decode at most this many validation examples (0: all)
    device: str = "auto"  # auto (cuda when present) | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 on capable CUDA, fp16 on older CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    num_workers: int = 0  # data loader workers (auto-raised to 2 on CUDA when 0)
    threads: int = 0  # torch CPU threads (0: PyTorch default)
    seed: int = 1
    log_every: int = 50  # progress-bar refresh of the running loss, in batches
    caption_share: float = 0.5  # task multitask: share of the batches that are captioning batches (the rest translate)


@dataclass(frozen=True)
class SearchConfig:
    beam_size: int = 5  # 1: greedy
    length_penalty: float = 1.0  # GNMT alpha: score / ((5 + len) / 6) ** alpha (0: raw log-probability)
    max_length_ratio: float = 2.0  # stop after max_length_ratio * source length + max_length_offset steps
    max_length_offset: int = 10
    n_best: int = 1


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    task: str = "translation"  # translation | captioning | multitask (one decoder, an image and a text encoder)
    output_dir: str = ""  # empty: runs/<name>
    data: DataConfig = field(default_factory=DataConfig)
    text_encoder: TextEncoderConfig = field(default_factory=TextEncoderConfig)  # task translation
    image_encoder: ImageEncoderConfig = field(default_factory=ImageEncoderConfig)  # task captioning
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    search: SearchConfig = field(default_factory=SearchConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict (str, int, float, bool only): YAML-, JSON- and ``weights_only``-safe."""
    return dataclasses.asdict(config)


def from_dict(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``values``; unknown keys and wrong types are :class:`UserError`."""
    if not isinstance(values, Mapping):
        raise UserError(f"config section '{where or 'top level'}' must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise UserError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(prefix + k for k in unknown)}; "
            f"valid keys{' in ' + where if where else ''}: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in values.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(hints[name], value, key)
    return cls(**kwargs)


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
            return float(value)
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


def apply_overrides(values: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b=c`` overrides (values parsed as YAML scalars) to a nested dict, in place."""
    for override in overrides:
        if "=" not in override:
            raise UserError(f"override '{override}' must look like section.key=value")
        dotted, raw = override.split("=", 1)
        parts = dotted.strip().split(".")
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override '{override}': {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return values


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Config from a YAML file (or the defaults when ``path`` is None) plus overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise UserError(f"config file {path} is not valid YAML: {error}") from None
        if not isinstance(values, dict):
            raise UserError(f"config file {path} must hold a mapping of sections")
    apply_overrides(values, overrides)
    return from_dict(ExperimentConfig, values)


def save_config(config: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
