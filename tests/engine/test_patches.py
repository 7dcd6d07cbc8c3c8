"""data.augment.translate=auto and patches: a model whose only spatial layer cuts patches gets shifts only in runs
with an epoch for each shifted view; which models count (read from their modules, lazy ones included), the rule's
choice, and a run's record of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import hasten
from examples.models import groupnorm_cnn, mlp, mobilenet, plain_cnn, timm_resnet, vit
from hasten.engine.patches import patch_side
from hasten.models.resnet import ResNet
from hasten.recipe.schema import load_recipe
from hasten.run.resolve import resolve_budget
from hasten.tune import rules


class Mixer(nn.Module):
    """An MLP-Mixer-style net: 4x4 patches, then token- and channel-mixing linear layers only."""

    def __init__(self, num_classes: int = 2, in_channels: int = 3, lazy: bool = False):
        super().__init__()
        self.patch = nn.LazyConv2d(16, 4, stride=4) if lazy else nn.Conv2d(in_channels, 16, 4, stride=4)
        self.tokens = nn.Linear(64, 64)  # 64 patches of a 32x32 image
        self.channels = nn.Conv2d(16, 16, 1)  # a 1x1 convolution mixes channels, not places
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.patch(x)  # (B, 16, 8, 8)
        x = x + self.tokens(x.flatten(2)).view_as(x)
        x = x + self.channels(x)
        return self.head(x.mean((2, 3)))


def _with(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), *layers)


def test_the_patch_cut_is_found_when_it_is_the_only_spatial_layer() -> None:
    assert patch_side(vit.TinyViT(10, 1, (28, 28))) == 4
    assert patch_side(Mixer()) == 4
    assert patch_side(Mixer(lazy=True)) == 4  # a lazy convolution's kernel and stride are known before its shape
    assert patch_side(nn.Sequential(nn.Conv2d(3, 8, (2, 4), stride=(2, 4)))) == 2
    assert patch_side(_with(nn.Conv2d(8, 8, 1), nn.AdaptiveAvgPool2d(1), nn.MaxPool2d(1))) == 4


@pytest.mark.parametrize(
    "model",
    [
        _with(nn.Conv2d(8, 8, 5, padding=2, groups=8)),  # ConvMixer, ConvNeXt: depthwise convolutions slide over them
        _with(nn.MaxPool2d(2)),  # a pooling window slides
        _with(nn.Conv2d(8, 8, 2, stride=2)),  # two cuts: a hierarchy of patch merges, as a ConvNeXt's
        nn.Sequential(nn.Conv2d(3, 8, 4, stride=4, padding=1)),  # padded: not a cut into patches
        nn.Sequential(nn.Conv2d(3, 8, 4, stride=2)),  # overlapping windows
        nn.Sequential(nn.Conv2d(3, 8, 1)),  # 1x1: no patch
        nn.Sequential(nn.Conv2d(4, 8, 4, stride=4, groups=2)),
        nn.Sequential(nn.Conv2d(3, 8, 4, stride=4, dilation=2)),
    ],
)
def test_any_other_spatial_layer_or_an_unusual_cut_is_not_a_patch_model(model: nn.Module) -> None:
    assert patch_side(model) == 0


def test_the_model_suite_s_convolutional_nets_mlp_and_hasten_s_resnet_are_not_patch_models() -> None:
    torch.manual_seed(0)
    models = [groupnorm_cnn.GroupNormCNN(10, 3), plain_cnn.PlainCNN(10, 3), mlp.MLP(10, 3, (32, 32)),
              mobilenet.MobileNetLike(10, 3), timm_resnet.ResNet(10, 3), ResNet(3, 10)]  # fmt: skip
    assert [patch_side(m) for m in models] == [0] * len(models)


def test_auto_gives_a_patch_model_shifts_only_in_runs_with_an_epoch_for_each_shifted_view() -> None:
    assert rules.patch_shift_epochs(1) == 9 and rules.patch_shift_epochs(2) == 25
    assert rules.auto_translate(32, 8, patch=4) == 0 and rules.auto_translate(32, 9, patch=4) == 1
    assert rules.auto_translate(64, 24, patch=4) == 0 and rules.auto_translate(64, 25, patch=4) == 2
    assert rules.auto_translate(32, 5) == 1 and rules.auto_translate(64, 5) == 2  # any other model: from 5 epochs
    assert rules.auto_translate(32, 4) == 0
    data = type("Data", (), {"train_labels": torch.zeros(1000), "image_shape": (3, 32, 32)})()
    short = load_recipe(None, ["train.epochs=7", "train.batch_size=32"])
    patched, notes = resolve_budget(short, data, 1, patch=4)
    assert patched.data.augment.translate == 0
    assert notes == [
        "data.augment.translate=auto -> 0 pixel(s): 32-pixel images, 7 epochs (the model's only spatial layer cuts "
        "4x4-pixel patches, so a shift changes every patch and each shifted view is learnt from the data: shifts in "
        "runs of 9 epochs or more, one a view)"
    ]
    convolutional, notes = resolve_budget(short, data, 1)
    assert convolutional.data.augment.translate == 1
    assert notes == ["data.augment.translate=auto -> 1 pixel(s): 32-pixel images, 7 epochs (shifts in runs of 5 "
                     "epochs or more)"]  # fmt: skip
    long, _ = resolve_budget(load_recipe(None, ["train.epochs=27"]), data, 1, patch=4)
    assert long.data.augment.translate == 1
    given, notes = resolve_budget(load_recipe(None, ["train.epochs=7", "data.augment.translate=2"]), data, 1, patch=4)
    assert given.data.augment.translate == 2 and notes == []  # asked for by name: kept


def test_a_short_run_of_a_patch_model_records_no_shifts_and_says_why(tmp_path, capsys) -> None:
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (64, 3, 32, 32), dtype=np.uint8), np.arange(64) % 2
    run = tmp_path / "run"
    overrides = ["train.batch_size=16", "train.epochs=8", "precision=fp32", "run.progress=false",
                 "run.tensorboard=false", f"run.dir={run}"]  # fmt: skip
    hasten.train(None, overrides, model=Mixer, data=((images, labels), (images[:16], labels[:16]), ["a", "b"]))
    assert yaml.safe_load((run / "recipe.yaml").read_text())["data"]["augment"]["translate"] == 0
    assert "cuts 4x4-pixel patches" in " ".join(capsys.readouterr().err.split())  # the lines are wrapped
