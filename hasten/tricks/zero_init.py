"""Zero-init of the last BN gamma in each residual block (Goyal et al., 2017; He et al., "Bag of Tricks",
2019): every residual branch starts as the identity, so the network starts shallow and trains stably at
large learning rates."""

from __future__ import annotations

from torch import nn

from hasten.models.resnet import Residual


def zero_init_residual(model: nn.Module) -> list[str]:
    """Set the last BN gamma of every residual block to 0; returns the names of the parameters it zeroed."""
    zeroed = []
    for name, module in model.named_modules():
        if isinstance(module, Residual):
            nn.init.zeros_(module.last_bn.weight)
            bn_name = next(n for n, m in module.named_modules() if m is module.last_bn)
            zeroed.append(f"{name}.{bn_name}.weight")
    return zeroed
