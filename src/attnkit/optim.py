"""The optimiser's learning-rate schedule: an optional linear warm-up, then halving on plateaus, and an optional
linear decay over the last epochs.

A Transformer's first updates are large and noisy (Adam's second-moment estimates start from nothing),
so its learning rate usually climbs linearly from lr / warmup_steps to lr over the first
``train.warmup_steps`` optimizer steps (Vaswani et al. 2017; Popel and Bojar 2018). After that, as for
the RNN recipes, the rate is multiplied by ``train.lr_factor`` at the validation after ``train.lr_patience``
validations without improvement (torch's ReduceLROnPlateau: at 1, the second such validation halves it), an
improvement being a rise of more than 0.01 % of the best score. Validations during the warm-up do not count
towards a plateau.

With ``train.decay_epochs`` N, the last N of ``train.epochs`` (all of them, when N is more) decay the rate
(warm-up, stable, decay: the WSD schedule of Hu et al. 2024): from the share of its peak the rate had when they
began, linearly, step by step, to 0 at the end of the last epoch; the plateaus no longer change it. A decay that
begins within the warm-up leaves the warm-up going: the rate climbs until it meets the falling line. On the demo's
scene model three such epochs of fourteen took validation captions from 65 % to 87 % exactly right
(BENCHMARKS.md, "A falling rate at the end")::

    rate / peak
      1 |     ______________
        |    /              |_______               a plateau: x lr_factor
        |   /                       `-._
        |  /                            `-._       the decay: linearly to 0
        | /                                 `-._
      0 +---------------------------------------+--> epochs done, counted in steps
        0  warm-up                   E - N      E

A parameter group may carry ``frozen_steps`` (a pre-trained text encoder held still at first,
``text_encoder.frozen_steps``): its rate is 0 for those steps, then what the schedule gives the others.

:class:`WeightAverage` keeps an exponential moving average of the weights over the optimizer steps
(``train.ema_decay``; Polyak and Juditsky 1992, as timm's ``ModelEmaV2`` and fairseq's EMA keep it):
the trainer validates and saves the average, which smooths the last steps' noise out of the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.config import TrainConfig


class LearningRateSchedule:
    def __init__(self, optimizer: torch.optim.Optimizer, config: TrainConfig):
        self.optimizer = optimizer
        self.warmup_steps = config.warmup_steps
        self.peaks = [group["lr"] for group in optimizer.param_groups]  # each group's configured rate
        # Read now, from the groups as this run's config made them: a resumed optimizer's state brings the saved ones back.
        self.frozen = [group.get("frozen_steps", 0) for group in optimizer.param_groups]
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=config.lr_factor, patience=config.lr_patience, min_lr=config.min_lr
        )
        self.decay_epochs = min(config.decay_epochs, config.epochs)  # a run shorter than its decay decays throughout
        self.decay_start = config.epochs - self.decay_epochs
        self.decay_from: float | None = None  # the share of the peaks the rate had when the decay began (saved)

    def decayed(self, position: float | None) -> float | None:
        """How much of the decay lies behind a step at ``position`` (epochs done, counted in steps: epoch e's
        step i of n is at e - 1 + i / n): from 0 at the first decaying step to below 1 at the last; None before it.
        Past the last epoch (a caller running epochs on its own, as bench/gpu_smoke.py does) it stays at 1: the rate 0,
        never a negative one."""
        if self.decay_epochs == 0 or position is None or position < self.decay_start:
            return None
        return min(1.0, (position - self.decay_start) / self.decay_epochs)

    def cut_short(self, epoch: int) -> str:
        """What a stop after ``epoch`` (early stopping, the time budget) leaves of the decay, for the stop's line: a
        run stopped before its decay never ran at the falling rate, which is worth a word where the decay was asked for."""
        epochs = self.decay_start + self.decay_epochs  # the run's train.epochs
        if self.decay_epochs == 0 or epoch >= epochs:
            return ""
        decay = f"the last {self.decay_epochs} of {epochs} epochs"
        if epoch <= self.decay_start:
            return f", before its decay ({decay}) began"
        return f", after {epoch - self.decay_start} of its decay's epochs ({decay})"

    def before_step(self, step: int, position: float | None = None) -> None:
        """Set the rate of optimizer step ``step`` (0-based) at ``position`` (:meth:`decayed`; None: not decaying):
        warming up, left as the plateaus made it, or decaying; 0 for a group still frozen, and once it thaws the share
        of its peak that the other groups have then."""
        groups = self.optimizer.param_groups
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0  # the warm-up's share of the peak
        if step < self.warmup_steps:
            for group, peak in zip(groups, self.peaks):
                group["lr"] = peak * warm
        moving = [(group, peak) for group, peak, frozen in zip(groups, self.peaks, self.frozen) if step >= frozen and group["lr"] > 0]
        share = moving[0][0]["lr"] / moving[0][1] if moving else warm  # the warm-up and the plateaus move every group alike
        decayed = self.decayed(position)
        if decayed is None:
            self.decay_from = None  # a resumed run given more epochs: its decay begins again, later, from the rate reached
        else:
            if self.decay_from is None:
                self.decay_from = share / warm  # the plateaus' share alone (1 within the warm-up, where they wait)
            # A decay that begins within the warm-up: the rate climbs until it meets the falling line, then follows it
            # (it froze at the warm-up's first small share, lr / warmup_steps, and only fell from there).
            share = min(warm, self.decay_from * (1.0 - decayed))
            for group, peak in zip(groups, self.peaks):
                group["lr"] = peak * share
        for group, peak, frozen in zip(groups, self.peaks, self.frozen):
            if step < frozen:
                group["lr"] = 0.0
            elif group["lr"] == 0.0:  # thawing (or resumed with fewer frozen steps than the rate was set for)
                group["lr"] = peak * share

    def moving_parameters(self, step: int) -> list[nn.Parameter]:
        """The parameters of the groups optimizer step ``step`` may move. Gradient clipping measures these alone: a
        frozen encoder's gradients would count in the norm, and so shrink the other groups' steps, and move nothing."""
        return [p for group, frozen in zip(self.optimizer.param_groups, self.frozen) if step >= frozen for p in group["params"]]

    def moving_rate(self, steps: int) -> float:
        """After ``steps`` optimizer steps, the rate of the first group the last step moved (what a run's log
        reports: a frozen pre-trained encoder's 0 is not the rate training runs at); 0 when it moved none."""
        return next((group["lr"] for group, frozen in zip(self.optimizer.param_groups, self.frozen) if steps - 1 >= frozen), 0.0)

    def after_validation(self, score: float, step: int) -> None:
        """A validation ``score`` (higher is better) after ``step`` optimizer steps; while the rate decays, the
        plateaus wait."""
        if step >= self.warmup_steps and self.decay_from is None:
            self.plateau.step(score)

    def state_dict(self) -> dict[str, Any]:
        # The warm-up needs only the step count, which the run's progress keeps; the peaks let a resumed run rescale.
        return {**self.plateau.state_dict(), "peaks": list(self.peaks), "decay_from": self.decay_from}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a checkpoint's schedule, after its optimizer state was loaded (which set each group's rate
        to the saved one). The plateau's count and best score are the checkpoint's; its settings (patience,
        factor, min_lr) and the peak rates this run's, as ``--resume --set train.lr=...`` asks: each group's rate
        becomes this run's peak times the share of its saved peak the schedule had reached (the same rate when
        the peak is unchanged). Torch's own loads bring the saved settings and rates back. A checkpoint written
        before the peaks were saved keeps its saved rates."""
        state = dict(state)
        saved_peaks = state.pop("peaks", None)
        decay_from = state.pop("decay_from", None)  # absent from a checkpoint written before the decay existed
        if decay_from is not None and not (isinstance(decay_from, (int, float)) and decay_from > 0):
            raise ValueError(f"the schedule saved a decay from {decay_from!r}: it must be a positive share of the peak rates")
        self.decay_from = decay_from
        settings = {"patience": self.plateau.patience, "factor": self.plateau.factor, "min_lrs": self.plateau.min_lrs}
        self.plateau.load_state_dict(state)
        for name, value in settings.items():
            setattr(self.plateau, name, value)
        if saved_peaks is None:
            return
        if len(saved_peaks) != len(self.peaks):
            raise ValueError(f"the schedule saved {len(saved_peaks)} parameter groups, this run has {len(self.peaks)}")
        if not all(isinstance(peak, (int, float)) and peak > 0 for peak in saved_peaks):
            raise ValueError(f"the schedule saved peak rates {saved_peaks}: each must be a positive number")
        for group, peak, saved_peak in zip(self.optimizer.param_groups, self.peaks, saved_peaks):
            if peak != saved_peak:  # an unchanged peak leaves the rate bit for bit as it was
                group["lr"] = group["lr"] * peak / saved_peak


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """A checkpoint's optimizer state (Adam's moments and step counts, the groups' rates) into ``optimizer``, its
    other settings kept as this run made them (weight decay, betas, eps, fused, ...), as ``--resume --set
    train.weight_decay=...`` asks: torch's own load brings the saved ones back. The rates are the schedule's
    (:meth:`LearningRateSchedule.load_state_dict`)."""
    settings = [{key: value for key, value in group.items() if key not in ("params", "lr")} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, settings):
        group.update(own)
        for parameter in group["params"]:  # torch counts the parameters only: a moment of another shape crashed fused Adam
            for name, value in optimizer.state.get(parameter, {}).items():
                if isinstance(value, Tensor) and value.dim() > 0 and value.shape != parameter.shape:
                    raise ValueError(f"Adam's {name} of a {tuple(parameter.shape)} parameter has the shape {tuple(value.shape)}")


class WeightAverage:
    """An exponential moving average of ``model``'s weights, updated after each optimizer step ``t``:
    ``average += (1 - d_t) * (weights - average)`` with ``d_t = min(decay, (1 + t) / (10 + t))``, so the
    random weights of a run's first steps fade within tens of steps rather than thousands (timm's warm-up).
    Every floating-point entry of the state dict is averaged (parameters, and buffers such as BatchNorm's
    running statistics); integer ones (counters) are copied."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.average: dict[str, Tensor] = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        self._floating = [name for name, tensor in self.average.items() if tensor.is_floating_point()]
        self._counters = [name for name, tensor in self.average.items() if not tensor.is_floating_point()]

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Fold in ``model``'s weights after optimizer step ``step`` (0-based)."""
        decay = min(self.decay, (1 + step) / (10 + step))
        weights = model.state_dict()
        torch._foreach_lerp_([self.average[name] for name in self._floating], [weights[name] for name in self._floating], 1.0 - decay)
        for name in self._counters:
            self.average[name].copy_(weights[name])

    def restart_from(self, model: nn.Module) -> None:
        """The average becomes ``model``'s weights as they are (a resumed run's saved average, just loaded)."""
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                self.average[name].copy_(tensor)

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[dict[str, Tensor]]:
        """Inside the block ``model`` holds the average (to validate and save it); the block gets a copy of the
        weights being trained, which ``model`` holds again after it."""
        trained = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        model.load_state_dict(self.average)
        try:
            yield trained
        finally:
            model.load_state_dict(trained)
