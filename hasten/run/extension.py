"""A run still at chance when its LR's hold ends gets the hold again: `train.epochs: auto`'s budget, doubled once.

The default's schedule holds the peak LR for the first half of the run, then falls to zero. Some models learn only
after a long plateau at the loss of a uniform guess (a ConvNeXt-like net whose residual branches start at a layer
scale of 1e-6: 1,200 images of letters sat at chance for 1,000 of its 2,025 steps at every LR tried; twice the
epochs from the start took the same seed from 19% to 60%, docs/defaults.md). Decaying the LR then ends the run at
chance. So at the last epoch end before the decay begins, a run whose epochs the rule chose, and whose *training*
accuracy over that epoch is still at chance (the test set never decides it), doubles its epochs: the hold lasts
until the old end, then the decay; the same schedule as a run given twice the epochs from the start. Once per run;
said at the time, recorded in recipe.yaml (train.epochs) and in summary.json (`extended`). A run whose epochs were
given, or whose schedule does not hold its peak, is never lengthened: it ends with the late-learning or at-chance
warning and its advice instead (hasten/run/verdicts.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hasten.recipe.sections import ScheduleConfig
from hasten.run.verdicts import at_chance, barely_moved, chance_line, chance_of

FACTOR = 2  # the run's length after it: the hold again, then the decay over as many steps


def holds_peak(schedule: ScheduleConfig) -> bool:
    """A schedule that holds its peak LR for the first part of the run (a one-cycle from its peak, the default's):
    the one a run can be lengthened in without changing what it has done."""
    return schedule.name == "one-cycle" and schedule.start >= 1


def check_epoch(hold: float, epochs: int) -> int:
    """The epoch after which the check is made: the last one that ends before the LR starts to fall."""
    return max(1, math.floor(hold * epochs))


@dataclass
class Extension:
    """When and how a run is lengthened. `hold`: the fraction of the run the LR holds its peak (the one-cycle's
    `peak`); `apply(epochs)` rebuilds the schedule over that many epochs and records them (hasten/run/build.py)."""

    hold: float
    apply: Callable[[int], None]

    def check_epoch(self, epochs: int) -> int:
        return check_epoch(self.hold, epochs)

    def decide(self, epoch: int, epochs: int, train_accuracy: float, num_classes: int, chance: float | None = None
               ) -> dict[str, float] | None:  # fmt: skip
        """The record of a lengthening ({at_epoch, from, to, train_accuracy, chance_line}) when the epoch just
        ended is the check's and the training accuracy is at chance (`chance`: the training images' largest
        class's share, hasten/run/verdicts.py); None otherwise."""
        if epoch != self.check_epoch(epochs) or epoch >= epochs or not at_chance(train_accuracy, num_classes, chance):
            return None
        return {"at_epoch": epoch, "from": epochs, "to": FACTOR * epochs, "train_accuracy": train_accuracy,
                "chance_line": chance_line(chance_of(num_classes, chance))}  # fmt: skip


class _Plan(Protocol):  # hasten.run.plan.Plan, which holds an Extension (so not imported here)
    epochs: int
    num_classes: int
    extension: Extension | None
    train_chance: float | None


class _State(Protocol):  # hasten.run.state.State
    epoch: int
    extended: dict[str, float] | None


def due(plan: _Plan, state: _State, train_accuracy: float) -> dict[str, float] | None:
    """After an epoch: the record of the lengthening due now (`Extension.decide`), None when the plan has none, the
    run was lengthened already or the check says no. Nothing is changed."""
    if plan.extension is None or state.extended is not None:
        return None
    return plan.extension.decide(state.epoch, plan.epochs, train_accuracy, plan.num_classes, plan.train_chance)


def lengthened(plan: _Plan, state: _State, train_accuracy: float) -> dict[str, float] | None:
    """After an epoch: lengthen the run when one is `due` (the plan's epochs, the state's record and the schedule
    changed); the record, or None."""
    record = due(plan, state, train_accuracy)
    if record is not None:
        state.extended, plan.epochs = record, int(record["to"])
        plan.extension.apply(plan.epochs)
    return record


def stuck(plan: _Plan, state: _State, row: dict[str, float]) -> bool:
    """After an epoch (`row`: its train_loss and train_accuracy): whether a lengthening is `due` with the training
    loss still within STUCK_TRAIN_LOSS of a uniform guess's (hasten/run/verdicts.py, barely_moved): a run that has
    barely moved in half its steps gets its plan's restart (hasten/run/restart.py), where it has one, instead of a
    longer hold."""
    return barely_moved(row["train_loss"], plan.num_classes) and due(plan, state, row["train_accuracy"]) is not None


def extension_note(record: dict[str, float]) -> str:
    """What the run says when it lengthens itself."""
    return (
        f"train.epochs=auto -> {record['to']:g}: after epoch {record['at_epoch']:g} of {record['from']:g}, where the "
        f"LR's hold ends, the training accuracy is {record['train_accuracy']:.1%}, at chance (under "
        f"{record['chance_line']:.1%}): the model has not started to learn, so the peak LR holds on and the run "
        f"goes to {record['to']:g} epochs (once; recipe.yaml records it; a given train.epochs is never changed)"
    )
