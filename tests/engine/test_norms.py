"""Whether a model has batch norm (hasten.engine.norms.py): every kind of batch norm at any depth, and no other norm."""

from __future__ import annotations

import pytest
from torch import nn

from hasten.engine.norms import has_batch_norm, is_batch_norm
from hasten.models import ResNet

BATCH_NORMS = [nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.BatchNorm3d(4), nn.SyncBatchNorm(4), nn.LazyBatchNorm2d(),
               nn.BatchNorm2d(4, affine=False, track_running_stats=False)]  # fmt: skip
OTHER_NORMS = [
    nn.LayerNorm(4),
    nn.GroupNorm(2, 4),
    nn.InstanceNorm2d(4, track_running_stats=True),
    nn.LocalResponseNorm(2),
]


@pytest.mark.parametrize("norm", BATCH_NORMS, ids=lambda m: type(m).__name__)
def test_every_batch_norm_is_found_at_any_depth(norm: nn.Module) -> None:
    assert is_batch_norm(norm) and has_batch_norm(norm)
    deep = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), nn.ModuleDict({"block": nn.Sequential(norm)})))
    assert has_batch_norm(deep) and not is_batch_norm(deep)


@pytest.mark.parametrize("norm", OTHER_NORMS, ids=lambda m: type(m).__name__)
def test_other_norms_are_not_batch_norm(norm: nn.Module) -> None:
    assert not is_batch_norm(norm)
    assert not has_batch_norm(nn.Sequential(nn.Flatten(), nn.Linear(16, 4), norm, nn.ReLU(), nn.Linear(4, 2)))


def test_hastens_resnet_has_batch_norm_and_an_mlp_has_none() -> None:
    assert has_batch_norm(ResNet(1, 10, width=4, blocks=[1, 1]))
    assert not has_batch_norm(nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10)))
