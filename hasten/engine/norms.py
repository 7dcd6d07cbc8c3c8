"""Whether a layer, or any layer of a model, is batch norm: what decides that a batch of one cannot train, that the
EMA's average needs its statistics recomputed, and which layers the recipe's BN settings reach.

One test for all of them: torch's BatchNorm1d/2d/3d, their lazy forms and SyncBatchNorm all derive from
`_BatchNorm` (InstanceNorm, LayerNorm and GroupNorm do not: they never normalise over the batch).
"""

from __future__ import annotations

from torch import nn


def is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def has_batch_norm(model: nn.Module) -> bool:
    """Whether any layer of `model`, at any depth, is batch norm."""
    return any(is_batch_norm(module) for module in model.modules())
