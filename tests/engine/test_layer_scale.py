"""optim.layer_scale_lr: a layer scale (a parameter that starts at one tiny value) at a multiple of Adam's LR; which
parameters count, the groups the optimizer gets, the decision at start (said, recorded), a real run's optimizer and
a resume of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import hasten
from examples.models import groupnorm_cnn, mlp, mobilenet, plain_cnn, timm_resnet, vit
from hasten.engine.layer_scale import LAYER_SCALE_MAX, layer_scale_groups, layer_scales
from hasten.errors import RecipeError
from hasten.models.resnet import ResNet
from hasten.recipe.schema import Recipe, load_recipe
from hasten.run.shares import resolve_layer_scale_lr, resolve_lr_shares
from hasten.techniques.no_bias_decay import split_no_decay
from hasten.tune import rules


class Block(nn.Module):
    """A ConvNeXt-style residual block: its branch times a per-channel scale that starts at `start`."""

    def __init__(self, dim: int, start: float = 1e-6):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.GroupNorm(1, dim)
        self.gamma = nn.Parameter(start * torch.ones(dim, 1, 1))

    def forward(self, x):
        return x + self.gamma * self.norm(self.conv(x))


class ScaledNet(nn.Module):
    def __init__(self, num_classes: int = 2, in_channels: int = 3):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 8, 2, stride=2)
        self.blocks = nn.Sequential(Block(8), Block(8, start=1e-5))
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def test_the_scales_are_found_by_their_start_and_nothing_else_is():
    assert list(layer_scales(ScaledNet())) == ["blocks.0.gamma", "blocks.1.gamma"]
    odd = nn.ParameterDict({
        "rezero": nn.Parameter(torch.zeros(1)),  # 0: cannot be told from a zero bias
        "big": nn.Parameter(torch.full((4,), 0.1)),  # over LAYER_SCALE_MAX: already moves as far as Adam steps
        "edge": nn.Parameter(torch.full((4,), LAYER_SCALE_MAX)),
        "negative": nn.Parameter(torch.full((3,), -1e-6)),
        "uneven": nn.Parameter(torch.tensor([1e-6, 2e-6])),
        "frozen": nn.Parameter(torch.full((4,), 1e-6), requires_grad=False),
        "whole": nn.Parameter(torch.full((2, 3), 1e-4)),
    })  # fmt: skip
    assert set(layer_scales(odd)) == {"edge", "negative", "whole"}
    lazy = nn.Sequential(nn.LazyLinear(3))  # not materialised: not read
    assert layer_scales(lazy) == {}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_model_suite_and_hasten_s_resnet_have_none(seed):
    """The rule changes nothing for a model without a layer scale: the suite's six models and hasten's ResNet."""
    torch.manual_seed(seed)
    models = [groupnorm_cnn.GroupNormCNN(10), plain_cnn.PlainCNN(10), vit.TinyViT(10), mlp.MLP(10),
              mobilenet.MobileNetLike(10), timm_resnet.ResNet(10), ResNet(3, 10)]  # fmt: skip
    assert [layer_scales(model) for model in models] == [{}] * len(models)


def test_the_groups_put_the_scales_at_the_factor_after_the_others_and_keep_their_decay():
    model = ScaledNet()
    gammas = {id(p) for p in layer_scales(model).values()}
    groups = [{"params": list(model.parameters()), "weight_decay": 0.01}]
    faster = layer_scale_groups(groups, model, 0.002, 10.0)
    assert [(group.get("lr"), group["weight_decay"], {id(p) in gammas for p in group["params"]}) for group in faster] \
        == [(None, 0.01, {False}), (pytest.approx(0.02), 0.01, {True})]  # fmt: skip
    split = split_no_decay(faster)  # no-bias-decay after it: each half keeps its group's LR
    assert sorted(id(p) for group in split for p in group["params"]) == sorted(id(p) for p in model.parameters())
    assert all(group.get("lr") == pytest.approx(0.02) for group in split if {id(p) for p in group["params"]} & gammas)
    assert layer_scale_groups(groups, model, 0.002, 1.0) is groups  # 1: as before, the same groups
    plain = nn.Linear(3, 2)
    plain_groups = [{"params": list(plain.parameters())}]
    assert layer_scale_groups(plain_groups, plain, 0.002, 10.0) is plain_groups


def test_auto_is_ten_for_adam_said_with_the_scales_one_for_sgd_and_for_a_model_without():
    recipe, notes = resolve_layer_scale_lr(Recipe(), ScaledNet())
    assert recipe.optim.layer_scale_lr == rules.LAYER_SCALE_LR == 10
    assert "-> 10: 2 layer scale(s) starting at 1e-06 to 1e-05 (blocks.0.gamma, blocks.1.gamma)" in notes[0]
    recipe, notes = resolve_layer_scale_lr(load_recipe(None, ["optim.name=sgd"]), ScaledNet())
    assert recipe.optim.layer_scale_lr == 1 and "optim.name=sgd" in notes[0]
    recipe, notes = resolve_layer_scale_lr(Recipe(), nn.Sequential(nn.Flatten(), nn.Linear(12, 2)))
    assert recipe.optim.layer_scale_lr == 1 and notes == []  # nothing to speed up: nothing said
    kept, notes = resolve_layer_scale_lr(load_recipe(None, ["optim.layer_scale_lr=3"]), ScaledNet())
    assert kept.optim.layer_scale_lr == 3 and notes == []
    recipe, notes = resolve_lr_shares(Recipe(), ScaledNet())  # both keys decided together, each said
    assert recipe.optim.fan_in_lr is True and recipe.optim.layer_scale_lr == 10 and len(notes) == 1
    for bad in ("0", "-1", "fast"):
        with pytest.raises(RecipeError, match="optim.layer_scale_lr"):
            load_recipe(None, [f"optim.layer_scale_lr={bad}"])


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    images, labels = rng.integers(0, 255, (64, 3, 16, 16), dtype=np.uint8), np.arange(64) % 2
    return (images, labels), (images[:16], labels[:16]), ["a", "b"]


def test_a_run_records_the_factor_trains_its_scales_at_it_and_resumes_with_the_same_groups(tmp_path, capsys):
    run = tmp_path / "run"
    overrides = ["train.batch_size=16", "precision=fp32", "run.progress=false", "run.tensorboard=false",
                 "optim.lr=0.004", f"run.dir={run}", "run.save_weights=true"]  # fmt: skip
    hasten.train(None, [*overrides, "train.epochs=1"], model=ScaledNet, data=_data())
    assert yaml.safe_load((run / "recipe.yaml").read_text())["optim"]["layer_scale_lr"] == 10
    assert "optim.layer_scale_lr=auto -> 10" in capsys.readouterr().err
    checkpoint = torch.load(max((run / "checkpoints").glob("*.pt")), weights_only=True)
    batch_lr = 0.004 * (16 / 32) ** 0.5  # the sqrt rule from optim.base_batch 32
    peaks = sorted(group["initial_lr"] for group in checkpoint["optimizer"]["param_groups"])
    assert peaks[-1] == pytest.approx(10 * batch_lr) and peaks[0] == pytest.approx(batch_lr)
    scales = [len(group["params"]) for group in checkpoint["optimizer"]["param_groups"]
              if group["initial_lr"] == pytest.approx(10 * batch_lr)]  # fmt: skip
    assert scales == [2]
    moved = checkpoint["model"]["blocks.0.gamma"].abs().max().item()
    assert moved > 1e-3  # 4 steps at 10x the LR: well past its 1e-6 start (Adam's step is about the LR)
    # resumed for a second epoch: the model starts from its first weights, so the same groups are made and the
    # optimizer's state fits them
    hasten.train(None, [*overrides, "train.epochs=2", "resume=auto"], model=ScaledNet, data=_data())
    assert "resuming from" in capsys.readouterr().err
    assert yaml.safe_load((run / "recipe.yaml").read_text())["optim"]["layer_scale_lr"] == 10
