"""The optimiser's learning-rate schedule: an optional linear warm-up, then halving on plateaus.

A Transformer's first updates are large and noisy (Adam's second-moment estimates start from nothing),
so its learning rate usually climbs linearly from lr / warmup_steps to lr over the first
``train.warmup_steps`` optimizer steps (Vaswani et al. 2017; Popel and Bojar 2018). After that, as for
the RNN recipes, the rate is multiplied by ``train.lr_factor`` after ``train.lr_patience`` validations
without improvement. Validations during the warm-up do not count towards a plateau.

A parameter group may carry ``frozen_steps`` (a pre-trained text encoder held still at first,
``text_encoder.frozen_steps``): its rate is 0 for those steps, then what the schedule gives the others.
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
        """Set the rate of optimizer step ``step`` (0-based): warming up, or left as the plateaus made it; 0 for a
        group still frozen, and on the step it thaws the share of its peak that the other groups have now."""
        groups = self.optimizer.param_groups
        if step < self.warmup_steps:
            for group, peak in zip(groups, self.peaks):
                group["lr"] = peak * (step + 1) / self.warmup_steps
        training = [(group, peak) for group, peak in zip(groups, self.peaks) if group.get("frozen_steps", 0) < step or not group.get("frozen_steps")]  # before this step
        share = training[0][0]["lr"] / training[0][1] if training else 1.0  # the plateaus have cut every training group alike
        for group, peak in zip(groups, self.peaks):
            frozen = group.get("frozen_steps", 0)
            if step < frozen:
                group["lr"] = 0.0
            elif step == frozen > 0 and step >= self.warmup_steps:
                group["lr"] = peak * share

    def after_validation(self, score: float, step: int) -> None:
        """A validation ``score`` (higher is better) after ``step`` optimizer steps."""
        if step >= self.warmup_steps:
            self.plateau.step(score)

    def state_dict(self) -> dict[str, Any]:
        return self.plateau.state_dict()  # the warm-up needs only the step count, which the run's progress keeps

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau.load_state_dict(state)
