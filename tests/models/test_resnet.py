"""hasten's ResNet computes each stage's ReLU after its max-pool: the same numbers as conv-BN-ReLU-pool."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.models.resnet import ResNet, conv_bn


def relu_then_pool(model: ResNet) -> nn.Module:
    """The same modules in the textbook order: each stage's conv-BN-ReLU, then the max-pool, then its blocks."""
    assert [type(m) for m in conv_bn(1, 1)] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU]  # the stem's unit's order
    stages = []
    for stage in model.stages:
        (conv, norm), pool_relu, *blocks = stage
        assert isinstance(pool_relu[0], nn.MaxPool2d) and isinstance(pool_relu[1], nn.ReLU)
        stages.append(nn.Sequential(nn.Sequential(conv, norm, nn.ReLU()), nn.MaxPool2d(2), *blocks))

    class Textbook(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.stages, self.pool, self.head = model.stem, nn.Sequential(*stages), model.pool, model.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.pool(self.stages(self.stem(x))).flatten(1))

    return Textbook()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_the_relu_after_the_pool_gives_the_same_outputs_and_gradients(autocast: bool) -> None:
    torch.manual_seed(0)
    model = ResNet(3, 10, width=8, blocks=[1, 1])
    for module in model.modules():  # batch-norm shifts away from 0: windows of all-negative values occur
        if isinstance(module, nn.BatchNorm2d):
            nn.init.uniform_(module.bias, -1.0, 1.0)
    images = torch.randn(16, 3, 32, 32)
    textbook = relu_then_pool(model)
    copy = {k: v.clone() for k, v in model.state_dict().items()}
    results = []
    for net in (model, textbook):
        model.load_state_dict(copy)  # the batch norms' running statistics, as the first pass found them
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = net(images)
        out.float().square().sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((out.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}))
    (out_a, grads_a, state_a), (out_b, grads_b, state_b) = results
    assert torch.equal(out_a, out_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(model.parameters()))
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name
    for name in state_a:  # the running statistics each pass updated
        assert torch.equal(state_a[name], state_b[name]), name
    # windows whose maximum is negative exist, so the order's claim was exercised where it matters
    first = model.stages[0][0](model.stem(images))
    assert (nn.functional.max_pool2d(first, 2) < 0).float().mean() > 0.05


def test_parameter_names_are_those_of_conv_bn_then_a_pool() -> None:
    names = [name for name, _ in ResNet(1, 10, width=4, blocks=[1]).named_parameters()]
    assert names[:4] == ["stem.0.weight", "stem.1.weight", "stem.1.bias", "stages.0.0.0.weight"]
    assert names[4:6] == ["stages.0.0.1.weight", "stages.0.0.1.bias"]
    assert names[6] == "stages.0.2.first.0.weight"


def test_pool_first_pools_before_each_stage_s_batch_norm_and_trains_checkpointed() -> None:
    """model.pool_first: conv, max-pool, BN, ReLU in each stage's downsampling unit; the BN sees a quarter of the
    pixels. With activation checkpointing the same gradients as without."""
    from hasten.models import build_model
    from hasten.recipe.loading import load_recipe

    model = build_model(load_recipe(None, ["model.pool_first=true"]).model, (1, 16, 16), 10)
    assert isinstance(model, ResNet)
    for stage in model.stages:
        assert [type(m) for m in stage[0]] == [nn.Conv2d]
        assert [type(m) for m in stage[1]] == [nn.MaxPool2d, nn.BatchNorm2d, nn.ReLU]
    seen = []
    model.stages[0][1][1].register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape))
    torch.manual_seed(0)
    images = torch.randn(4, 1, 16, 16)
    model(images).sum().backward()
    assert seen == [torch.Size([4, 16, 8, 8])]  # the first stage's BN on the pooled 8x8, not the 16x16
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.checkpoint_activations = True
    model(images).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, plain[name], atol=1e-5), name
    default = build_model(load_recipe(None, []).model, (1, 16, 16), 10)
    assert [type(m) for m in default.stages[0][0]] == [nn.Conv2d, nn.BatchNorm2d]  # off by default
