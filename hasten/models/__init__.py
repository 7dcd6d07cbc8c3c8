"""Models built from the recipe's `model` section."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hasten.errors import HastenError
from hasten.models.resnet import Residual, ResNet
from hasten.models.sequential import build_sequential
from hasten.models.user import own_model
from hasten.recipe.schema import ModelConfig
from hasten.recipe.trust import USER_SOURCES

__all__ = ["ResNet", "Residual", "build_model", "build_sequential", "meta_parameter_count"]


def build_model(config: ModelConfig, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model the recipe describes, for images of `input_shape` (C, H, W) and `num_classes` classes, as
    initialised by torch (`model.zero_init_residual` is a technique: hasten.techniques.zero_init, applied by build)."""
    if config.name in USER_SOURCES:  # the user's own (hasten/models/user.py): model.target called with model.args
        return own_model(config, None, input_shape, num_classes)
    if config.name == "sequential":
        return build_sequential(config.layers or [], input_shape, num_classes)
    return ResNet(
        input_shape[0],
        num_classes,
        width=config.width,
        blocks=config.blocks,
        widths=config.widths,
        pool_first=config.pool_first,
    )


def meta_parameter_count(
    config: ModelConfig, input_shape: tuple[int, ...], num_classes: int, build: Callable[..., nn.Module] | None = None
) -> int | None:
    """The parameter count of hasten's own model for `config` (resnet, sequential), built with `build` (default:
    build_model) on the meta device, which holds shapes and no data: what sizes a model before any of it is
    allocated, for training (against the machine's memory) and for a model rebuilt from a file (against the file's
    weights). None for a user's model, or where the meta build fails (the real build then says why); a
    HastenError (a layer list hasten refuses) is raised as it is."""
    if config.name not in ("resnet", "sequential"):
        return None
    try:
        with torch.device("meta"):
            shell = (build or build_model)(config, tuple(input_shape), num_classes)
    except HastenError:
        raise
    except Exception:  # noqa: BLE001 - whatever fails here fails in the real build too, which says it
        return None
    return sum(p.numel() for p in shell.parameters())
