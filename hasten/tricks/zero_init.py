"""Zero-init of the last BN gamma in each residual block (Goyal et al., 2017; He et al., "Bag of Tricks",
2019): every residual branch starts as the identity, so the network starts shallow and trains stably at
large learning rates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from hasten.models.resnet import Residual
from hasten.progress import say
from hasten.tricks.technique import Context, Technique

if TYPE_CHECKING:
    from hasten.config import Recipe


def zero_init_residual(model: nn.Module) -> list[str]:
    """Set the last BN gamma of every residual block to 0; returns the names of the parameters it zeroed (empty:
    the model has none). A residual block is hasten's `Residual` or, in a user's model, any module whose
    `last_bn` is a BatchNorm layer: the norm that ends its residual branch."""
    zeroed = []
    for name, module in model.named_modules():
        last_bn = getattr(module, "last_bn", None)  # the documented hook for a user's residual block
        if isinstance(module, Residual) or isinstance(last_bn, nn.modules.batchnorm._BatchNorm):
            nn.init.zeros_(module.last_bn.weight)
            bn_name = next(n for n, m in module.named_modules() if m is module.last_bn)
            zeroed.append(f"{name}.{bn_name}.weight")
    return zeroed


class ZeroInitResidual(Technique):
    """Model hook (`model.zero_init_residual`): zero-inits the residual blocks' last BN gammas once the model is
    built, before pretrained weights (which then win). Needs residual blocks ending in BN (hasten's ResNet
    `Residual`); on a model without them it changes nothing and says so."""

    name, hooks, order = "zero_init_residual", frozenset({"on_model"}), 0

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> ZeroInitResidual | None:
        return cls() if recipe.model.zero_init_residual else None

    def on_model(self, model: nn.Module) -> None:
        if not zero_init_residual(model):
            say("model.zero_init_residual: the model has no residual blocks ending in BN; nothing zeroed")
