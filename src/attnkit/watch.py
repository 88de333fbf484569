"""Training you can watch: with ``train.tensorboard: true`` a run also writes TensorBoard events to
``<run>/tensorboard``: every epoch's scalars (training loss and perplexity, tokens/s, the learning rate, every
validation score) and, at every validation, the attention of one fixed validation example as an image, so the
attention can be seen forming epoch by epoch::

    attnkit train --config tasks/configs/tiny.yaml --set train.tensorboard=true
    tensorboard --logdir runs/tiny/tensorboard

The step of every event is the epoch. A resumed run hides the events a killed run wrote for the epochs it
redoes (TensorBoard's ``purge_step``), so each epoch shows once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attnkit.errors import UserError

FOLDER = "tensorboard"  # in the run folder; a run's own (--overwrite removes its event files)
EVENT_FILES = "events.out.tfevents.*"

# model -> {tag: PNG}: the attention of one fixed validation example, drawn into the given folder
DrawAttention = Callable[[nn.Module, Path], dict[str, Path]]


def summary_writer_class() -> type:
    """TensorBoard's SummaryWriter, or one clear message when the tensorboard package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UserError(
            "train.tensorboard: true needs the tensorboard package: pip install 'attnkit[tensorboard]' (or pip install tensorboard), "
            "or set train.tensorboard=false"
        ) from None
    return SummaryWriter


def check_tensorboard(run_dir: str | Path) -> None:
    """Before any work: the tensorboard package is there, and ``<run>/tensorboard`` can hold the events (the writer
    makes that folder only at the first epoch it logs, so a file or a dangling link there would fail a whole epoch in)."""
    summary_writer_class()
    folder = Path(run_dir) / FOLDER
    way_out = "move it away, or set train.tensorboard=false"
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"train.tensorboard: {folder} is a link to {os.readlink(folder)}, which does not exist (the events go there); {way_out}")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"train.tensorboard: {folder} is a file, not a folder (the events go there); {way_out}")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"train.tensorboard: {folder}: permission denied (the events cannot be written there)")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """One epoch's record (log.jsonl's line) as TensorBoard scalars: train/... and valid/... by name."""
    found = {
        "train/loss": record["train_loss"],
        "train/perplexity": record.get("train_ppl"),  # absent when the objective reads no references (SCST)
        "train/tokens_per_s": record["train_tokens_per_s"],
        "train/learning_rate": record["lr"],
        "train/epoch_seconds": record.get("epoch_seconds"),
    }
    for name, value in record.get("train_statistics", {}).items():  # the objective's own (SCST: reward)
        found[f"train/{name}"] = value
    for name, value in record.get("valid", {}).items():
        found[f"valid/{name}"] = value
    return {tag: float(value) for tag, value in found.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}


class TensorBoardLog:
    """Writes a run's TensorBoard events (rank 0 only). The writer opens at the first epoch it logs, hiding any
    events of that epoch and later ones that an earlier, killed process left (the epochs a resume redoes)."""

    def __init__(self, run_dir: str | Path, draw_attention: DrawAttention | None = None):
        self.writer_class = summary_writer_class()
        self.folder = Path(run_dir) / FOLDER
        self.draw_attention = draw_attention
        self.writer = None

    def log_epoch(self, record: dict[str, Any], model: nn.Module) -> None:
        epoch = record["epoch"]
        if self.writer is None:
            self.writer = self.writer_class(log_dir=str(self.folder), purge_step=epoch)
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, epoch)
        if self.draw_attention is not None:
            from PIL import Image

            with tempfile.TemporaryDirectory() as folder:
                for tag, png in self.draw_attention(model, Path(folder)).items():
                    with Image.open(png) as image:
                        pixels = np.asarray(image.convert("RGB"))  # (H, W, 3)
                    self.writer.add_image(f"attention/{tag}", pixels, epoch, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
