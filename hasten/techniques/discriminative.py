"""Discriminative fine-tuning (Howard & Ruder, 2018, who divide the LR by 2.6 per layer going down,
`optim.layer_lr_decay`): of L layers, layer l (0 at the input) gets lr * decay^(L-1-l), so the features learned
in pretraining move less than the new head. Schedules scale every group's LR by the same multiplier.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hasten.models import ResNet
from hasten.models.pretrained import NORMALISATION


def layer_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The model's layers from input to output, as lists of parameters: a ResNet's stem, each stage and the
    head; otherwise each child module with parameters, a normalisation layer joining the layer before it."""
    modules = [model.stem, *model.stages, model.head] if isinstance(model, ResNet) else list(model.children())
    groups: list[list[nn.Parameter]] = []
    for module in modules:
        params = list(module.parameters())
        if not params:
            continue
        if groups and isinstance(module, NORMALISATION):
            groups[-1] += params
        else:
            groups.append(params)
    covered = {id(p) for group in groups for p in group}
    rest = [p for p in model.parameters() if id(p) not in covered]  # parameters held by the root module itself
    if rest:
        groups.insert(0, rest)
    return groups


def layer_lr_scales(layers: int, decay: float) -> list[float]:
    """LR multipliers of `layers` layers from input to output: decay^(layers-1), ..., decay, 1 (the head)."""
    return [decay ** (layers - 1 - i) for i in range(layers)]


def discriminative_groups(
    model: nn.Module, lr: float, decay: float, weight_decay: float, no_bias_decay: bool
) -> list[dict[str, Any]]:
    """Optimizer param groups, one or two per layer (weights; biases and norms without decay when
    `no_bias_decay`), each with its own LR: `lr` times its layer's scale."""
    layers = layer_groups(model)
    groups = []
    for params, scale in zip(layers, layer_lr_scales(len(layers), decay), strict=True):
        params = [p for p in params if p.requires_grad]  # frozen by a technique (whitening, frozen BN scales)
        decayed = [p for p in params if p.ndim > 1 or not no_bias_decay]
        undecayed = [p for p in params if p.ndim <= 1 and no_bias_decay]
        for members, wd in ((decayed, weight_decay), (undecayed, 0.0)):
            if members:
                groups.append({"params": members, "weight_decay": wd, "lr": lr * scale})
    return groups
