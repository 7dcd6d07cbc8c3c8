"""The loss every run trains on: cross entropy against soft targets (probabilities), so label smoothing, mixup
and cutmix compose in any order on the targets and one loss serves them all."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hasten.errors import HastenError, RecipeError, their_error


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    return torch.nn.functional.one_hot(labels, num_classes).float()


def soft_cross_entropy(logits: Tensor, y_soft: Tensor) -> Tensor:
    """Mean cross entropy against probability targets; equals F.cross_entropy for one-hot targets."""
    return -(y_soft * logits.float().log_softmax(1)).sum(1).mean()


class UserLoss:
    """The user's `loss(logits, soft_targets)` (`hasten.train(..., loss=fn)`), checked at every call: what it
    raises is theirs (a RecipeError naming the loss and where in their code), and what it returns must be one
    floating-point number computed from the logits. Otherwise the backward pass would stop with torch's "grad can
    be implicitly created only for scalar outputs" or "does not require grad", naming neither the loss nor what it
    returned. The checks read only a tensor's shape, type and flags: no synchronisation with the device."""

    def __init__(self, loss: Callable[[Tensor, Tensor], Tensor]):
        self.loss = loss
        self.name = getattr(loss, "__qualname__", None) or type(loss).__name__

    def __call__(self, logits: Tensor, y_soft: Tensor) -> Tensor:
        shapes = f"logits of shape {tuple(logits.shape)}, soft targets of shape {tuple(y_soft.shape)}"
        called = f"loss: your loss {self.name}({shapes})"
        try:
            value = self.loss(logits, y_soft)
        except (HastenError, MemoryError, torch.OutOfMemoryError):
            raise
        except Exception as error:  # noqa: BLE001 - whatever their loss raises is theirs to see
            raise RecipeError(f"{called} raised {their_error(error)}") from None
        if not isinstance(value, Tensor):
            problem = (f"returned {type(value).__name__}; it must return a tensor of one number computed from the "
                       "logits (e.g. the .mean() of per-example losses)")  # fmt: skip
        elif value.numel() != 1:
            problem = "it must return one number, a 0-dim tensor: reduce it over the batch (e.g. .mean())"
        elif not value.dtype.is_floating_point:
            problem = "it must be floating-point (an integer has no gradient)"
        elif torch.is_grad_enabled() and not value.requires_grad:
            problem = ("it has no gradient: compute it from the logits (not from .detach(), .item() or numpy, nor "
                       "under torch.no_grad())")  # fmt: skip
        else:
            return value.reshape(())
        if isinstance(value, Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            problem = f"returned a {dtype} tensor of shape {tuple(value.shape)}; {problem}"
        raise RecipeError(f"{called} {problem}")
