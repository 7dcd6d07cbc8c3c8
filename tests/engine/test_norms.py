"""Whether a model has batch norm (hasten.engine.norms.py): every kind of batch norm at any depth, and no other norm."""

from __future__ import annotations

import pytest
import torch
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


def test_batch_norm_is_folded_into_the_convolution_before_it_for_evaluation_and_the_model_is_left_as_it_was():
    from hasten.engine.norms import folded_for_inference

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4))  # fmt: skip
    for bn in (model[1], model[4]):  # statistics and affine parameters away from their initial values
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    model = model.to(memory_format=torch.channels_last).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = folded_for_inference(model)
    assert not has_batch_norm(folded) and sum(isinstance(m, nn.Conv2d) for m in folded.modules()) == 2
    assert model.training and not folded.training  # the model keeps its mode; the copy evaluates
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # and its weights
    convs = [m for m in folded.modules() if isinstance(m, nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)  # the layout kept
    images = torch.randn(16, 3, 12, 12).to(memory_format=torch.channels_last)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(folded(images), model(images), rtol=1e-4, atol=1e-5)  # the same function


def test_a_batch_norm_after_a_max_pool_is_folded_into_the_convolution_where_its_scale_is_positive():
    """model.pool_first's order, conv -> max-pool -> BN -> ReLU: a positive per-channel scale commutes with the max,
    so the BN folds into the convolution; a BN with a negative scale in any channel does not, and stays."""
    from hasten.engine.norms import folded_for_inference

    torch.manual_seed(0)
    model = ResNet(1, 10, width=8, blocks=[1, 1], pool_first=True)
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    negative = model.stages[1][1][1]
    negative.weight.data[3] = -0.7  # one channel's scale below 0: max(-x) is not -max(x)
    model.eval()
    folded = folded_for_inference(model)
    kept = [m for m in folded.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(kept) == 1 and torch.equal(kept[0].weight, negative.weight)  # the second stage's, and only it
    assert sum(isinstance(m, nn.Conv2d) for m in folded.modules()) == sum(
        isinstance(m, nn.Conv2d) for m in model.modules()
    )
    images = torch.randn(8, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(folded(images), model(images), rtol=1e-4, atol=1e-5)  # the same function
    negative.weight.data[3] = 0.7
    refolded = folded_for_inference(model)
    assert not has_batch_norm(refolded)
    with torch.no_grad():
        torch.testing.assert_close(refolded(images), model(images), rtol=1e-4, atol=1e-5)


def test_a_model_without_batch_norm_one_fx_cannot_trace_or_one_with_hooks_is_evaluated_as_it_is():
    from hasten.engine.norms import folded_for_inference

    plain = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
    assert folded_for_inference(plain) is plain

    class Branching(nn.Module):  # control flow on the input: symbolic tracing raises
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x)) if x.sum() > 0 else self.conv(x)

    branching = Branching().train()
    assert folded_for_inference(branching) is branching and branching.training
    hooked = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))  # fp16's casts are hooks on the model itself
    hooked.register_forward_pre_hook(lambda _module, args: tuple(a.half() for a in args))
    assert folded_for_inference(hooked) is hooked


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("side", [28, 7, 5])
def test_a_pair_max_is_a_two_by_two_max_pool_value_for_value(dtype, channels_last, side):
    from hasten.engine.norms import PairMax

    torch.manual_seed(0)
    images = torch.randn(4, 6, side, side + 1).to(dtype)
    images[0, 0, 0, 0], images[1, 2, 3, 3], images[2, 1, 1, 2] = float("nan"), float("-inf"), float("inf")
    images[3, 0, :2, :2] = 0.5  # a tie
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, torchs = PairMax()(images), nn.MaxPool2d(2)(images)
    assert ours.shape == torchs.shape and ours.dtype == dtype
    assert torch.equal(ours.isnan(), torchs.isnan()) and torch.equal(ours.nan_to_num(), torchs.nan_to_num())
    assert ours.is_contiguous(memory_format=torch.channels_last) == channels_last or side < 6


def test_the_evaluation_copy_pools_two_by_two_by_pair_max_and_leaves_other_pools():
    from hasten.engine.norms import PairMax, folded_for_inference, is_pair_pool

    torch.manual_seed(0)
    model = ResNet(1, 10, width=8, blocks=[1, 1], pool_first=True).eval()
    others = [nn.MaxPool2d(3), nn.MaxPool2d(2, stride=1), nn.MaxPool2d(2, padding=1), nn.MaxPool2d(2, ceil_mode=True),
              nn.MaxPool2d(2, return_indices=True)]  # fmt: skip
    assert [is_pair_pool(pool) for pool in others] == [False] * 5 and is_pair_pool(nn.MaxPool2d((2, 2), 2))
    folded = folded_for_inference(model)
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 2 and sum(isinstance(m, PairMax) for m in folded.modules()) == 2
    assert not any(isinstance(m, nn.MaxPool2d) for m in folded.modules())
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2  # the model itself keeps its own
    images = torch.randn(8, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(folded(images), model(images), rtol=1e-4, atol=1e-5)
