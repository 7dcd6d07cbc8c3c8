"""Model initialisation and batch-norm keys: Dirac init (`model.init`), BN settings (`model.bn_momentum`,
`model.bn_eps`, `model.bn_weight`) and ResNet stage widths (`model.widths`), each as a pure function on a user's own
module, as recipe errors naming the field, and in a 2-step run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hasten
from hasten.errors import RecipeError
from hasten.models import ResNet, build_model
from hasten.recipe.schema import ModelConfig, load_recipe
from hasten.run.build import build
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.techniques.batchnorm import BatchNormSettings, set_batch_norm
from hasten.techniques.dirac import dirac_init


class Plain(nn.Module):
    """A user's own model, unknown to hasten: two 3x3 convs (widening, then narrowing), a 1x1 conv, 1-D and 2-D BN."""

    def __init__(self):
        super().__init__()
        self.widen = nn.Conv2d(3, 5, 3, padding=1)
        self.narrow = nn.Conv2d(5, 4, 3, padding=1, bias=False)
        self.point = nn.Conv2d(4, 4, 1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Flatten(), nn.BatchNorm1d(16), nn.Linear(16, 2))
        self.pool = nn.AdaptiveAvgPool2d(2)

    def forward(self, x):
        return self.head(self.pool(self.norm(self.point(self.narrow(self.widen(x))))))


def test_dirac_makes_a_widening_3x3_conv_the_identity_on_its_first_channels():
    model = Plain()
    rest = model.widen.weight[3:].detach().clone()
    assert dirac_init(model) == ["widen"]  # narrow has out < in, point is 1x1
    x = torch.randn(2, 3, 6, 7)
    out = model.widen(x)
    assert torch.equal(out[:, :3], x)  # exactly: one tap of 1.0, a zero bias
    assert torch.equal(model.widen.weight[3:], rest)  # the other filters keep their init
    expected = torch.zeros(3, 3, 3, 3)
    for i in range(3):
        expected[i, i, 1, 1] = 1.0
    assert torch.equal(model.widen.weight[:3], expected)


def test_dirac_on_a_resnet_sets_every_square_3x3_conv():
    model = ResNet(1, 10, width=4, blocks=[1, 1])
    changed = dirac_init(model)
    convs = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    assert changed == convs  # 1->4, 4->4, 4->4, 4->8, 8->8, 8->8: all widen or keep
    block = model.stages[0][2].first[0]
    x = torch.randn(1, 4, 5, 5)
    assert torch.equal(F.conv2d(x, block.weight, padding=1), x)


def test_bn_settings_reach_every_bn_layer_of_a_users_model():
    model = Plain()
    with torch.no_grad():
        model.norm.weight.fill_(0.5)
    assert set_batch_norm(model, momentum=0.6, eps=1e-3, freeze_weight=True) == ["norm", "head.1"]
    for bn in (model.norm, model.head[1]):
        assert bn.momentum == 0.6 and bn.eps == 1e-3
        assert torch.equal(bn.weight, torch.ones_like(bn.weight)) and not bn.weight.requires_grad
        assert bn.bias.requires_grad
    model.train()
    x = torch.randn(8, 3, 4, 4)
    features = model.point(model.narrow(model.widen(x)))
    model.norm(features)  # running mean = (1 - 0.6) * 0 + 0.6 * batch mean
    assert torch.allclose(model.norm.running_mean, 0.6 * features.mean((0, 2, 3)), atol=1e-6)


def test_bn_settings_none_leave_the_models_own():
    model = Plain()
    model.norm.momentum = None  # the user's cumulative average
    set_batch_norm(model, momentum=None, eps=None, freeze_weight=False)
    assert model.norm.momentum is None and model.norm.eps == 1e-5 and model.norm.weight.requires_grad


def test_bn_settings_on_a_model_without_bn_say_so(capsys):
    BatchNormSettings(0.2, None, False).on_model(nn.Sequential(nn.Linear(2, 2)))
    assert "no BatchNorm" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["model.zero_init_residual=true", "model.bn_weight=frozen"], "model.bn_weight"),
        (["model.widths=[16,32]"], "model.widths"),
        (["model.widths=[16,0,64]"], "model.widths"),
        (["model.name=sequential", "model.layers=[flatten, {dense: classes}]", "model.widths=[8]"], "model.widths"),
        (["model.bn_momentum=0"], "model.bn_momentum"),
        (["model.bn_momentum=1.5"], "model.bn_momentum"),
        (["model.bn_eps=-1"], "model.bn_eps"),
        (["model.bn_weight=fixed"], "model.bn_weight"),
        (["model.init=orthogonal"], "model.init"),
        (["model.whiten_eps=0"], "model.whiten_eps"),
        (["model.whiten_images=0"], "model.whiten_images"),
    ],
)
def test_bad_values_are_errors_naming_the_field(overrides, field):
    with pytest.raises(RecipeError, match=field.replace(".", r"\.")) as error:
        load_recipe("fashion-fast", overrides)
    if "zero_init_residual=true" in overrides:
        assert "model.zero_init_residual" in str(error.value)


def test_the_new_keys_are_off_by_default():
    config = ModelConfig()  # whitening: decided per model (on for hasten's ResNet from scratch, off for any other)
    assert (config.whiten, config.init, config.bn_weight, config.widths) == ("auto", "default", "learn", None)
    assert config.bn_momentum is None and config.bn_eps is None


def test_resnet_widths_set_each_stage():
    model = build_model(ModelConfig(widths=[16, 32, 64], blocks=[1, 1, 1]), (1, 28, 28), 10)
    convs = [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs == [16, 16, 16, 16, 32, 32, 32, 64, 64, 64]
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    default = build_model(ModelConfig(width=8), (1, 28, 28), 10)  # unchanged without widths: 8, 16, 32
    assert [m.out_channels for m in default.modules() if isinstance(m, nn.Conv2d)][::3] == [8, 8, 16, 32]


def small(tiny_overrides: list[str], *overrides: str) -> list[str]:
    return [*tiny_overrides, "data.synthetic_size=32", "train.epochs=1", "precision=fp32", *overrides]  # 2 steps


def test_a_two_step_run_with_frozen_bn_scales_trains_only_the_shifts(tiny_overrides, tmp_path):
    overrides = small(tiny_overrides, "model.bn_weight=frozen", "model.bn_momentum=0.5", "model.bn_eps=1e-4")
    parts = build(load_recipe("fashion-fast", overrides))
    norms = [m for m in parts.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(m.momentum == 0.5 and m.eps == 1e-4 and not m.weight.requires_grad for m in norms)
    in_optimizer = {id(p) for group in parts.optimizer.param_groups for p in group["params"]}
    assert not any(id(m.weight) in in_optimizer for m in norms) and all(id(m.bias) in in_optimizer for m in norms)
    summary = hasten.train("fashion-fast", overrides)
    assert summary["epochs"] == 1
    weights = load_checkpoint(checkpoints_in(tmp_path / "run" / "checkpoints")[0])["model"]  # after training
    scales = [v for k, v in weights.items() if k.endswith(".weight") and v.ndim == 1 and "head" not in k]
    assert scales and all(torch.equal(s, torch.ones_like(s)) for s in scales)
    assert "bn_weight: frozen" in (tmp_path / "run" / "recipe.yaml").read_text()


def test_a_two_step_run_with_dirac_init_and_widths(tiny_overrides, tmp_path):
    overrides = small(tiny_overrides, "model.init=dirac", "model.widths=[16,32,64]")
    parts = build(load_recipe("fashion-fast", overrides))
    block = parts.model.stages[1][2].second[0]  # a residual block's 32 -> 32 conv
    x = torch.randn(1, 32, 4, 4)
    assert torch.equal(F.conv2d(x, block.weight, padding=1), x)
    summary = hasten.train("fashion-fast", overrides)
    assert summary["epochs"] == 1
    recorded = (tmp_path / "run" / "recipe.yaml").read_text()
    assert "init: dirac" in recorded and "- 64" in recorded
