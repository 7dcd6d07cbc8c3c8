"""`train.epochs: auto`'s budget, changed once during the run by what the training shows: a run still at chance
when its LR's hold ends gets the hold again (doubled), and a run that already fits its training images ends the
hold early (shortened).

The default's schedule holds the peak LR for the first half of the run, then falls to zero. Some models learn only
after a long plateau at the loss of a uniform guess (a ConvNeXt-like net whose residual branches start at a layer
scale of 1e-6: 1,200 images of letters sat at chance for 1,000 of its 2,025 steps at every LR tried; twice the
epochs from the start took the same seed from 19% to 60%, docs/defaults.md). Decaying the LR then ends the run at
chance. So at the last epoch end before the decay begins, a run whose epochs the rule chose, and whose *training*
accuracy over that epoch is still at chance (the test set never decides it), or was at chance for most of the
hold's epochs before it left (more than LATE of them), doubles its epochs: the hold lasts until the old end, then
the decay; the same schedule as a run given twice the epochs from the start. Once per run; said at the time,
recorded in recipe.yaml (train.epochs) and in summary.json (`extended`). A run whose epochs were given, or whose
schedule does not hold its peak, is never lengthened: it ends with the late-learning or at-chance warning and its
advice instead (hasten/run/verdicts.py).

The budget is sized for the small sets that need it (600 steps; a 400-image set at batch 16 gets 40 epochs), and on
an easy set most of it is spent holding the peak LR over training images the model already gets right: 400 rendered
digits were at 100% training accuracy from epoch 7 of 40 and at their final test accuracy by epoch 10. So during the
hold, a run whose training accuracy (running over the epoch, on the augmented images) has stayed at FIT or above for
FIT_EPOCHS epochs in a row ends the hold at that epoch and decays over as many epochs again: the schedule of a run
given twice those epochs from the start (with the default's hold of half the run), which a resume rebuilds bitwise.
The training images decide it, as the lengthening; never the test set. It is asked for (`train.end_early=true`),
not the default: on sets that fit early it took 1.3-2.4x less time at the same accuracy, but on 300 letters (30 a
class) it cost 1.5-4 points, and on 200 glyphs (20 a class), which fit by epoch 13-15 of 60 and whose test accuracy
rose 8-15 points after it, 4-7 points; so even when asked, a set so small that 60 epochs hold fewer steps than the
budget keeps them all (docs/defaults.md, "Ending the hold early").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hasten.recipe.sections import ScheduleConfig
from hasten.run.verdicts import at_chance, barely_moved, chance_line, chance_of

FACTOR = 2  # the run's length after it: the hold again, then the decay over as many steps
LATE = 0.5  # a run at chance for more than this share of the hold's epochs before it left is lengthened too
FIT = 0.99  # training accuracy (running, augmented) at or above which the model fits its training images ...
FIT_EPOCHS = 3  # ... for this many epochs in a row, during the hold, to end the hold early


def holds_peak(schedule: ScheduleConfig) -> bool:
    """A schedule that holds its peak LR for the first part of the run (a one-cycle from its peak, the default's):
    the one a run can be lengthened in without changing what it has done."""
    return schedule.name == "one-cycle" and schedule.start >= 1


def late_from(check: int) -> int:
    """The first epoch off chance that is late for a hold whose check follows epoch `check`: the epochs wholly at
    chance before it are more than LATE of the hold's (may be past `check`: then only a run still at chance is)."""
    return math.floor(LATE * check) + 2


def check_epoch(hold: float, epochs: int) -> int:
    """The epoch after which the check is made: the last one that ends before the LR starts to fall."""
    return max(1, math.floor(hold * epochs))


@dataclass
class Extension:
    """When and how a run is lengthened. `hold`: the fraction of the run the LR holds its peak (the one-cycle's
    `peak`); `apply(epochs)` rebuilds the schedule over that many epochs and records them (hasten/run/build.py)."""

    hold: float
    apply: Callable[[int], None]
    end_early: bool = False  # train.end_early: the hold may end early once the training images fit (`shorten`)
    fits: list[float] = field(default_factory=list)  # the training accuracy of each epoch this process ran

    def check_epoch(self, epochs: int) -> int:
        return check_epoch(self.hold, epochs)

    def decide(self, epoch: int, epochs: int, train_accuracy: float, num_classes: int, chance: float | None = None,
               learnt_from: int | None = None) -> dict[str, float] | None:  # fmt: skip
        """The record of a lengthening ({at_epoch, from, to, train_accuracy, chance_line, learnt_from}) when the
        epoch just ended is the check's and the training accuracy is at chance (`chance`: the training images'
        largest class's share, hasten/run/verdicts.py), or left chance only late in the hold: the epochs before its
        first off chance (`learnt_from`; this one where none before was) are more than LATE of the hold's. Such a run
        has far to go, as one still at chance has, and the decay would end it short (a GroupNorm CNN's seed on the
        letters, first off chance at epoch 12 of the 13 its LR held: 60.0% at 27 epochs, 88.75% lengthened;
        docs/defaults.md). None otherwise."""
        check = self.check_epoch(epochs)
        if epoch != check or epoch >= epochs:
            return None
        still = at_chance(train_accuracy, num_classes, chance)
        first = None if still else (learnt_from if learnt_from is not None else epoch)
        if not still and first < late_from(check):  # the epochs wholly at chance: more than LATE of the hold's
            return None
        record = {"at_epoch": epoch, "from": epochs, "to": FACTOR * epochs, "train_accuracy": train_accuracy,
                  "chance_line": chance_line(chance_of(num_classes, chance))}  # fmt: skip
        return record if still else record | {"learnt_from": first}

    def shorten(self, epoch: int, epochs: int, train_accuracy: float) -> dict[str, float] | None:
        """Given each epoch's training accuracy in turn: the record of a shortening ({at_epoch, from, to,
        train_accuracy: the least of the fitting epochs'}) when the last FIT_EPOCHS epochs were at FIT or above
        while the LR still holds its peak, and the hold ended here leaves a shorter run; None otherwise."""
        self.fits.append(train_accuracy)
        last = self.fits[-FIT_EPOCHS:]
        if not self.end_early or len(last) < FIT_EPOCHS or min(last) < FIT or epoch >= self.check_epoch(epochs):
            return None
        to = math.ceil(epoch / self.hold - 1e-9)  # the hold is `hold` of the run: it ends now, the decay follows
        if to >= epochs:
            return None
        return {"at_epoch": epoch, "from": epochs, "to": to, "train_accuracy": min(last)}


class _Plan(Protocol):  # hasten.run.plan.Plan, which holds an Extension (so not imported here)
    epochs: int
    num_classes: int
    extension: Extension | None
    train_chance: float | None


class _State(Protocol):  # hasten.run.state.State
    epoch: int
    extended: dict[str, float] | None
    shortened: dict[str, float] | None
    learnt_from: int | None


def due(plan: _Plan, state: _State, train_accuracy: float) -> dict[str, float] | None:
    """After an epoch: the record of the lengthening due now (`Extension.decide`), None when the plan has none, the
    run was lengthened already or the check says no. Nothing is changed."""
    if plan.extension is None or state.extended is not None:
        return None
    return plan.extension.decide(state.epoch, plan.epochs, train_accuracy, plan.num_classes, plan.train_chance,
                                 state.learnt_from)  # fmt: skip


def note_learning(plan: _Plan, state: _State, train_accuracy: float) -> None:
    """After an epoch: the first epoch whose training accuracy is off chance, kept in the state (a resumed run
    decides as the run it continues)."""
    if state.learnt_from is None and not at_chance(train_accuracy, plan.num_classes, plan.train_chance):
        state.learnt_from = state.epoch


def lengthened(plan: _Plan, state: _State, train_accuracy: float) -> dict[str, float] | None:
    """After an epoch: lengthen the run when one is `due` (the plan's epochs, the state's record and the schedule
    changed); the record, or None."""
    record = due(plan, state, train_accuracy)
    if record is not None:
        state.extended, plan.epochs = record, int(record["to"])
        plan.extension.apply(plan.epochs)
    return record


def replanned(plan: _Plan, state: _State, train_accuracy: float) -> str | None:
    """After an epoch: lengthen the run (`lengthened`) or shorten it (`Extension.shorten`) when one is due, once per
    run; what the run says of it, or None."""
    record = lengthened(plan, state, train_accuracy)
    note_learning(plan, state, train_accuracy)
    if record is not None:
        return extension_note(record)
    if plan.extension is None or state.extended is not None or state.shortened is not None:
        return None
    if (record := plan.extension.shorten(state.epoch, plan.epochs, train_accuracy)) is None:
        return None
    state.shortened, plan.epochs = record, int(record["to"])
    plan.extension.apply(plan.epochs)
    return shortening_note(record)


def stuck(plan: _Plan, state: _State, row: dict[str, float]) -> bool:
    """After an epoch (`row`: its train_loss and train_accuracy): whether a lengthening is `due` with the training
    accuracy at chance and the training loss still within STUCK_TRAIN_LOSS of a uniform guess's
    (hasten/run/verdicts.py, barely_moved): a run that has barely moved in half its steps gets its plan's restart
    (hasten/run/restart.py), where it has one, instead of a longer hold. One that left chance late is lengthened."""
    accuracy, classes = row["train_accuracy"], plan.num_classes
    unmoved = barely_moved(row["train_loss"], classes) and at_chance(accuracy, classes, plan.train_chance)
    return unmoved and due(plan, state, accuracy) is not None


def extension_note(record: dict[str, float]) -> str:
    """What the run says when it lengthens itself."""
    first = record.get("learnt_from")
    if first is None:
        seen = (f"the training accuracy is {record['train_accuracy']:.1%}, at chance (under "
                f"{record['chance_line']:.1%}): the model has not started to learn")  # fmt: skip
    else:
        seen = (f"the training accuracy is {record['train_accuracy']:.1%}, and left chance (over "
                f"{record['chance_line']:.1%}) only at epoch {first:g}: the model has barely started to "
                "learn")  # fmt: skip
    return (
        f"train.epochs=auto -> {record['to']:g}: after epoch {record['at_epoch']:g} of {record['from']:g}, where the "
        f"LR's hold ends, {seen}, so the peak LR holds on and the run goes to {record['to']:g} epochs (once; "
        "recipe.yaml records it; a given train.epochs is never changed)"
    )


def shortening_note(record: dict[str, float]) -> str:
    """What the run says when it shortens itself."""
    at, to = int(record["at_epoch"]), int(record["to"])
    return (
        f"train.epochs=auto -> {to}: the training accuracy was {FIT:.0%} or more in epochs {at - FIT_EPOCHS + 1}-{at} "
        f"(at least {record['train_accuracy']:.1%}) while the LR held its peak: the model fits its training images, "
        f"so the hold ends after epoch {at} and the LR falls over the next {to - at}, as in a run given {to} epochs "
        f"from the start (train.end_early; once; recipe.yaml records it; the plan was {record['from']:g})"
    )
