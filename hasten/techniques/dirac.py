"""Dirac (identity) initialisation of 3x3 convolutions (Zagoruyko & Komodakis, "DiracNets", 2017; the init of
Keller Jordan's airbench CIFAR-10 speed records): in every 3x3 Conv2d with at least as many output as input
channels, the first in_channels filters start as the identity (torch.nn.init.dirac_: filter i passes input
channel i through its centre tap) and their biases, if any, at 0; the other filters keep their default init.
Each such conv starts as a pass-through of its input plus fresh features, so a deep plain stack starts close to
a shallow one, as residual connections make it.

Grouped convs are left alone (an identity per group is another init). `model.init=dirac`; on a model without
such convs nothing changes and a note says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hasten.progress import say
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def dirac_init(model: nn.Module) -> list[str]:
    """Identity-initialise the first in_channels filters of every ungrouped 3x3 Conv2d of `model` with
    out_channels >= in_channels (biases of those filters 0); returns the names of the convs changed."""
    changed = []
    for name, conv in model.named_modules():
        if not isinstance(conv, nn.Conv2d) or conv.kernel_size != (3, 3) or conv.groups != 1:
            continue
        if conv.out_channels < conv.in_channels:
            continue
        with torch.no_grad():
            nn.init.dirac_(conv.weight[: conv.in_channels])
            if conv.bias is not None:
                conv.bias[: conv.in_channels].zero_()
        changed.append(name)
    return changed


class DiracInit(Technique):
    """Model hook (`model.init=dirac`): Dirac-initialises the model's 3x3 convs once it is built, before
    pretrained weights (which then win)."""

    name, hooks, order = "dirac_init", frozenset({"on_model"}), 1
    switches = (Switch("model.init", "default", "dirac", "3x3 convs start as the identity on their input channels"),)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> DiracInit | None:
        return cls() if recipe.model.init == "dirac" else None

    def on_model(self, model: nn.Module) -> None:
        if not dirac_init(model):
            say("model.init=dirac: the model has no ungrouped 3x3 Conv2d with out >= in channels; nothing set")
