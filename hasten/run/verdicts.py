"""What a finished run's accuracy says about it, in words the user reads at its end: at chance (the model did not
learn), or at chance late into the run (it learnt, late). Pure functions over the run's numbers; the trainer
(hasten/run/trainer.py) says them, the generalization suite's report reads `learnt_late` too.

Chance is the accuracy of the best constant guess: the largest class's share of the images judged (`chance`,
`majority_share`), 1 / classes when they are balanced. On a test set that is 80% one class, a model that always
says that class scores 80%: at chance, and said so, not a good number."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

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


def majority_share(labels: Tensor | None) -> float | None:
    """The largest class's share of `labels` (the accuracy of always guessing it); None without labels."""
    if labels is None or len(labels) == 0:
        return None
    return float(torch.bincount(labels.flatten().long()).max()) / len(labels)


BALANCED = 1.05  # a largest class's share within this factor of 1 / classes: balanced, chance is 1 / classes


def chance_of(num_classes: int, chance: float | None = None) -> float:
    """The chance accuracy: `chance` (the images' `majority_share`) where one class stands out, else 1 / classes."""
    return chance if chance is not None and chance > BALANCED / num_classes else 1 / num_classes


def at_chance(accuracy: float, num_classes: int, chance: float | None = None) -> bool:
    """Below `chance_line` of the chance accuracy: what the end-of-run warning calls chance level."""
    return accuracy < chance_line(chance_of(num_classes, chance))


def describe_chance(num_classes: int, chance: float | None = None) -> str:
    """`10.00% for 10 classes`, or for images mostly of one class `62.00%, the largest class's share of them`."""
    if chance_of(num_classes, chance) == 1 / num_classes:  # balanced, or nearly
        return f"{1 / num_classes:.2%} for {num_classes} classes"
    return f"{chance:.2%}, the largest class's share of them: always guessing it scores that"


def learnt_late(
    curve: Sequence[Sequence[float]], num_classes: int, chance: float | None = None
) -> tuple[int, int] | None:
    """(the step of the last evaluation at chance, the run's last step) when a run was at chance as late as
    LATE_SHARE of its steps and ended off it; None otherwise (a run that ended at chance is the end-of-run check's).
    The last evaluation at chance, not the first off it: on a small test set an accuracy near the line crosses it
    and back. `curve`: the run's evaluations, [training seconds, step, test accuracy, wall seconds]."""
    if len(curve) < 2 or at_chance(curve[-1][2], num_classes, chance):
        return None
    waited = [point for point in curve if at_chance(point[2], num_classes, chance)]
    if not waited:
        return None
    until, total = int(waited[-1][1]), int(curve[-1][1])
    return (until, total) if total > 0 and until >= LATE_SHARE * total else None


# the test loss of a model whose outputs are the same for every test image and class: ln(classes), exactly up to
# float32's rounding of the mean (a SqueezeNet-like net whose ReLU after the classifier stopped at 0 everywhere gave
# ln(10) + 3.6e-7 at every epoch, where the same net alive at chance was 2e-6 to 5e-4 away from it and moved each epoch)
UNIFORM_TEST_LOSS = 1e-5
SAME_TEST_LOSS = 1e-7  # ... and one evaluation to the next: unchanged by a whole epoch of training
# ... and the training loss this close to ln(classes) too: the epoch's for the restart, the last steps' at a run's end
COLLAPSED_TRAIN_LOSS = 1e-3


# A run still at chance where its LR's hold ends whose epoch's training loss is this close to ln(classes) has barely
# moved from a uniform guess in half its steps. Of the earlier suites' runs checked there (every model and dataset), the
# SqueezeNet-like net on the letters at batch 16 (0.0041 under ln(10) at epoch 13 of 27; lengthened, it ended at
# 11.5%) and its variants were within it; every run that learnt after the lengthening was further: a ConvNeXt-like
# net 0.0105-0.0233 under (51-87% at the end), a VGG with lazy layers 0.0069 over (59%), a GroupNorm CNN 0.064 under.
STUCK_TRAIN_LOSS = 5e-3


def barely_moved(train_loss: float, num_classes: int) -> bool:
    """Whether the epoch's training loss is within STUCK_TRAIN_LOSS of ln(C), a uniform guess's loss."""
    return num_classes >= 2 and abs(train_loss - math.log(num_classes)) < STUCK_TRAIN_LOSS


def collapsed_outputs(test_losses: Sequence[float], train_loss: float, num_classes: int) -> bool:
    """Whether the model's outputs collapsed: the last two evaluations' test losses (`test_losses`, oldest first)
    are ln(C) (every test image gets the same output for every class) and the same, and the epoch's training loss
    is within COLLAPSED_TRAIN_LOSS of ln(C). Such a model passes no gradient back (a ReLU or another clamp after its
    classifier at 0 for every image): no longer run mends it; a restart from its first weights may."""
    uniform = math.log(num_classes)
    if num_classes < 2 or len(test_losses) < 2:
        return False
    before, now = test_losses[-2], test_losses[-1]
    return (
        abs(now - uniform) < UNIFORM_TEST_LOSS
        and abs(now - before) < SAME_TEST_LOSS
        and abs(train_loss - uniform) < COLLAPSED_TRAIN_LOSS
    )


def at_chance_warning(
    accuracy: float,
    num_classes: int,
    epochs: int,
    advice: Sequence[str],
    train_accuracy: float | None = None,
    chance: float | None = None,
    train_chance: float | None = None,
    collapsed: str | None = None,
) -> str | None:
    """The end-of-run warning for an accuracy at chance, with what to try: `advice` (the plan's divergence
    advice), a longer run first when it names no epochs (a model that learns slowly is not helped by any LR).
    Where the training accuracy (`train_accuracy`, the last epoch's) is off chance, the model did learn, the
    training images only: the warning says so, and what helps there instead. `chance`, `train_chance`: the
    test and training images' `majority_share`. `collapsed`: what to try first where the training loss ended at a
    uniform guess's (the model's outputs the same for every class: a ReLU at its end dead for all of them), a
    larger batch."""
    if not at_chance(accuracy, num_classes, chance):
        return None
    said = f"test accuracy {accuracy:.2%} is at chance level ({describe_chance(num_classes, chance)})"
    if train_accuracy is not None and not at_chance(train_accuracy, num_classes, train_chance):
        return (
            f"{said} while the training accuracy is {train_accuracy:.2%}: the model learns the training images, but "
            "what it learns does not carry over to the test images; check that they are alike (classes, sizes, "
            "colours), and try a model that generalises better (convolutions, pooling), stronger augmentation "
            "(data.augment.translate=4) or more data"
        )
    tries = list(advice)
    if not any(item.startswith("train.epochs=") for item in tries):
        tries.insert(0, f"train.epochs={LONGER * epochs}")
    if collapsed:
        return (
            f"{said}: the model did not learn: its outputs became the same for every class (the training loss ended "
            f"at ln({num_classes}) = {math.log(num_classes):.3f}, a uniform guess's; a ReLU or another clamp at its "
            f"end stopped at 0 for all of them), which no longer run mends; try {collapsed} first (a larger batch at "
            f"a lower LR steadies the first steps), else {', '.join(tries)}"
        )
    return (
        f"{said}: the model did not learn; see the training loss per epoch in metrics.csv, and try {', '.join(tries)}"
    )


def late_warning(
    curve: Sequence[Sequence[float]], num_classes: int, epochs: int, chance: float | None = None
) -> str | None:
    """The end-of-run warning for a run that learnt late (`learnt_late`), with a longer run to try."""
    late = learnt_late(curve, num_classes, chance)
    if late is None:
        return None
    until, total = late
    return (
        f"the test accuracy was at chance level until step {until:,} of {total:,} ({until / total:.0%} of the run) "
        f"before the model learnt: a longer run may end higher; try train.epochs={LATE_LONGER * epochs}"
    )


def no_gradient(model: nn.Module, warn: Callable[[str], None]) -> list[str]:
    """After a step's backward, before its update: the model's trainable parameters that got no gradient, which
    never train and which no accuracy names; `warn` is told their names (a `.detach()`, `.numpy()` or `.item()` in
    the model's forward cuts them off, or it never uses them) where there are any."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    unreached = [name for name, p in named if p.grad is None]
    if unreached:
        shown = ", ".join(unreached[:3]) + (", ..." if len(unreached) > 3 else "")
        warn(
            f"{len(unreached)} of the model's {len(named)} trainable parameter tensors got no gradient from the loss "
            f"({shown}): they never train; a .detach(), .numpy() or .item() in its forward cuts them off, or it never "
            "uses them (requires_grad=False keeps a part fixed on purpose)"
        )
    return unreached


def some_classes(names: Sequence[str]) -> str:
    """Up to five class names for a warning, quoted: `'b', 'd', ...` past five."""
    return ", ".join(repr(name) for name in names[:5]) + (", ..." if len(names) > 5 else "")


def absent_classes(labels: Tensor, classes: Sequence[str]) -> str | None:
    """The warning for classes no training image holds, which the model never learns to predict; where the one
    absent is label 0 of numbered classes, the labels likely count from 1. None when every class has images."""
    counts = torch.bincount(labels.long(), minlength=len(classes))
    absent = [str(classes[i]) for i in range(len(classes)) if counts[i] == 0]
    if not absent:
        return None
    text = (
        f"{len(absent)} of the {len(classes)} classes have no training images ({some_classes(absent)}): the model "
        "never learns to predict them"
    )
    if absent == [str(classes[0])] and list(classes) == [str(i) for i in range(len(classes))]:
        text += f"; the labels run 1..{len(classes) - 1}: if they count from 1, subtract 1 (labels are 0..K-1)"
    return text


def constant_classes_warning(
    constant: Sequence[tuple[int, float]], num_classes: int, names: Sequence[str] = ()
) -> str | None:
    """The end-of-run warning for classes whose output was the same for every test image (`constant`: (class,
    output) pairs, hasten/run/evaluation.py `constant_outputs`): the model cannot tell their images from any other's.
    A ReLU after a classifier that stopped at 0 for a class does this, and passes that class no gradient again. None
    when there are none, or when every class is constant (the collapse, which the at-chance warning says), or for
    two classes, which one output per image tells apart (a binary classifier's single logit is read as (0, z))."""
    if not constant or len(constant) >= num_classes or num_classes == 2:
        return None
    shown = some_classes([str(names[c]) if c < len(names) else str(c) for c, _ in constant])
    outputs = sorted({value for _, value in constant})
    value = f"{outputs[0]:.4g}" if len(outputs) == 1 else "one value each"
    return (
        f"{len(constant)} of the {num_classes} classes ({shown}) got the same "
        f"output ({value}) for every test image: what the model says of them does not depend on the image. A ReLU "
        "or another clamp after the model's last layer that stopped at 0 for a class passes it no gradient again, so "
        "no longer run mends it: end the model in its last layer, with no activation after it (the loss takes its "
        "outputs as logits)"
    )
