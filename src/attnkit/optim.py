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
        # Read now, from the groups as this run's config made them: a resumed optimizer's state brings the saved ones back.
        self.frozen = [group.get("frozen_steps", 0) for group in optimizer.param_groups]
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=config.lr_factor, patience=config.lr_patience, min_lr=config.min_lr
        )

    def before_step(self, step: int) -> None:
        """Set the rate of optimizer step ``step`` (0-based): warming up, or left as the plateaus made it; 0 for a
        group still frozen, and once it thaws the share of its peak that the other groups have then."""
        groups = self.optimizer.param_groups
        if step < self.warmup_steps:
            for group, peak in zip(groups, self.peaks):
                group["lr"] = peak * (step + 1) / self.warmup_steps
        moving = [(group, peak) for group, peak, frozen in zip(groups, self.peaks, self.frozen) if step >= frozen and group["lr"] > 0]
        share = moving[0][0]["lr"] / moving[0][1] if moving else 1.0  # the warm-up and the plateaus move every group alike
        for group, peak, frozen in zip(groups, self.peaks, self.frozen):
            if step < frozen:
                group["lr"] = 0.0
            elif group["lr"] == 0.0:  # thawing (or resumed with fewer frozen steps than the rate was set for)
                group["lr"] = peak * share

    def after_validation(self, score: float, step: int) -> None:
        """A validation ``score`` (higher is better) after ``step`` optimizer steps."""
        if step >= self.warmup_steps:
            self.plateau.step(score)

    def state_dict(self) -> dict[str, Any]:
        return self.plateau.state_dict()  # the warm-up needs only the step count, which the run's progress keeps

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau.load_state_dict(state)
