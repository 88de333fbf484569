"""The optimiser's learning-rate schedule: an optional linear warm-up, then halving on plateaus.

A Transformer's first updates are large and noisy (Adam's second-moment estimates start from nothing),
so its learning rate usually climbs linearly from lr / warmup_steps to lr over the first
``train.warmup_steps`` optimizer steps (Vaswani et al. 2017; Popel and Bojar 2018). After that, as for
the RNN recipes, the rate is multiplied by ``train.lr_factor`` after ``train.lr_patience`` validations
without improvement. Validations during the warm-up do not count towards a plateau.
"""

from __future__ import annotations

from typing import Any

import torch

from attnkit.config import TrainConfig


class LearningRateSchedule:
    def __init__(self, optimizer: torch.optim.Optimizer, config: TrainConfig):
        self.optimizer = optimizer
        self.warmup_steps = config.warmup_steps
        self.peaks = [group["lr"] for group in optimizer.param_groups]  # each group's configured rate
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=config.lr_factor, patience=config.lr_patience, min_lr=config.min_lr
        )

    def before_step(self, step: int) -> None:
        """Set the rate of optimizer step ``step`` (0-based): warming up, or left as the plateaus made it."""
        if step < self.warmup_steps:
            for group, peak in zip(self.optimizer.param_groups, self.peaks):
                group["lr"] = peak * (step + 1) / self.warmup_steps

    def after_validation(self, score: float, step: int) -> None:
        """A validation ``score`` (higher is better) after ``step`` optimizer steps."""
        if step >= self.warmup_steps:
            self.plateau.step(score)

    def state_dict(self) -> dict[str, Any]:
        return self.plateau.state_dict()  # the warm-up needs only the step count, which the run's progress keeps

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau.load_state_dict(state)
