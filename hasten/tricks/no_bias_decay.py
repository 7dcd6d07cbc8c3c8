"""No weight decay on biases and normalisation parameters (He et al., "Bag of Tricks", 2019; Goyal et al.,
2017 apply decay to weights only): decaying a BN gamma or a bias only fights the normalisation, it does not
regularise. The split is by shape: every 1-D parameter (bias, BN/LayerNorm scale and shift) goes without.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def param_groups(model: nn.Module, weight_decay: float, no_bias_decay: bool) -> list[dict[str, Any]]:
    """Optimizer param groups: with `no_bias_decay`, the 1-D parameters in a second group with no decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not no_bias_decay:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
