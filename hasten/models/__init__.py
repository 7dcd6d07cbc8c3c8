"""Models built from the recipe's `model` section."""

from __future__ import annotations

from torch import nn

from hasten.models.resnet import Residual, ResNet
from hasten.models.sequential import build_sequential
from hasten.models.user import own_model
from hasten.recipe.schema import ModelConfig
from hasten.recipe.trust import USER_SOURCES

__all__ = ["ResNet", "Residual", "build_model", "build_sequential"]


def build_model(config: ModelConfig, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model the recipe describes, for images of `input_shape` (C, H, W) and `num_classes` classes, as
    initialised by torch (`model.zero_init_residual` is a technique: hasten.techniques.zero_init, applied by build)."""
    if config.name in USER_SOURCES:  # the user's own (hasten/models/user.py): model.target called with model.args
        return own_model(config, None, input_shape, num_classes)
    if config.name == "sequential":
        return build_sequential(config.layers or [], input_shape, num_classes)
    return ResNet(input_shape[0], num_classes, width=config.width, blocks=config.blocks, widths=config.widths)
