"""Self-contained, safe, atomic checkpoints.

One file holds the weights, the resolved config, the vocabularies, the task
and the code version: enough to rebuild the model with no other file. It holds
only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(path, weights_only=True)`` and opening a checkpoint from elsewhere
cannot run code. Writes go to a temporary file that is renamed over the target,
so a crash mid-write never leaves a half-written checkpoint.

Loading trusts nothing in the file: the archive's checksums, the payload's
structure and types, the config's values and the vocabularies are checked, and
:func:`load_weights` checks that the weights fit the model. Whatever is wrong
with a file is one :class:`UserError`: not a checkpoint, damaged, or from an
incompatible version.
"""

from __future__ import annotations

import copy
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit import __version__
from attnkit.config import SUBWORD_TOKENIZER, ExperimentConfig, apply_overrides, drop_legacy_keys, from_dict, model_differences, to_dict
from attnkit.errors import UserError, first_line
from attnkit.files import save_torch_atomic
from attnkit.vocab import SPECIALS, SubwordModel

FORMAT = "attnkit-checkpoint"
FORMAT_VERSION = 2  # 2: every model keeps its encoders by kind (encoders.text.*, encoders.image.*); 1 still reads
ENCODER_OF_FORMAT_1 = {"translation": "text", "captioning": "image"}  # a format-1 single-task model's one encoder (encoder.*)

VOCABULARIES = {"translation": ("source", "target"), "captioning": ("target",), "multitask": ("source", "target"), "pretrain": ("source", "target")}  # what each task's model needs
TRAINING = {"progress": dict, "optimizer": dict, "scheduler": dict}  # what Trainer.restore reads (scaler, history: optional)


def _random_states_valid(training: dict) -> bool:
    """One {"cpu": uint8 tensor, "cuda": [uint8 tensors] (optional)} per rank; "torch_rng" alone in checkpoints of attnkit before several ranks."""
    states = training.get("rng", [{"cpu": training.get("torch_rng")}])

    def valid(state) -> bool:
        cuda = state.get("cuda", []) if isinstance(state, dict) else None
        return (
            isinstance(state, dict)
            and isinstance(state.get("cpu"), torch.Tensor)
            and state["cpu"].dtype == torch.uint8
            and isinstance(cuda, list)
            and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)
        )

    return isinstance(states, list) and len(states) > 0 and all(valid(state) for state in states)


@dataclass(frozen=True)
class Checkpoint:
    task: str  # "translation", ...
    config: dict[str, Any]  # resolved ExperimentConfig as a plain dict
    vocabularies: dict[str, list[str]]  # e.g. {"source": [...], "target": [...]}
    model: dict[str, torch.Tensor]  # state_dict
    training: dict[str, Any] = field(default_factory=dict)  # optimizer, scheduler, epoch, ... (for --resume)
    attnkit_version: str = __version__
    subword_models: dict[str, bytes] = field(default_factory=dict)  # {"source": ..., "target": ...}: serialised sentencepiece models (data.tokenizer.kind sentencepiece)
    read_from: Path | None = field(default=None, compare=False)  # the file load_checkpoint read it from (not saved): a resumed run's other files lie beside it

    def refuse_without_training_state(self) -> None:
        """Resuming needs the optimizer, schedule and counters, which weights exported for inference lack."""
        if not self.training:
            raise UserError(
                f"{self.read_from or 'this checkpoint'} holds no training state (weights exported for inference: an epoch-<k>.pt, "
                "attnkit average's mean); resume from the run's last.pt"
            )

    def refuse_another_model(self, config: ExperimentConfig) -> None:
        """Resuming trains this checkpoint's model on: ``config`` may change how (epochs, budget, device, ...), not what
        the model is (:data:`attnkit.config.MODEL_KEYS`). Weights that happen to fit another architecture (other heads,
        another image size) would otherwise train on silently."""
        changed = model_differences(self.config, to_dict(config))
        if changed:
            raise UserError(
                f"cannot resume: the config changes the checkpoint's model (saved vs asked): {'; '.join(changed)}; "
                "keep the saved values, or train another model as a new run (--config)"
            )


def save_checkpoint(path: str | Path, checkpoint: Checkpoint) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "attnkit_version": checkpoint.attnkit_version,
        "task": checkpoint.task,
        "config": checkpoint.config,
        "vocabularies": checkpoint.vocabularies,
        "model": checkpoint.model,
        "training": checkpoint.training,
        "subword_models": checkpoint.subword_models,
    }
    try:
        save_torch_atomic(path, payload)  # a full disk is an OSError (save_torch_atomic says why)
    except OSError as error:
        if error.filename is None:  # a failed write names no file: name the checkpoint
            error.filename = str(path)
        raise
    return path


def load_checkpoint(path: str | Path, task: str | tuple[str, ...] | None = None, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load and validate a checkpoint; any problem a user can cause is a :class:`UserError`.

    ``task``: the task (or tasks) the caller can use; another task's checkpoint is refused.
    The config comes back complete (every key, legacy keys dropped) and valid.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise UserError(f"checkpoint path is a directory, not a file: {path}")
    payload = _read(path, map_location)
    if not isinstance(payload, dict) or not isinstance(payload.get("format"), str) or payload["format"] != FORMAT:
        raise UserError(f"{path} is not an attnkit checkpoint")
    version = payload.get("format_version")
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:  # type: a tensor or True would compare too
        raise UserError(
            f"{path} has checkpoint format {_short(version if type(version) is int else repr(version))}, this attnkit ({__version__}) reads formats 1 to {FORMAT_VERSION}; "
            f"it was written by attnkit {_short(payload.get('attnkit_version'))}"
        )
    checkpoint = _validate(path, payload)
    if version == 1:
        checkpoint = _from_format_1(checkpoint)
    accepted = (task,) if isinstance(task, str) else task
    if accepted is not None and checkpoint.task not in accepted:
        raise UserError(f"{path} is a '{checkpoint.task}' checkpoint, but this command needs a {' or '.join(repr(t) for t in accepted)} checkpoint")
    return replace(checkpoint, read_from=path)


def load_weights(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Load the checkpoint's weights into ``model`` (built from its config and vocabularies).

    Weights that do not fit (missing or extra names, other shapes or kinds) are a
    :class:`UserError`, not torch's traceback: the file is damaged or from another version.
    """
    expected, given = model.state_dict(), checkpoint.model
    if not isinstance(given, dict):
        raise _misfit(f"the weights are a {type(given).__name__}, not a state dict")
    problems = []
    missing = [name for name in expected if name not in given]
    unexpected = [name for name in given if name not in expected]
    if missing:
        problems.append(f"missing {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected {_names(unexpected)}")
    for name, tensor in given.items():
        if name not in expected:
            continue
        want = expected[name]
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"{name} is a {type(tensor).__name__}, not a tensor")
        elif tensor.shape != want.shape:
            problems.append(f"{name} has shape {tuple(tensor.shape)}, the model's is {tuple(want.shape)}")
        elif tensor.is_complex() or tensor.is_floating_point() != want.is_floating_point():
            problems.append(f"{name} holds {tensor.dtype}, the model's {want.dtype}")
    if problems:
        raise _misfit("; ".join(problems[:3]) + (f"; {len(problems) - 3} more" if len(problems) > 3 else ""))
    try:
        model.load_state_dict(given)
    except (RuntimeError, ValueError, TypeError) as error:  # anything the checks above did not foresee
        raise _misfit(first_line(error)[:200]) from None


def with_overrides(checkpoint: Checkpoint, overrides: Sequence[str]) -> Checkpoint:
    """The checkpoint with ``section.key=value`` overrides applied to its config, checked like any config;
    e.g. the attention aggregate a Transformer's analysis reads, once chosen on validation data."""
    config = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(checkpoint.config), overrides))
    return replace(checkpoint, config=to_dict(config))


def average_checkpoints(checkpoints: Sequence[Checkpoint], names: Sequence[str]) -> Checkpoint:
    """One checkpoint whose weights are the mean of ``checkpoints``' (the last few epochs of one run, say):
    cheap, and usually a little better than any one of them. Inference only (no training state); the
    config is the last checkpoint's. ``names`` name the checkpoints in errors.

    The checkpoints must be of one model: the same task, vocabularies, subword models and weight names
    and shapes, and configs that agree on what defines the model (:data:`attnkit.config.MODEL_KEYS`; other heads or
    another image size keep the weights' shapes). Integer buffers (counters) are the last checkpoint's."""
    if not checkpoints:
        raise UserError("nothing to average: no checkpoint given")
    first, last = checkpoints[0], checkpoints[-1]
    for checkpoint, name in zip(checkpoints[1:], names[1:]):
        changed = model_differences(first.config, checkpoint.config)
        if changed:
            raise UserError(
                f"{name} is not a checkpoint of the same model as {names[0]}: their configs differ ({names[0]} vs {name}): {'; '.join(changed)}; "
                "only one model's checkpoints average"
            )
        differs = [
            what
            for what, same in (
                ("task", checkpoint.task == first.task),
                ("vocabularies", checkpoint.vocabularies == first.vocabularies),
                ("subword models", checkpoint.subword_models == first.subword_models),
                ("weights", checkpoint.model.keys() == first.model.keys() and all(t.shape == first.model[k].shape for k, t in checkpoint.model.items())),
            )
            if not same
        ]
        if differs:
            raise UserError(f"{name} is not a checkpoint of the same model as {names[0]} (its {', '.join(differs)} differ): only one model's checkpoints average")
    averaged = {}
    for key, tensor in last.model.items():
        if tensor.is_floating_point():
            total = torch.stack([checkpoint.model[key].double() for checkpoint in checkpoints]).mean(dim=0)  # float64: no rounding drift
            averaged[key] = total.to(tensor.dtype)
        else:
            averaged[key] = tensor.clone()
    return replace(last, model=averaged, training={})


# -- reading and checking --------------------------------------------------------------------------------
def _read(path: Path, map_location: str | torch.device) -> Any:
    """The unpickled payload; a file that is not a whole, plain-data torch archive is a UserError."""
    unreadable = f"{path} is not a readable attnkit checkpoint"
    try:
        with open(path, "rb") as handle:  # unreadable (permissions) is said as such, not as "damaged"
            empty = not handle.read(1)
        if empty:
            raise UserError(f"{unreadable}: the file is empty (was its writing interrupted?)")
        if not zipfile.is_zipfile(path):
            raise UserError(f"{unreadable}: it is not a PyTorch archive (another kind of file, or truncated)")
        # torch does not verify the archive's CRC-32s: a flipped bit in the weights would load silently.
        # attnkit checkpoints store every member uncompressed, so checking them reads the file once more
        # and nothing can expand.
        with zipfile.ZipFile(path) as archive:
            if any(member.compress_type != zipfile.ZIP_STORED for member in archive.infolist()):
                raise UserError(f"{unreadable}: it holds compressed members, which torch.save never writes")
            damaged = archive.testzip()
        if damaged is not None:
            raise UserError(f"{unreadable}: it is damaged ({_names([damaged])} fails its checksum)")
        with warnings.catch_warnings():  # a damaged pickle can make torch warn about its own internals
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True)
    except UserError:
        raise
    except OSError as error:
        if error.errno is None:  # zipfile and torch raise errno-less OSErrors for malformed archives
            raise UserError(f"{unreadable}: it is damaged") from None
        raise UserError(f"cannot read checkpoint {path}: {error.strerror}") from None
    except MemoryError:
        raise UserError(f"not enough memory to load checkpoint {path}") from None
    except Exception:
        # Every failure to parse the bytes (zip, pickle, storages) lands here: the file is damaged, or it holds
        # objects other than tensors and plain data, which attnkit never writes. torch's message is left out:
        # its advice to load with weights_only=False would run whatever code the file holds.
        raise UserError(f"{unreadable}: it is damaged, or it is not an attnkit checkpoint") from None


def _validate(path: Path, payload: dict[str, Any]) -> Checkpoint:
    def invalid(what: str) -> UserError:
        return UserError(f"{path} is not a valid attnkit checkpoint ({what[:300]}): it is damaged or from an incompatible version")

    task = payload.get("task")
    if not isinstance(task, str) or task not in VOCABULARIES:
        raise invalid(f"unknown task {_short(task)}")
    config = payload.get("config")
    if not isinstance(config, dict):
        raise invalid("it holds no config")
    try:
        config = to_dict(from_dict(ExperimentConfig, drop_legacy_keys(config)))
    except UserError as error:
        raise invalid(f"its config is not valid: {error}") from None
    vocabularies = payload.get("vocabularies")
    if not isinstance(vocabularies, dict):
        raise invalid("it holds no vocabularies")
    for side in VOCABULARIES[task]:
        words = vocabularies.get(side)
        if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
            raise invalid(f"no {side} vocabulary (a list of words)")
        if tuple(words[: len(SPECIALS)]) != SPECIALS or len(set(words)) != len(words):
            raise invalid(f"the {side} vocabulary does not start with {', '.join(SPECIALS)} or repeats a word")
    subword_models = _valid_subword_models(payload.get("subword_models", {}), task, config, vocabularies, invalid)
    model = payload.get("model")
    if not isinstance(model, dict) or not model or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        raise invalid("no model weights (a dict of named tensors)")
    training = payload.get("training", {})
    if not isinstance(training, dict):
        raise invalid("its training state is not a dict")
    if training:  # empty: exported for inference only
        for key, kind in TRAINING.items():
            if not isinstance(training.get(key), kind):
                raise invalid(f"its training state has no {key}")
        if not _random_states_valid(training) or not isinstance(training.get("scaler", {}), dict) or not isinstance(training.get("history", []), list):
            raise invalid("its training state's random generators, scaler or history are not valid")
    version = payload.get("attnkit_version", "unknown")
    return Checkpoint(task, config, vocabularies, model, training, version if isinstance(version, str) else "unknown", subword_models)


def _valid_subword_models(models: Any, task: str, config: dict[str, Any], vocabularies: dict, invalid: Callable[[str], UserError]) -> dict[str, bytes]:
    """The checkpoint's sentencepiece models, each parsed and checked against its side's vocabulary."""
    if not isinstance(models, dict) or not all(isinstance(side, str) and isinstance(proto, bytes) for side, proto in models.items()):
        raise invalid("its subword models are not a dict of bytes")
    needed = VOCABULARIES[task] if config["data"]["tokenizer"]["kind"] == SUBWORD_TOKENIZER else ()
    if set(models) != set(needed):
        raise invalid(f"it has subword models for {sorted(models) or 'no side'}; its tokenizer needs them for {list(needed) or 'no side'}")
    for side, proto in models.items():
        try:
            pieces = SubwordModel(proto).pieces
        except UserError as error:
            raise invalid(f"its {side} subword model: {error}") from None
        if pieces != vocabularies[side]:
            raise invalid(f"its {side} sentencepiece model does not match its {side} vocabulary")
    return models


def _from_format_1(checkpoint: Checkpoint) -> Checkpoint:
    """Format 1 named a single-task model's one encoder ``encoder``; format 2 names it by the kind it reads."""
    kind = ENCODER_OF_FORMAT_1.get(checkpoint.task)
    if kind is None:  # the joint model kept its encoders by kind already
        return checkpoint
    old, new = "encoder.", f"encoders.{kind}."
    return replace(checkpoint, model={(new + name[len(old) :] if name.startswith(old) else name): tensor for name, tensor in checkpoint.model.items()})


def _misfit(what: str) -> UserError:
    return UserError(f"the checkpoint's weights do not fit this model ({what[:400]}): incompatible version or damaged")


def _names(names: list[str]) -> str:
    shown = [name if name.isprintable() else repr(name) for name in names[:3]]  # a damaged name may hold control bytes
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
