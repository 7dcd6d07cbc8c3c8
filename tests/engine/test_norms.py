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


def _trained_resnet(channels_last: bool) -> nn.Module:
    """hasten's ResNet with the max-pool first (batch norms folded directly and through pools) and a linear layer
    followed by batch norm, its statistics and affine parameters away from their initial values."""
    torch.manual_seed(0)
    model = nn.Sequential(ResNet(1, 16, width=8, blocks=[1, 1], pool_first=True), nn.Linear(16, 10), nn.BatchNorm1d(10))
    for bn in (m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))):
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _steps(model: nn.Module, count: int) -> None:
    """`count` SGD steps in training mode: the weights and the batch norms' statistics move in place."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(count):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(8, 1, 16, 16)), torch.randint(0, 10, (8,))).backward()
        optimizer.step()


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_evaluation_copy_is_made_once_and_brought_up_to_the_weights_as_a_fresh_fold_would_be(channels_last):
    """Evaluated after every epoch, the folded copy is kept and refreshed: after training steps it is the same
    object, and its weights and outputs are bitwise those of a copy folded afresh from the trained model."""
    from hasten.engine.norms import _FOLDS, folded_for_inference, fresh_fold

    model = _trained_resnet(channels_last)
    first = folded_for_inference(model)
    assert first is not model and _FOLDS[model].module is first and len(_FOLDS[model].fused) >= 4
    images = torch.randn(8, 1, 16, 16)
    for _ in range(2):
        _steps(model, 3)
        again = folded_for_inference(model)
        fresh = fresh_fold(model)
        assert again is first and model.training  # the same copy; the model keeps its mode
        assert again.state_dict().keys() == fresh.state_dict().keys()
        for name, tensor in again.state_dict().items():
            assert torch.equal(tensor, fresh.state_dict()[name]), name
            assert tensor.stride() == fresh.state_dict()[name].stride(), name  # the layout a fresh fold has
        model.eval()
        with torch.no_grad():
            assert torch.equal(again(images), fresh(images))
            torch.testing.assert_close(again(images), model(images), rtol=1e-4, atol=1e-5)


def test_a_model_whose_layers_change_is_folded_afresh_and_a_freed_model_frees_its_copy():
    import gc
    import weakref

    from hasten.engine.norms import _FOLDS, folded_for_inference

    model = _trained_resnet(channels_last=False).eval()
    first = folded_for_inference(model)
    images = torch.randn(4, 1, 16, 16)
    model[1] = nn.Linear(16, 10)  # a layer of the same kind and shape: its weights are written into the copy
    assert folded_for_inference(model) is first
    with torch.no_grad():
        torch.testing.assert_close(first(images), model(images), rtol=1e-4, atol=1e-5)
    model[1] = nn.Sequential(nn.Linear(16, 10), nn.Tanh())  # other layers: another function, traced afresh
    second = folded_for_inference(model)
    assert second is not first
    with torch.no_grad():
        torch.testing.assert_close(second(images), model(images), rtol=1e-4, atol=1e-5)
    model.to(memory_format=torch.channels_last)  # another layout: a fresh copy in it
    third = folded_for_inference(model)
    assert third is not second and all(
        m.weight.is_contiguous(memory_format=torch.channels_last) for m in third.modules() if isinstance(m, nn.Conv2d)
    )
    kept, held = weakref.ref(model), weakref.ref(third)
    assert _FOLDS[model].module is third
    del model, first, second, third
    gc.collect()
    assert kept() is None  # the kept copy did not keep the model alive
    assert held() is None or all(fold.module is not held() for fold in _FOLDS.values())  # nor the cache its copy


def test_a_copy_whose_refresh_does_not_reproduce_a_fresh_fold_is_never_reused(monkeypatch):
    """The check made when a copy is first kept: the layers it pairs with the wrong batch norms (as a fold torch
    changed might) give weights unlike a fresh fold's, so that model is folded afresh at every evaluation."""
    from hasten.engine import norms

    model = _trained_resnet(channels_last=False).eval()
    pairs = norms._folded_pairs

    def swapped(model: nn.Module, folded: nn.Module) -> list[tuple[str, str]]:
        found = pairs(model, folded)
        return [(found[0][0], found[1][1]), (found[1][0], found[0][1]), *found[2:]]

    monkeypatch.setattr(norms, "_folded_pairs", swapped)
    first = norms.folded_for_inference(model)
    assert norms._FOLDS[model].module is None
    images = torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        expected = model(images)
        torch.testing.assert_close(first(images), expected, rtol=1e-4, atol=1e-5)  # left as the fold made it
        second = norms.folded_for_inference(model)
        assert second is not first
        torch.testing.assert_close(second(images), expected, rtol=1e-4, atol=1e-5)
