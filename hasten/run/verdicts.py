"""What a finished run's accuracy says about it, in words the user reads at its end: at chance (the model did not
learn), or at chance late into the run (it learnt, late). Pure functions over the run's numbers; the trainer
(hasten/run/trainer.py) says them, the generalization suite's report reads `learnt_late` too."""

from __future__ import annotations

from collections.abc import Sequence

# a run at chance at its budget is advised this many times its epochs: a GroupNorm CNN of the model suite stayed at
# chance on a letters folder at the default's 8 epochs at every LR tried (0.0007-0.02) and reached 55.5% at 30
LONGER = 4
# a run whose test accuracy stayed at chance for at least this share of its steps before it learnt is told so, and
# advised LATE_LONGER times its epochs: the GroupNorm CNN of the model suite sat at chance for about 12 of its 27
# epochs on one seed of the scenes and ended at 32.5% where its other seeds reached 56.5 and 64.8%; on the letters
# such a seed went from 34.0% at 32 epochs to 66.5% at 60 (docs/defaults.md)
LATE_SHARE = 1 / 3
LATE_LONGER = 2


CHANCE_SHARE = 0.1  # an accuracy below chance + this share of (1 - chance) is at chance


def chance_line(chance: float) -> float:
    """The accuracy under which a run is at chance, for a chance accuracy `chance` (1 / classes when balanced)."""
    return chance + CHANCE_SHARE * (1 - chance)


def at_chance(accuracy: float, num_classes: int) -> bool:
    """Below `chance_line` of 1 / classes: what the end-of-run warning calls chance level."""
    return accuracy < chance_line(1 / num_classes)


def learnt_late(curve: Sequence[Sequence[float]], num_classes: int) -> tuple[int, int] | None:
    """(the step of the last evaluation at chance, the run's last step) when a run was at chance as late as
    LATE_SHARE of its steps and ended off it; None otherwise (a run that ended at chance is the end-of-run check's).
    The last evaluation at chance, not the first off it: on a small test set an accuracy near the line crosses it
    and back. `curve`: the run's evaluations, [training seconds, step, test accuracy, wall seconds]."""
    if len(curve) < 2 or at_chance(curve[-1][2], num_classes):
        return None
    waited = [point for point in curve if at_chance(point[2], num_classes)]
    if not waited:
        return None
    until, total = int(waited[-1][1]), int(curve[-1][1])
    return (until, total) if total > 0 and until >= LATE_SHARE * total else None


def at_chance_warning(
    accuracy: float, num_classes: int, epochs: int, advice: Sequence[str], train_accuracy: float | None = None
) -> str | None:
    """The end-of-run warning for an accuracy at chance, with what to try: `advice` (the plan's divergence
    advice), a longer run first when it names no epochs (a model that learns slowly is not helped by any LR).
    Where the training accuracy (`train_accuracy`, the last epoch's) is off chance, the model did learn, the
    training images only: the warning says so, and what helps there instead."""
    if not at_chance(accuracy, num_classes):
        return None
    chance = f"test accuracy {accuracy:.2%} is at chance level ({1 / num_classes:.2%} for {num_classes} classes)"
    if train_accuracy is not None and not at_chance(train_accuracy, num_classes):
        return (
            f"{chance} while the training accuracy is {train_accuracy:.2%}: the model learns the training images, but "
            "what it learns does not carry over to the test images; check that they are alike (classes, sizes, "
            "colours), and try a model that generalises better (convolutions, pooling), stronger augmentation "
            "(data.augment.translate=4) or more data"
        )
    tries = list(advice)
    if not any(item.startswith("train.epochs=") for item in tries):
        tries.insert(0, f"train.epochs={LONGER * epochs}")
    return (
        f"{chance}: the model did not learn; see the training loss per epoch in metrics.csv, and try {', '.join(tries)}"
    )


def late_warning(curve: Sequence[Sequence[float]], num_classes: int, epochs: int) -> str | None:
    """The end-of-run warning for a run that learnt late (`learnt_late`), with a longer run to try."""
    late = learnt_late(curve, num_classes)
    if late is None:
        return None
    until, total = late
    return (
        f"the test accuracy was at chance level until step {until:,} of {total:,} ({until / total:.0%} of the run) "
        f"before the model learnt: a longer run may end higher; try train.epochs={LATE_LONGER * epochs}"
    )
