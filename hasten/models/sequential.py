"""A CNN built from a layer list in the recipe, Keras-style, so a tutorial model is a few lines of YAML.

    layers: [{conv: 32}, relu, {maxpool: 2}, flatten, {dense: 128}, relu, {dense: classes}]

Each item is a layer name (`relu`) or a one-key mapping from the name to its argument: a number, a list of
positional arguments, or a mapping of keyword arguments (`{conv: {out: 32, kernel: 3, padding: 1}}`).
Input sizes are found by passing a dummy batch through the layers as they are built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hasten.errors import RecipeError


def _conv(
    c_in: int, out: int, kernel: int = 3, stride: int = 1, padding: int | str = 0, bias: bool = True
) -> nn.Module:
    return nn.Conv2d(c_in, out, kernel, stride=stride, padding=padding, bias=bias)


def _dense(c_in: int, out: int, bias: bool = True) -> nn.Module:
    return nn.Linear(c_in, out, bias=bias)


# name -> (factory taking the input channels/features first, whether it needs that input size)
LAYERS: dict[str, tuple[Callable[..., nn.Module], bool]] = {
    "conv": (_conv, True),
    "dense": (_dense, True),
    "bn": (lambda c_in: nn.BatchNorm2d(c_in), True),
    "bn1d": (lambda c_in: nn.BatchNorm1d(c_in), True),
    "relu": (lambda: nn.ReLU(inplace=True), False),
    "gelu": (lambda: nn.GELU(), False),
    "celu": (lambda alpha=1.0: nn.CELU(alpha), False),
    "maxpool": (lambda kernel=2, stride=None: nn.MaxPool2d(kernel, stride), False),
    "avgpool": (lambda kernel=2, stride=None: nn.AvgPool2d(kernel, stride), False),
    "global_avgpool": (lambda: nn.AdaptiveAvgPool2d(1), False),
    "flatten": (lambda: nn.Flatten(), False),
    "dropout": (lambda p=0.5: nn.Dropout(p), False),
}


def _parse(item: str | dict[str, Any], index: int) -> tuple[str, list[Any], dict[str, Any]]:
    if isinstance(item, str):
        return item, [], {}
    if isinstance(item, dict) and len(item) == 1:
        ((name, arg),) = item.items()
        if isinstance(arg, dict):
            return name, [], dict(arg)
        if isinstance(arg, list):
            return name, list(arg), {}
        return name, [arg], {}
    raise RecipeError(f"model.layers.{index}: expected a layer name or a one-key mapping, got {item!r}")


def build_sequential(
    layers: list[str | dict[str, Any]], input_shape: tuple[int, int, int], num_classes: int
) -> nn.Sequential:
    """An `nn.Sequential` from the recipe's layer list; `classes` as an argument means the dataset's class count."""
    probe = torch.zeros(2, *input_shape)
    modules: list[nn.Module] = []
    for index, item in enumerate(layers):
        name, args, kwargs = _parse(item, index)
        if name not in LAYERS:
            raise RecipeError(f"model.layers.{index}: unknown layer {name!r}; known: {', '.join(sorted(LAYERS))}")
        args = [num_classes if a == "classes" else a for a in args]
        kwargs = {k: num_classes if v == "classes" else v for k, v in kwargs.items()}
        factory, needs_input = LAYERS[name]
        try:
            module = factory(probe.shape[1], *args, **kwargs) if needs_input else factory(*args, **kwargs)
            probe = module(probe)
        except (TypeError, ValueError, RuntimeError) as error:
            raise RecipeError(
                f"model.layers.{index}: {name} with {args or kwargs} does not fit input of shape "
                f"{tuple(probe.shape[1:])}: {error}"
            ) from None
        modules.append(module)
    if probe.dim() != 2 or probe.shape[1] != num_classes:
        raise RecipeError(
            f"model.layers: the last layer must output {num_classes} class scores per image, "
            f"it outputs shape {tuple(probe.shape[1:])}"
        )
    return nn.Sequential(*modules)
