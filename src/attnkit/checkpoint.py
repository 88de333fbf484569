"""Self-contained, safe, atomic checkpoints.

One file holds the weights, the resolved config, the vocabularies, the task
and the code version: enough to rebuild the model with no other file. It holds
only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(path, weights_only=True)`` and opening a checkpoint from elsewhere
cannot run code. Writes go to a temporary file that is renamed over the target,
so a crash mid-write never leaves a half-written checkpoint.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnkit import __version__
from attnkit.errors import UserError
from attnkit.files import atomic_path

FORMAT = "attnkit-checkpoint"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    task: str  # "translation", ...
    config: dict[str, Any]  # resolved ExperimentConfig as a plain dict
    vocabularies: dict[str, list[str]]  # e.g. {"source": [...], "target": [...]}
    model: dict[str, torch.Tensor]  # state_dict
    training: dict[str, Any] = field(default_factory=dict)  # optimizer, scheduler, epoch, ... (for --resume)
    attnkit_version: str = __version__


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
    }
    with atomic_path(path) as temporary:
        torch.save(payload, temporary)
    return path


def load_checkpoint(path: str | Path, task: str | tuple[str, ...] | None = None, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load and validate a checkpoint; any problem a user can cause is a :class:`UserError`.

    ``task``: the task (or tasks) the caller can use; another task's checkpoint is refused.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise UserError(f"checkpoint path is a directory, not a file: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError) as error:
        raise UserError(f"{path} is not a readable attnkit checkpoint ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{path} is not an attnkit checkpoint")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(
            f"{path} has checkpoint format {version}, this attnkit ({__version__}) reads format {FORMAT_VERSION}; "
            f"it was written by attnkit {payload.get('attnkit_version')}"
        )
    accepted = (task,) if isinstance(task, str) else task
    if accepted is not None and payload.get("task") not in accepted:
        raise UserError(f"{path} is a '{payload.get('task')}' checkpoint, but this command needs a {' or '.join(repr(t) for t in accepted)} checkpoint")
    return Checkpoint(
        task=payload["task"],
        config=payload["config"],
        vocabularies=payload["vocabularies"],
        model=payload["model"],
        training=payload.get("training", {}),
        attnkit_version=payload.get("attnkit_version", "unknown"),
    )
