"""Learning-rate schedules as pure functions of training progress in [0, 1] -> multiplier of the peak LR.

Stateless, so a checkpoint only needs the step; plugged into torch.optim.lr_scheduler.LambdaLR, stepped once
per optimizer step that was actually taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from hasten.config import ScheduleConfig


def linear(progress: float, start: float, end: float) -> float:
    return start + (end - start) * progress


def cosine(progress: float, floor: float = 0.0) -> float:
    """Cosine annealing (Loshchilov & Hutter, 2017) from 1 down to `floor`."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_then(progress: float, warmup: float, after: Callable[[float], float]) -> float:
    """Linear warmup from 0 over the first `warmup` of the run, then `after` over the rest (rescaled to [0, 1])."""
    if progress < warmup:
        return progress / warmup
    return after((progress - warmup) / (1 - warmup) if warmup < 1 else 1.0)


def one_cycle(progress: float, peak: float = 0.25, start: float = 0.04, end: float = 0.0) -> float:
    """One-cycle (Smith & Topin, 2018), piecewise linear: `start` -> 1 at `peak`, then down to `end`."""
    if progress < peak:
        return linear(progress / peak, start, 1.0)
    return linear((progress - peak) / (1 - peak), 1.0, end)


def multiplier(config: ScheduleConfig) -> Callable[[float], float]:
    """The recipe's schedule as a function progress -> LR multiplier."""
    if config.name == "one-cycle":
        shape = lambda p: one_cycle(p, config.peak, config.start, config.end)  # noqa: E731
    elif config.name == "cosine":
        shape = lambda p: cosine(p, config.floor)  # noqa: E731
    else:
        shape = lambda p: 1.0  # noqa: E731
    if config.warmup > 0:
        return lambda p: warmup_then(p, config.warmup, shape)
    return shape


def lr_scheduler(
    optimizer: torch.optim.Optimizer, config: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `total_steps` optimizer steps following the recipe's schedule."""
    shape = multiplier(config)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: shape(min(step / max(total_steps, 1), 1.0)))
