"""The evaluation over a test loader, one loop for the training run's evaluations (hasten/run/trainer.py) and for
`hasten evaluate` (hasten/use/evaluate.py): a run re-evaluated computes its numbers op for op as the run did, so its
accuracy equals summary.json's `test_accuracy` bitwise, and a change to how a run evaluates reaches both at once.

Per batch: the forward passes of each asked test-time augmentation setting, in the order given, under the run's
precision autocast (hasten/techniques/tta.py `tta_views`: float logits with the augmentation, and of the plain view
that comes on the way); then, outside autocast, the summed cross-entropy, the correct predictions with and without
the augmentation and the image count, added batch by batch on the device (float32 and int64). The model is
evaluated in eval mode and left in the mode it was in; on a CPU, a copy with its batch norms folded into the
convolutions before them is what runs (hasten.engine.norms.folded_for_inference: the same function, one
memory-bound pass less per layer, its 2x2 max-pools without torch's indices; made once per model, the model's
current weights written into it at each evaluation, bitwise as a fresh fold). The sums are this process's: a
data-parallel run reduces them over its ranks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from hasten.engine.distributed import all_reduce_max, all_reduce_sum
from hasten.engine.norms import folded_for_inference
from hasten.engine.precision import Precision
from hasten.techniques.tta import black_fill, tta_views


@dataclass
class Measured:
    """One test-time augmentation setting's results over a loader, on this process."""

    loss_sum: Tensor  # summed cross-entropy of the augmented logits (float32, on the device)
    correct: Tensor  # correct predictions with the augmentation (int64, on the device)
    plain_correct: Tensor  # correct predictions of the plain view alone (int64, on the device)
    # ... and over the first `head` batches alone, with their images (the live weights' check compares on them)
    head_plain_correct: Tensor
    count: int = 0  # images
    head_count: int = 0
    # each class's least and greatest augmented logit over the images (float32, on the device; None before the
    # first batch): a class whose two are equal got the same output for every image (`constant_outputs`)
    low: Tensor | None = None
    high: Tensor | None = None
    # with `keep_predictions`: each batch's augmented logits and labels, on the CPU (top-k, confusion matrix)
    logits: list[Tensor] = field(default_factory=list)
    labels: list[Tensor] = field(default_factory=list)


@torch.no_grad()
def evaluate_loader(
    model: nn.Module,
    loader: Any,
    precision: Precision,
    settings: Sequence[tuple[bool, int]],
    device: torch.device,
    *,
    keep_predictions: bool = False,
    advance: Callable[[], None] | None = None,
    batches: int | None = None,
    head: int = 0,
) -> list[Measured]:
    """`model` over every batch of `loader` (an InMemoryLoader or ImageFolderLoader: normalised images and class
    labels, and the normalisation's `mean` and `std` that a shifted view's edge needs) with each (flip, translate
    pixels) test-time augmentation setting of `settings`; one `Measured` per setting, in their order. `advance` is
    called after each batch (a progress line). `batches`: only the loader's first that many (None: all); `head`:
    the plain view's correct predictions over the first that many batches are kept apart too (`head_plain_correct`,
    `head_count`), so a later pass with `batches=head` compares on the same images."""
    results = [
        Measured(
            loss_sum=torch.zeros((), device=device),
            correct=torch.zeros((), device=device, dtype=torch.long),
            plain_correct=torch.zeros((), device=device, dtype=torch.long),
            head_plain_correct=torch.zeros((), device=device, dtype=torch.long),
        )
        for _ in settings
    ]
    shifted = any(translate for _, translate in settings)
    fill = black_fill(loader.mean, loader.std) if shifted else 0.0  # what training's translate pads
    was_training = model.training
    model.eval()
    evaluated = folded_for_inference(model) if device.type == "cpu" else model  # batch norm folded into the convs
    for batch, (images, labels) in enumerate(loader if batches is None else itertools.islice(loader, batches)):
        with precision.autocast():
            outputs = [tta_views(evaluated, images, flip, translate, fill) for flip, translate in settings]
        kept_labels = labels.cpu() if keep_predictions else labels
        for result, (logits, plain) in zip(results, outputs, strict=True):
            result.loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
            result.correct += (logits.argmax(1) == labels).sum()
            plain_correct = (plain.argmax(1) == labels).sum()
            result.plain_correct += plain_correct
            result.count += len(labels)
            low, high = logits.detach().float().aminmax(dim=0)
            result.low = low if result.low is None else torch.minimum(result.low, low)
            result.high = high if result.high is None else torch.maximum(result.high, high)
            if batch < head:
                result.head_plain_correct += plain_correct
                result.head_count += len(labels)
            if keep_predictions:
                result.logits.append(logits.cpu())
                result.labels.append(kept_labels)
        if advance is not None:
            advance()
    model.train(was_training)
    return results


class Measurement(NamedTuple):
    """An evaluation's results over the ranks: mean loss, accuracy with its test-time augmentation, the plain
    view's accuracy, the images, and the plain view's (accuracy, images) over the first batches asked for."""

    loss: float
    accuracy: float
    plain_accuracy: float
    count: int
    head: tuple[float, int] | None
    own: Measured  # this process's results before the reduction, for one a caller asks for (`constant_outputs`)


def measure(
    model: nn.Module,
    loader: Any,
    precision: Precision,
    device: torch.device,
    setting: tuple[bool, int],
    advance: Callable[[], None] | None = None,
    batches: int | None = None,
    head: int = 0,
) -> Measurement:
    """`evaluate_loader` with one (flip, translate) setting, its sums reduced over the ranks."""
    (measured,) = evaluate_loader(model, loader, precision, [setting], device, advance=advance, batches=batches,
                                  head=head)  # fmt: skip
    sums = [measured.loss_sum.item(), measured.correct.item(), measured.plain_correct.item(), measured.count,
            measured.head_plain_correct.item(), measured.head_count]  # fmt: skip
    loss, correct, plain, count, head_correct, head_count = all_reduce_sum(sums, device)
    seen = max(count, 1)
    kept = (head_correct / head_count, int(head_count)) if head_count else None
    return Measurement(loss / seen, correct / seen, plain / seen, int(count), kept, measured)


# a class's output the same for every one of at least this many test images is said to be constant: a ReLU after a
# model's classifier that stopped at 0 for that class gives exactly 0 for every image, where a live unit's output, a
# float computed from each image, differs between any two that differ
CONSTANT_MIN_IMAGES = 20


def constant_outputs(measured: Measured, device: torch.device) -> tuple[tuple[int, float], ...]:
    """(class, its output) for each class whose logit was the same for every image `measured` saw on every rank
    (every rank calls the same collectives, one that saw no image too); empty under CONSTANT_MIN_IMAGES images, where
    a few alike images could give one output by themselves."""
    own = 0 if measured.low is None else len(measured.low)
    classes, images = all_reduce_max([float(own)], device)[0], all_reduce_sum([float(measured.count)], device)[0]
    classes = int(classes)
    if classes == 0:
        return ()
    inf = float("inf")
    high = measured.high.tolist() if own else [-inf] * classes
    low = measured.low.tolist() if own else [inf] * classes
    highs = all_reduce_max(high, device)
    lows = [-value for value in all_reduce_max([-value for value in low], device)]
    if images < CONSTANT_MIN_IMAGES:
        return ()
    return tuple((c, lows[c]) for c in range(classes) if lows[c] == highs[c])


# The live weights' check at a run's end (hasten/run/trainer.py `compare_live`): the test images it evaluates, the
# first in the test set's order. Paired with the evaluated copy's plain view of the same images, a lag of LAG stands
# out of their difference's noise (about 0.4 points at 2,048 images where the two disagree on 3% of them);
# fashion-fast's check took all 10,000 test images before, 0.48 s of its 5.6 s of evaluation on a Zen 4, now 0.12 s.
LIVE_CHECK_IMAGES = 2048
LAG = 0.02


def check_batches(loader: Any) -> int:
    """The test batches the live weights' check sees on this process: its share of LIVE_CHECK_IMAGES."""
    share = -(-LIVE_CHECK_IMAGES // max(1, loader.world_size))
    return max(1, -(-share // loader.batch_size))


def lag_warning(evaluated: float, live: float, images: int) -> str | None:
    """The warning when the evaluated copy (an EMA) scores more than LAG under the live weights on the plain view
    of the same `images` test images, which a working average never does; None otherwise."""
    if evaluated >= live - LAG:
        return None
    return (
        f"the evaluated weight average scores {evaluated:.2%}, the live weights {live:.2%} (each on the plain view "
        f"of the same {images:,} test images): the average lags this run (shorten it with a lower tricks.ema, or "
        "set tricks.ema=0)"
    )
