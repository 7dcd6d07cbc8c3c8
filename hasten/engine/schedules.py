"""Learning-rate (and momentum) schedules as pure functions of training progress, and the LR scaling rule.

Every schedule is a function `progress in [0, 1] -> multiplier of the peak LR`, stateless, composed from
small pieces: a linear warmup placed before any of them, then

- constant;
- step decay: the LR multiplied by `gamma` at each milestone (He et al., 2016; Goyal et al., 2017);
- cosine annealing down to a floor (Loshchilov & Hutter, "SGDR", 2017);
- linear decay from the peak down to a floor, 0 by default ("linear-to-zero"; Defazio et al., "When, Why and
  How Much? Adaptive Learning Rate Scheduling by Refinement", 2023, find it matches or beats cosine);
- cyclic LR between a lower bound and the peak, modes triangular, triangular2, exp_range (Smith, "Cyclical
  Learning Rates for Training Neural Networks", 2017);
- one-cycle: up from `start` to the peak, then down to `end`, linear or cosine in each phase, with momentum
  (Adam-style optimizers: beta1) cycled the opposite way (Smith & Topin, "Super-Convergence", 2018).
  With `anneal: linear` this is the triangular schedule of the CIFAR-10 speed records (Page's ResNet-9,
  airbench: the LR rises linearly from `start` x peak to the peak at `peak` of the run, then falls linearly to
  `end` x peak), so it has no name of its own; set `schedule.momentum: null` for their fixed momentum.

`Scheduler` turns them into a per-optimizer-step object: the trainer calls `.step()` once per optimizer step
actually taken, it sets each param group's LR (and momentum), and its checkpoint state is only the step.

The linear scaling rule (Goyal et al., "Accurate, Large Minibatch SGD", 2017): `optim.lr` is given per
`optim.base_batch` examples and scaled to the global batch, linearly or by its square root.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hasten.errors import RecipeError
from hasten.recipe.schema import ScheduleConfig

Shape = Callable[[float], float]


def linear(t: float, start: float, end: float) -> float:
    """From `start` at t=0 to `end` at t=1, in a straight line (written to be exact at both ends)."""
    return (1 - t) * start + t * end


def cosine_between(t: float, start: float, end: float) -> float:
    """From `start` at t=0 to `end` at t=1 along half a cosine (flat at both ends)."""
    w = 0.5 * (1 - math.cos(math.pi * t))
    return (1 - w) * start + w * end


def constant(progress: float) -> float:
    return 1.0


def step_decay(progress: float, milestones: Sequence[float] = (0.5, 0.75), gamma: float = 0.1) -> float:
    """`gamma` to the power of the number of milestones (fractions of the run) already reached."""
    return gamma ** sum(progress >= m for m in milestones)


def cosine(progress: float, floor: float = 0.0) -> float:
    """Cosine annealing (Loshchilov & Hutter, 2017) from 1 down to `floor`."""
    return cosine_between(progress, 1.0, floor)


def linear_decay(progress: float, floor: float = 0.0) -> float:
    """From 1 down to `floor` in a straight line ("linear-to-zero" with the default floor)."""
    return linear(progress, 1.0, floor)


def cyclic(progress: float, cycles: int = 4, low: float = 0.1, mode: str = "triangular", gamma: float = 1.0) -> float:
    """Cyclical LR (Smith, 2017): `cycles` triangles between `low` and the peak over the run.

    Each cycle rises from `low` to its top at its middle and falls back. The top is the peak for
    `triangular`, halves every cycle for `triangular2`, and for `exp_range` the amplitude is multiplied by
    `gamma` per cycle, continuously (Smith's gamma is per iteration: per-cycle gamma = gamma_iter ** cycle_steps).
    """
    position = progress * cycles
    index = min(int(position), cycles - 1)  # the cycle this step is in; progress 1 ends the last cycle
    t = position - index  # where in that cycle, in [0, 1]
    triangle = 1 - abs(2 * t - 1)  # 0 -> 1 -> 0
    if mode == "triangular":
        amplitude = 1.0
    elif mode == "triangular2":
        amplitude = 0.5**index
    elif mode == "exp_range":
        amplitude = gamma**position
    else:
        raise ValueError(f"unknown cyclic mode {mode!r}")
    return low + (1 - low) * amplitude * triangle


def one_cycle(
    progress: float, peak: float = 0.25, start: float = 0.04, end: float = 0.0, anneal: str = "linear"
) -> float:
    """One-cycle (Smith & Topin, 2018): `start` -> 1 at `peak`, then 1 -> `end`; each phase linear or cosine."""
    shape = linear if anneal == "linear" else cosine_between
    if progress < peak:
        return shape(progress / peak, start, 1.0)
    return shape((progress - peak) / (1 - peak), 1.0, end)


def one_cycle_momentum(
    progress: float, peak: float = 0.25, low: float = 0.85, high: float = 0.95, anneal: str = "linear"
) -> float:
    """One-cycle momentum, opposite to the LR: `high` -> `low` while the LR rises, back to `high` as it falls."""
    shape = linear if anneal == "linear" else cosine_between
    if progress < peak:
        return shape(progress / peak, high, low)
    return shape((progress - peak) / (1 - peak), low, high)


def inverse_momentum(lr_multiplier: float, floor: float, low: float, high: float) -> float:
    """Momentum opposite to an LR that moves between `floor` and 1: `high` at the floor, `low` at the peak.

    Smith (2017) cycles momentum this way under cyclic LR; it is what torch's CyclicLR does too.
    """
    t = (lr_multiplier - floor) / (1 - floor) if floor < 1 else 0.0
    return linear(min(max(t, 0.0), 1.0), high, low)


def warmup_then(progress: float, warmup: float, after: Shape) -> float:
    """Linear warmup from 0 over the first `warmup` of the run up to where `after` starts, then `after` over
    the rest, rescaled to [0, 1]. Warming up to `after(0)` keeps the composition continuous (a one-cycle
    starts below the peak)."""
    if progress < warmup:
        return progress / warmup * after(0.0)
    return after((progress - warmup) / (1 - warmup))


def shape(config: ScheduleConfig) -> Shape:
    """The schedule's shape without warmup: progress in [0, 1] -> LR multiplier."""
    c = config
    if c.name == "step":
        return lambda p: step_decay(p, c.milestones, c.gamma)
    if c.name == "cosine":
        return lambda p: cosine(p, c.floor)
    if c.name == "linear":
        return lambda p: linear_decay(p, c.floor)
    if c.name == "cyclic":
        return lambda p: cyclic(p, c.cycles, c.low, c.mode, c.gamma)
    if c.name == "one-cycle":
        return lambda p: one_cycle(p, c.peak, c.start, c.end, c.anneal)
    return constant


def momentum_shape(config: ScheduleConfig) -> Shape | None:
    """Momentum (beta1) as a function of the schedule's progress, for schedules that cycle it; else None."""
    c = config
    if c.momentum is None or c.name not in ("one-cycle", "cyclic"):
        return None
    low, high = c.momentum
    if c.name == "one-cycle":
        return lambda p: one_cycle_momentum(p, c.peak, low, high, c.anneal)
    return lambda p: inverse_momentum(cyclic(p, c.cycles, c.low, c.mode, c.gamma), c.low, low, high)


def warmup_steps(config: ScheduleConfig, total_steps: int) -> int:
    """`schedule.warmup` in optimizer steps: a fraction of the run (< 1) or a step count (>= 1).

    A warmup as long as the run or longer is a RecipeError naming the field: the LR would never reach its peak.
    """
    w = config.warmup
    steps = round(w * total_steps) if w < 1 else int(w)
    if steps >= total_steps > 0:
        raise RecipeError(
            f"schedule.warmup: {w:g} means {steps} warmup steps, but the whole run is {total_steps} optimizer "
            "steps; give a fraction of the run below 1 or fewer steps"
        )
    return steps


def asked_rise_steps(config: ScheduleConfig, lr_scale: float = 1.0) -> int:
    """The optimizer steps the LR should take to rise to its peak: `schedule.min_warmup_steps`, times the factor
    the scaling rule multiplied the LR by when that is above 1 (Goyal et al., 2017 pair the linear rule with a
    gradual warmup; a larger global batch means a larger peak to approach)."""
    if config.min_warmup_steps == "auto":  # decided from the data's classes before a run builds its schedule
        raise ValueError("schedule.min_warmup_steps=auto is decided from the data (run/resolve.resolve_for_data)")
    return round(config.min_warmup_steps * max(1.0, lr_scale))


def rise_steps(config: ScheduleConfig, total_steps: int, lr_scale: float = 1.0) -> int:
    """The fewest optimizer steps the LR may take to rise to its peak: `asked_rise_steps`, at most half the run."""
    return min(total_steps // 2, asked_rise_steps(config, lr_scale))


def lr_and_momentum(config: ScheduleConfig, total_steps: int, lr_scale: float = 1.0) -> tuple[Shape, Shape | None]:
    """The recipe's LR multiplier and momentum (None: not scheduled) as functions of progress in [0, 1].

    The LR rises over at least `rise_steps` steps: one-cycle's rising phase is lengthened to it, other schedules
    get a linear warmup of at least that long. `lr_scale`: what the batch-size rule multiplied the LR by."""
    floor = rise_steps(config, total_steps, lr_scale) / max(total_steps, 1)
    rises = config.name == "one-cycle" and config.start < 1  # one starting at its peak has no rise of its own
    if rises and floor > config.peak:
        config = config.model_copy(update={"peak": floor})
    lr, momentum = shape(config), momentum_shape(config)
    warmup = warmup_steps(config, total_steps) / max(total_steps, 1)
    if not rises:  # the other schedules (and a one-cycle from its peak) get a warm-up of at least `floor`
        warmup = max(warmup, floor)
    if warmup > 0:
        lr_after, momentum_after = lr, momentum
        lr = lambda p: warmup_then(p, warmup, lr_after)  # noqa: E731
        if momentum_after is not None:
            # during warmup the momentum holds the value the schedule starts with
            momentum = lambda p: momentum_after(max(p - warmup, 0.0) / (1 - warmup))  # noqa: E731
    return lr, momentum


def set_momentum(group: dict[str, Any], value: float) -> None:
    """Momentum for SGD-style groups, beta1 for Adam-style ones; none for a group that keeps its own
    (`fixed_momentum`: Muon's filters, hasten/engine/optimizers.py)."""
    if group.get("fixed_momentum"):
        return
    if "betas" in group:
        group["betas"] = (value, group["betas"][1])
    elif "momentum" in group:
        group["momentum"] = value


class Scheduler:
    """Sets each param group's LR (and momentum) from the schedule at the current optimizer step.

    Call `step()` once per optimizer step actually taken (a step skipped for inf/NaN gradients does not move
    the schedule). The LR of a group is its `initial_lr` times the multiplier; `initial_lr` is kept in the
    param group, as torch's schedulers do, so it survives an optimizer state_dict round trip. The state is only
    the step.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr: Shape,
        total_steps: int,
        momentum: Shape | None = None,
    ):
        self.optimizer, self.lr, self.momentum, self.total_steps = optimizer, lr, momentum, max(total_steps, 1)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.last_step = 0
        self._apply()

    @property
    def progress(self) -> float:
        return min(self.last_step / self.total_steps, 1.0)

    def _apply(self) -> None:
        multiplier = self.lr(self.progress)
        momentum = self.momentum(self.progress) if self.momentum is not None else None
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * multiplier
            if momentum is not None:
                set_momentum(group, momentum)

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def retarget(self, lr: Shape, momentum: Shape | None, total_steps: int) -> None:
        """The same run at another length (hasten/run/extension.py): the shapes over `total_steps`, from the step
        it is at."""
        self.lr, self.momentum, self.total_steps = lr, momentum, max(total_steps, 1)
        self._apply()

    def state_dict(self) -> dict[str, int]:
        return {"step": self.last_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.last_step = int(state["step"])
        self._apply()


def scheduler(
    optimizer: torch.optim.Optimizer, config: ScheduleConfig, total_steps: int, lr_scale: float = 1.0
) -> Scheduler:
    """The recipe's schedule over `total_steps` optimizer steps, driving `optimizer`."""
    lr, momentum = lr_and_momentum(config, total_steps, lr_scale)
    return Scheduler(optimizer, lr, total_steps, momentum)


def trace(config: ScheduleConfig, total_steps: int, lr_scale: float = 1.0) -> tuple[list[float], list[float] | None]:
    """The LR multiplier and the momentum (None when not scheduled) at every optimizer step of the run."""
    lr, momentum = lr_and_momentum(config, total_steps, lr_scale)
    steps = range(total_steps + 1)
    lrs = [lr(min(s / max(total_steps, 1), 1.0)) for s in steps]
    momenta = None if momentum is None else [momentum(min(s / max(total_steps, 1), 1.0)) for s in steps]
    return lrs, momenta


def scale_lr(lr: float, base_batch: int | None, global_batch: int, rule: str = "linear") -> float:
    """`lr` given per `base_batch` examples, scaled to `global_batch` (Goyal et al., 2017: linear; or sqrt).

    `base_batch=None` means no scaling: `lr` is used as it is.
    """
    if base_batch is None:
        return lr
    ratio = global_batch / base_batch
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))
