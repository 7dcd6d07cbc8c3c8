"""Batch-norm settings for every BatchNorm layer of any model (`model.bn_momentum`, `model.bn_eps`,
`model.bn_weight`), as the CIFAR-10 speed records tune them: Page's ResNet-9 ("How to train your ResNet",
2018) and Keller Jordan's airbench freeze the BN scales at 1 and train only the shifts ("bias-only affine"),
which removes a scale that the following layer's weights can absorb anyway, and airbench runs its statistics
with a faster momentum than torch's 0.1 for its short runs.

`bn_momentum` follows torch's convention: running = (1 - momentum) * running + momentum * batch. Frozen scales
are set to 1 and get requires_grad=False, so they stay out of the optimizer (no update, no weight decay); with
`model.pretrained` the loaded scales replace the 1s and stay frozen. Frozen scales together with
`model.zero_init_residual` are a recipe error (a scale frozen at 0 switches its branch off for ever).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hasten.engine.norms import is_batch_norm
from hasten.progress import say
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def set_batch_norm(model: nn.Module, momentum: float | None, eps: float | None, freeze_weight: bool) -> list[str]:
    """Apply the settings to every `_BatchNorm` layer of `model` (None: leave that setting); returns the names of
    the layers. Layers without an affine scale only get the momentum and eps."""
    names = []
    for name, bn in model.named_modules():
        if not is_batch_norm(bn):
            continue
        if momentum is not None:
            bn.momentum = momentum
        if eps is not None:
            bn.eps = eps
        if freeze_weight and bn.weight is not None:
            with torch.no_grad():
                bn.weight.fill_(1.0)
            bn.weight.requires_grad_(False)
        names.append(name)
    return names


class BatchNormSettings(Technique):
    """Model hook: applies the recipe's BN settings once the model is built; on a model without batch norm it
    changes nothing and says so."""

    name, hooks, order = "batch_norm_settings", frozenset({"on_model"}), 2
    switches = (
        Switch("model.bn_weight", "learn", "frozen", "BN scales fixed at 1, only the shifts train"),
        Switch("model.bn_momentum", "null", "0.4", "every BN layer's running-statistics momentum (torch's: 0.1)"),
        Switch("model.bn_eps", "null", "0.001", "every BN layer's eps (torch's: 1e-5)"),
    )

    def __init__(self, momentum: float | None, eps: float | None, freeze_weight: bool):
        self.momentum, self.eps, self.freeze_weight = momentum, eps, freeze_weight

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> BatchNormSettings | None:
        cfg = recipe.model
        if cfg.bn_momentum is None and cfg.bn_eps is None and cfg.bn_weight == "learn":
            return None
        return cls(cfg.bn_momentum, cfg.bn_eps, cfg.bn_weight == "frozen")

    def on_model(self, model: nn.Module) -> None:
        if not set_batch_norm(model, self.momentum, self.eps, self.freeze_weight):
            say("model.bn_*: the model has no BatchNorm layer; nothing set")
