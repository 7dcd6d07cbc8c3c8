"""Where a run stands (`State`): what a checkpoint's `trainer` section holds besides the objects' own state_dicts,
so a resumed run continues exactly as if never stopped; each rank's own part of a checkpoint; and the loading of a
training checkpoint into the run's objects, with the checks it passes before the loop trusts it (every section's
types, its position's counts, its optimizer state's shapes, its precision, its number of processes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError
from torch import Tensor, nn

from hasten.engine.distributed import rank, unwrap, world_size
from hasten.engine.precision import Precision
from hasten.engine.schedules import Scheduler
from hasten.errors import CheckpointError
from hasten.progress import say
from hasten.run.plan import Hooks
from hasten.runfolder.checkpoint import load_model_weights, rng_state, training_checkpoint


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
    # the run lengthened itself at the end of its LR's hold (hasten/run/extension.py): when, from, to, why
    extended: dict[str, float] | None = None
    # ... or shortened itself, its training images fitting while the LR held its peak: when, from, to
    shortened: dict[str, float] | None = None
    # the first epoch whose training accuracy was off chance (hasten/run/extension.py); None: none yet
    learnt_from: int | None = None
    # the start this run replaced because its outputs collapsed (hasten/run/build.py): when, the losses, the settings
    restarted: dict[str, Any] | None = None


def wall_time_to_accuracy(curve: Sequence[Sequence[float]], thresholds: Sequence[str]) -> dict[str, float | None]:
    """For each threshold ("0.93"), the wall seconds of the first evaluation at or above it in `curve` (points
    [train_seconds, step, accuracy, wall_seconds]); None where none reached it (or the point has no wall time)."""
    result: dict[str, float | None] = {}
    for key in thresholds:
        reached = next((point for point in curve if point[2] >= float(key)), None)
        result[key] = reached[3] if reached is not None and len(reached) > 3 else None
    return result


OF_BEST = (0.5, 0.75, 0.9, 0.95, 0.99)  # fractions of a run's best accuracy it records the time to


def time_to_fraction_of_best(
    curve: Sequence[Sequence[float]], fractions: Sequence[float] = OF_BEST
) -> dict[str, dict[str, float | None]]:
    """Milestones that fit any data: for each fraction of the best accuracy on `curve` (points [train_seconds,
    step, accuracy, wall_seconds]), the accuracy it stands for and the training and wall seconds of the first
    evaluation at or above it ("0.90": {"accuracy": 0.667, "train_seconds": 12.1, "wall_seconds": 20.3}). A run at
    74% reaches none of the fixed 90-94% thresholds, and every one of these. Empty for an empty curve."""
    best = max((point[2] for point in curve), default=0.0)
    if best <= 0:
        return {}
    found: dict[str, dict[str, float | None]] = {}
    for fraction in fractions:
        target = fraction * best
        point = next(p for p in curve if p[2] >= target)  # the best is on the curve: one reaches it
        wall = point[3] if len(point) > 3 else None
        found[f"{fraction:.2f}"] = {"accuracy": round(target, 6), "train_seconds": point[0], "wall_seconds": wall}
    return found


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


def rank_state(state: State, hooks: Hooks) -> dict[str, Any]:
    """What differs per rank: RNG streams, rank-local hooks (the mixing generator), the epoch's running sums."""
    s = state
    return {
        "rng": rng_state(),
        "hooks": {name: hooks.stateful[name].state_dict() for name in sorted(hooks.rank_local)},
        "epoch_sums": {"epoch_loss_sum": s.epoch_loss_sum, "epoch_correct": s.epoch_correct,
                       "epoch_seen": s.epoch_seen, "epoch_seconds": s.epoch_seconds},
    }  # fmt: skip


def restore(
    checkpoint: dict[str, Any],
    source: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler | torch.optim.lr_scheduler.LRScheduler,
    precision: Precision,
    hooks: Hooks,
) -> tuple[State, dict[str, Any]]:
    """The run's objects loaded from a training checkpoint (hasten.run.trainer.Trainer.state_dict), each section's
    types checked before any is used; returns the loop's position, with this rank's epoch sums, and this rank's part
    of the checkpoint (its RNG streams, which the caller sets last). CheckpointError naming `source` when it does not
    fit."""
    missing = [k for k in ("model", "optimizer", "scheduler", "trainer") if k not in checkpoint]
    if "ranks" not in checkpoint and "rng" not in checkpoint:
        missing.append("ranks")
    if missing:
        raise CheckpointError(f"{source} is not a hasten training checkpoint: it lacks {', '.join(missing)}")
    training_checkpoint(checkpoint, source)  # every section of the types the trainer writes, before any is used
    trainer_position(checkpoint["trainer"], source)  # its types, before anything is loaded
    mine = own_rank_state(checkpoint, source)
    load_model_weights(unwrap(model), checkpoint["model"], source)
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
        check_optimizer_state(optimizer, source)
        scheduler.load_state_dict(checkpoint["scheduler"])
        load_precision(precision, checkpoint, source)
        for name, hook in hooks.stateful.items():
            saved = checkpoint.get("hooks", {}) | mine.get("hooks", {})
            if name not in saved:
                raise CheckpointError(f"{source} has no state for {name} (was it trained with another recipe?)")
            hook.load_state_dict(saved[name])
    except (ValueError, KeyError, RuntimeError) as error:
        raise CheckpointError(f"{source} does not fit this run's optimizer or schedule: {error}") from None
    return trainer_position(dict(checkpoint["trainer"]) | mine.get("epoch_sums", {}), source), mine


def load_precision(precision: Precision, checkpoint: dict[str, Any], source: str) -> None:
    """The loss scaler's (or fp32 masters') state; another precision's state is named as such."""
    try:
        precision.load_state_dict(checkpoint.get("precision") or {})
    except (KeyError, ValueError, TypeError, RuntimeError) as error:
        recipe = checkpoint.get("recipe") if isinstance(checkpoint.get("recipe"), dict) else {}
        saved = recipe.get("precision", "another precision")
        raise CheckpointError(
            f"{source} was trained with precision={saved}; its precision state does not fit "
            f"precision={precision.name} ({type(error).__name__}: {error}): resume with precision={saved}"
        ) from None


def own_rank_state(checkpoint: dict[str, Any], source: str) -> dict[str, Any]:
    """This rank's part of a checkpoint. Another number of processes may resume from an epoch's end (each
    rank then takes the state of rank r mod the old count), never from mid-epoch: the shards would change."""
    ranks = checkpoint.get("ranks") or [{"rng": checkpoint["rng"], "hooks": {}}]  # format 1: one process
    here, saved = world_size(), len(ranks)
    if saved != here:
        if checkpoint["trainer"].get("batch", 0):
            raise CheckpointError(
                f"{source} was written mid-epoch by {saved} process(es) and this run has {here}: resume it with "
                f"--devices {saved}, or from a checkpoint taken at the end of an epoch"
            )
        if rank() == 0:
            say(f"{source}: written by {saved} process(es), resumed with {here}")
    return ranks[rank() % saved]
