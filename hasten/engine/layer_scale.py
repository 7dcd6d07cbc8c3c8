"""`optim.layer_scale_lr`: a layer scale takes a multiple of Adam's LR, so a residual branch that starts switched
off can be switched on within the run.

A layer scale multiplies a residual branch by a learnt per-channel factor that starts tiny: ConvNeXt's 1e-6 (Liu et
al., 2022), CaiT's and timm's `LayerScale` 1e-5 to 1e-6 (Touvron et al., 2021), so a deep net starts as its skip
paths. Adam moves every parameter by about its LR a step whatever its gradient's size, so a scale must travel about
1 at the LR's pace before its branch counts as much as its input: at the default's 0.001 that is a thousand steps of
one sign, where a small set's whole run is two to four thousand. The scale's gradient is a sum over the branch's
outputs, mostly noise while the branch's weights are random, so it wanders rather than climbs and the run ends with
its branches still damped (a ConvNeXt-like net on the letters: scales of 0.07-0.23 after 4,050 steps, docs/defaults.md).

Which parameters are layer scales is read from their values when the optimizer is made (before any step): every
element the same, nonzero and at most `LAYER_SCALE_MAX` in size. The weights and biases of linear layers,
convolutions and normalisations start random, at 1 or at 0, so none is taken for one; a scale that starts at exactly
0 (ReZero) cannot be told from a zero bias by its values and keeps optim.lr. A model loaded with trained weights has
no scale at its start value, and trains every parameter at optim.lr.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter

from hasten.engine.fan_in import regrouped_by_share

LAYER_SCALE_MAX = 1e-3  # a constant start at most this small: Adam's first steps (about the LR, 1e-3) dwarf it


def layer_scales(model: nn.Module) -> dict[str, Tensor]:
    """The trainable parameters of `model` that start as a layer scale, by name: floating point, every element
    the same value, nonzero and at most LAYER_SCALE_MAX in size."""
    found: dict[str, Tensor] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad or isinstance(p, UninitializedParameter) or not p.is_floating_point() or p.numel() == 0:
            continue
        with torch.no_grad():
            first = p.reshape(-1)[0]
            size = first.abs()  # compared in the parameter's own dtype: a float32 1e-3 is at most 1e-3
            if bool(size > 0) and bool(size <= LAYER_SCALE_MAX) and bool(torch.all(p == first)):
                found[name] = p
    return found


def start_value(scales: dict[str, Tensor]) -> str:
    """The starting values of `scales`, for a message: "1e-06", or "1e-06 to 1e-05"."""
    values = sorted({abs(float(p.detach().reshape(-1)[0])) for p in scales.values()})
    return f"{values[0]:.2g}" if len(values) == 1 else f"{values[0]:.2g} to {values[-1]:.2g}"


def layer_scale_groups(
    groups: list[dict[str, Any]], model: nn.Module, lr: float, factor: float
) -> list[dict[str, Any]]:
    """`groups` with the layer scales moved to groups of their own at `factor` x the group's LR, after the others
    (fan_in.py's `regrouped_by_share`, so the first group's LR, which the logs report, stays optim.lr's); `groups`
    itself when the model has none or `factor` is 1 (the groups, and so the checkpoints, of such a run are as
    before)."""
    return regrouped_by_share(groups, {id(p): factor for p in layer_scales(model).values()}, lr)
