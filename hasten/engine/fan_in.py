"""`optim.fan_in_lr`: Adam's LR per layer by the layer's fan-in, so a wide dense layer does not take steps that a
3x3 convolution's LR sets.

Adam moves every weight by about its LR a step whatever its gradient's size, so a unit's input sum moves by about
the LR times the number of inputs it reads, its fan-in: an MLP's first layer on 32x32 RGB images (3,072 inputs)
moves five times as far a step as a 3x3 convolution over 64 channels (576) at the same LR. The maximal-update
parametrisation (Yang et al., 2022, "Tensor Programs V") gives Adam's hidden layers an LR proportional to
1 / fan-in for this reason. Here a weight whose fan-in is over `FAN_IN_REFERENCE` takes `optim.lr` x
FAN_IN_REFERENCE / fan-in; every other parameter (narrower layers, biases, norms, embeddings) takes `optim.lr`.
FAN_IN_REFERENCE is the widest layer of the convolutional nets the default LR for a model without batch norm was
measured on (docs/defaults.md): the rule leaves those nets as measured and slows only wider layers.

A weight that feeds a batch norm keeps `optim.lr`: the batch norm divides out the scale of what the layer gives
it, so that layer's steps do not grow with its fan-in the same way (and the batch-norm nets were measured at
optim.lr as they are). Which layer feeds one is read from the order the modules were made in: a convolution or
linear layer whose next module without children is a batch norm (`nn.Sequential(conv, bn, relu)`, a ResNet
block's `conv1, bn1`), the order nearly every model is written in; a model written otherwise has that layer
treated as any other.

The fan-in of a weight: a linear layer's inputs; a convolution's input channels per group times its kernel's
size; an attention layer's embedding width for its input projections. Transposed convolutions, embeddings and
any other parameter keep `optim.lr`.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter

from hasten.engine.norms import is_batch_norm

FAN_IN_REFERENCE = 576  # 3x3 over 64 channels: the widest layer of the conv nets the no-batch-norm LR was measured on


def weight_fan_ins(model: nn.Module) -> dict[str, tuple[Tensor, int]]:
    """The fan-in of each dense weight of `model`, by parameter name: linear layers, convolutions (not
    transposed) and attention's input projections; lazy weights not yet materialised are left out."""
    found: dict[str, tuple[Tensor, int]] = {}

    def add(name: str, weight: Any, fan_in: int) -> None:
        if isinstance(weight, nn.Parameter) and not isinstance(weight, UninitializedParameter):
            found[name] = (weight, fan_in)

    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, nn.Linear):
            add(f"{dot}weight", module.weight, module.in_features)
        elif isinstance(module, nn.modules.conv._ConvNd) and not module.transposed:
            add(f"{dot}weight", module.weight, module.in_channels // module.groups * math.prod(module.kernel_size))
        elif isinstance(module, nn.MultiheadAttention):
            for part in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
                weight = getattr(module, part, None)
                if weight is not None:
                    add(f"{dot}{part}", weight, weight.shape[1])
    return found


POOLS = (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd)  # a positive scale passes through unchanged


def feeding_batch_norm(model: nn.Module) -> set[int]:
    """ids of the weights of the layers whose next module without children, in the order they were made (a max or
    average pool between skipped: it passes the layer's scale on), is a batch norm: what that batch norm
    normalises."""
    leaves = [module for module in model.modules() if not list(module.children()) and not isinstance(module, POOLS)]
    return {
        id(layer.weight)
        for layer, after in itertools.pairwise(leaves)
        if isinstance(layer, nn.Linear | nn.modules.conv._ConvNd) and is_batch_norm(after)
    }


def lr_scale(fan_in: int) -> float:
    """The share of optim.lr a weight with this fan-in takes: 1 up to FAN_IN_REFERENCE, then reference / fan-in."""
    return min(1.0, FAN_IN_REFERENCE / fan_in) if fan_in > 0 else 1.0


def lr_shares(model: nn.Module) -> dict[str, tuple[Tensor, int, float]]:
    """Each dense weight by name: the weight, its fan-in and the share of optim.lr it takes (1 for a weight that
    feeds a batch norm)."""
    normalised = feeding_batch_norm(model)
    return {
        name: (weight, fan_in, 1.0 if id(weight) in normalised else lr_scale(fan_in))
        for name, (weight, fan_in) in weight_fan_ins(model).items()
    }


def scaled_weights(model: nn.Module) -> dict[str, tuple[int, float]]:
    """The weights that take less than optim.lr, by name: (fan-in, share of the LR)."""
    return {name: (fan_in, share) for name, (_, fan_in, share) in lr_shares(model).items() if share < 1}


def fan_in_groups(groups: list[dict[str, Any]], model: nn.Module, lr: float) -> list[dict[str, Any]]:
    """`groups` (each with its weight decay, maybe its own LR) with the weights of a fan-in over FAN_IN_REFERENCE
    moved to groups of their own at the group's LR times `lr_scale` (`regrouped_by_share`); `groups` itself when no
    weight is scaled (the groups, and so the checkpoints, of a run without such a layer are as before)."""
    return regrouped_by_share(groups, {id(weight): share for weight, _, share in lr_shares(model).values()}, lr)


def regrouped_by_share(groups: list[dict[str, Any]], shares: dict[int, float], lr: float) -> list[dict[str, Any]]:
    """`groups` with each parameter whose share of the LR (by `id`; absent: 1) is not 1 moved to a group of its own
    per share, at its group's LR (else `lr`) times the share, the largest share first. The parameters at their
    group's LR stay first, in their groups as given, so the first group's LR (which the logs report) is optim.lr's;
    `groups` itself when every share is 1."""
    if all(share == 1 for share in shares.values()):
        return groups
    kept, moved = [], []
    for group in groups:
        by_share: dict[float, list[Tensor]] = {}
        for p in group["params"]:
            by_share.setdefault(shares.get(id(p), 1.0), []).append(p)
        kept.append({**group, "params": by_share.pop(1.0, [])})
        moved += [{**group, "params": params, "lr": group.get("lr", lr) * share}
                  for share, params in sorted(by_share.items(), reverse=True)]  # fmt: skip
    return kept + moved
