"""The evaluation over a test loader, one loop for the training run's evaluations (hasten/run/trainer.py) and for
`hasten evaluate` (hasten/use/evaluate.py): a run re-evaluated computes its numbers op for op as the run did, so its
accuracy equals summary.json's `test_accuracy` bitwise, and a change to how a run evaluates reaches both at once.

Per batch: the forward passes of each asked test-time augmentation setting, in the order given, under the run's
precision autocast (hasten/techniques/tta.py `tta_views`: float logits with the augmentation, and of the plain view
that comes on the way); then, outside autocast, the summed cross-entropy, the correct predictions with and without
the augmentation and the image count, added batch by batch on the device (float32 and int64). The model is
evaluated in eval mode and left in the mode it was in; on a CPU, a copy with its batch norms folded into the
convolutions before them is what runs (hasten.engine.norms.folded_for_inference: the same function, one
memory-bound pass less per layer). The sums are this process's: a data-parallel run reduces
them over its ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hasten.engine.norms import folded_for_inference
from hasten.engine.precision import Precision
from hasten.techniques.tta import black_fill, tta_views


@dataclass
class Measured:
    """One test-time augmentation setting's results over a loader, on this process."""

    loss_sum: Tensor  # summed cross-entropy of the augmented logits (float32, on the device)
    correct: Tensor  # correct predictions with the augmentation (int64, on the device)
    plain_correct: Tensor  # correct predictions of the plain view alone (int64, on the device)
    count: int = 0  # images
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
) -> list[Measured]:
    """`model` over every batch of `loader` (an InMemoryLoader or ImageFolderLoader: normalised images and class
    labels, and the normalisation's `mean` and `std` that a shifted view's edge needs) with each (flip, translate
    pixels) test-time augmentation setting of `settings`; one `Measured` per setting, in their order. `advance` is
    called after each batch (a progress line)."""
    results = [
        Measured(
            loss_sum=torch.zeros((), device=device),
            correct=torch.zeros((), device=device, dtype=torch.long),
            plain_correct=torch.zeros((), device=device, dtype=torch.long),
        )
        for _ in settings
    ]
    shifted = any(translate for _, translate in settings)
    fill = black_fill(loader.mean, loader.std) if shifted else 0.0  # what training's translate pads
    was_training = model.training
    model.eval()
    evaluated = folded_for_inference(model) if device.type == "cpu" else model  # batch norm folded into the convs
    for images, labels in loader:
        with precision.autocast():
            outputs = [tta_views(evaluated, images, flip, translate, fill) for flip, translate in settings]
        kept_labels = labels.cpu() if keep_predictions else labels
        for result, (logits, plain) in zip(results, outputs, strict=True):
            result.loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
            result.correct += (logits.argmax(1) == labels).sum()
            result.plain_correct += (plain.argmax(1) == labels).sum()
            result.count += len(labels)
            if keep_predictions:
                result.logits.append(logits.cpu())
                result.labels.append(kept_labels)
        if advance is not None:
            advance()
    model.train(was_training)
    return results
