"""Zero-init of the last BN gamma in each residual block (Goyal et al., 2017; He et al., "Bag of Tricks",
2019): every residual branch starts as the identity, so the network starts shallow and trains stably at
large learning rates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from hasten.models.resnet import zero_init_residual
from hasten.progress import say
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


class ZeroInitResidual(Technique):
    """Model hook (`model.zero_init_residual`): zero-inits the residual blocks' last BN gammas once the model is
    built, before pretrained weights (which then win). Needs residual blocks ending in BN (hasten's ResNet
    `Residual`); on a model without them it changes nothing and says so."""

    name, hooks, order = "zero_init_residual", frozenset({"on_model"}), 0
    switches = (Switch("model.zero_init_residual", "false", "true", "each residual block's last BN scale starts at 0"),)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> ZeroInitResidual | None:
        return cls() if recipe.model.zero_init_residual else None

    def on_model(self, model: nn.Module) -> None:
        if not zero_init_residual(model):
            say("model.zero_init_residual: the model has no residual blocks ending in BN; nothing zeroed")
