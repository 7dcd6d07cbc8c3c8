"""The loss every run trains on: cross entropy against soft targets (probabilities), so label smoothing, mixup
and cutmix compose in any order on the targets and one loss serves them all."""

from __future__ import annotations

import torch
from torch import Tensor


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    return torch.nn.functional.one_hot(labels, num_classes).float()


def soft_cross_entropy(logits: Tensor, y_soft: Tensor) -> Tensor:
    """Mean cross entropy against probability targets; equals F.cross_entropy for one-hot targets."""
    return -(y_soft * logits.float().log_softmax(1)).sum(1).mean()
