"""Zero-init of the last BN gamma in each residual block (Goyal et al., 2017; He et al., "Bag of Tricks",
2019): every residual branch starts as the identity, so the network starts shallow and trains stably at
large learning rates."""

from __future__ import annotations

from torch import nn

from hasten.models.resnet import Residual


def zero_init_residual(model: nn.Module) -> list[str]:
    """Set the last BN gamma of every residual block to 0; returns the names of the parameters it zeroed (empty:
    the model has none). A residual block is hasten's `Residual` or, in a user's model, any module whose
    `last_bn` is a BatchNorm layer: the norm that ends its residual branch."""
    zeroed = []
    for name, module in model.named_modules():
        last_bn = getattr(module, "last_bn", None)  # the documented hook for a user's residual block
        if isinstance(module, Residual) or isinstance(last_bn, nn.modules.batchnorm._BatchNorm):
            nn.init.zeros_(module.last_bn.weight)
            bn_name = next(n for n, m in module.named_modules() if m is module.last_bn)
            zeroed.append(f"{name}.{bn_name}.weight")
    return zeroed
