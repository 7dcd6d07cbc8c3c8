"""Where a run stands (`State`): what a checkpoint's `trainer` section holds besides the objects' own state_dicts,
so a resumed run continues exactly as if never stopped; and the checks a loaded checkpoint passes before the loop
trusts it (its position's types and counts, its optimizer state's shapes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError
from torch import Tensor

from hasten.errors import CheckpointError


@dataclass
class State:
    """Where the run is; what a checkpoint needs besides the objects' own state_dicts."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches completed in the current epoch
    step: int = 0  # optimizer steps taken
    skipped_steps: int = 0
    train_seconds: float = 0.0
    time_to_accuracy: dict[str, float | None] = field(default_factory=dict)
    best_accuracy: float = 0.0
    nonfinite_steps: int = 0  # steps skipped for a non-finite loss (train.on_nan=skip)
    # the current epoch's running sums, so a run resumed mid-epoch reports the same epoch metrics
    epoch_loss_sum: float = 0.0
    epoch_correct: int = 0
    epoch_seen: int = 0
    epoch_seconds: float = 0.0
    best_checkpoint: str | None = None  # file name of the checkpoint with the best test accuracy
    warnings: list[str] = field(default_factory=list)  # what looked wrong (divergence, chance accuracy), in order
    last_row: dict[str, Any] = field(default_factory=dict)  # the last epoch's metrics: a finished run's summary
    # every evaluation, mid-epoch ones (Plan.eval_every_steps) too: [train_seconds, step, test_accuracy, wall_seconds]
    accuracy_curve: list[list[float]] = field(default_factory=list)
    wall_seconds: float = 0.0  # the run's wall-clock seconds when this state was saved (a resume goes on from it)
    eval_seconds: float = 0.0  # of those, the seconds spent evaluating


def wall_time_to_accuracy(curve: Sequence[Sequence[float]], thresholds: Sequence[str]) -> dict[str, float | None]:
    """For each threshold ("0.93"), the wall seconds of the first evaluation at or above it in `curve` (points
    [train_seconds, step, accuracy, wall_seconds]); None where none reached it (or the point has no wall time)."""
    result: dict[str, float | None] = {}
    for key in thresholds:
        reached = next((point for point in curve if point[2] >= float(key)), None)
        result[key] = reached[3] if reached is not None and len(reached) > 3 else None
    return result


_POSITION = TypeAdapter(State)  # a checkpoint's `trainer` section, checked against State's field types


def trainer_position(saved: Any, source: str) -> State:
    """The loop's position stored in a checkpoint as a State, its fields of State's types and its counts not
    negative; CheckpointError naming `source` and the field otherwise."""
    try:
        position = _POSITION.validate_python(dict(saved) if isinstance(saved, dict) else saved)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise CheckpointError(f"{source}: trainer.{field}: {first['msg']} (got {first.get('input')!r})") from None
    counts = ("epoch", "batch", "step", "skipped_steps", "nonfinite_steps", "epoch_seen")
    negative = [name for name in counts if getattr(position, name) < 0]
    clocks = [name for name in ("train_seconds", "wall_seconds")
              if not (math.isfinite(getattr(position, name)) and getattr(position, name) >= 0)]  # fmt: skip
    if negative or clocks:
        name = (negative + clocks)[0]
        raise CheckpointError(f"{source}: trainer.{name}: {getattr(position, name)!r} is not a count of the run")
    return position


def check_optimizer_state(optimizer: torch.optim.Optimizer, source: str) -> None:
    """After loading a checkpoint's optimizer state: each per-parameter tensor (momentum, Adam's moments) has as
    many elements as its parameter (Muon keeps filters' momentum flattened), so a mismatch is named now rather than
    failing inside the first step."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for name, value in optimizer.state.get(param, {}).items():
                if isinstance(value, Tensor) and value.dim() > 0 and value.numel() != param.numel():
                    raise CheckpointError(
                        f"{source}: optimizer state {name!r} of shape {tuple(value.shape)} does not fit its parameter "
                        f"of shape {tuple(param.shape)}"
                    )
