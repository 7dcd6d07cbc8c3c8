"""optim.fan_in_lr: Adam's LR per weight by its fan-in; which weights count, the groups the optimizer gets, the
decision at start (said, recorded) and a real run's optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten.engine.fan_in import FAN_IN_REFERENCE, fan_in_groups, lr_scale, scaled_weights, weight_fan_ins
from hasten.models.resnet import ResNet
from hasten.recipe.schema import Recipe, load_recipe
from hasten.run.shares import resolve_fan_in_lr
from hasten.techniques.no_bias_decay import split_no_decay
from hasten.tune import rules
from tests.run.test_model_rules import Net  # flatten, a lazy dense layer, the head


def wide_mlp(inputs: int = 3072) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, 64), nn.ReLU(), nn.Linear(64, 10))


def test_fan_ins_of_linear_conv_grouped_conv_and_attention_and_what_is_left_out():
    attention = nn.MultiheadAttention(96, 4, batch_first=True)
    model = nn.ModuleDict({
        "dense": nn.Linear(700, 5),
        "conv": nn.Conv2d(64, 8, 3),
        "depthwise": nn.Conv2d(32, 32, 3, groups=32),
        "up": nn.ConvTranspose2d(512, 4, 4),  # transposed: left at optim.lr
        "embedding": nn.Embedding(5000, 8),  # one row a step: left at optim.lr
        "attention": attention,
        "lazy": nn.LazyLinear(3),  # not materialised: left out
    })  # fmt: skip
    found = {name: fan_in for name, (_, fan_in) in weight_fan_ins(model).items()}
    assert found == {"dense.weight": 700, "conv.weight": 576, "depthwise.weight": 9,
                     "attention.in_proj_weight": 96, "attention.out_proj.weight": 96}  # fmt: skip
    assert FAN_IN_REFERENCE == 576 and lr_scale(576) == 1.0 and lr_scale(9) == 1.0
    assert lr_scale(3072) == pytest.approx(0.1875) and lr_scale(1152) == 0.5
    assert scaled_weights(model) == {"dense.weight": (700, pytest.approx(576 / 700))}


def test_the_wide_weights_get_groups_of_their_own_and_the_rest_keeps_its_groups_first():
    model = nn.Sequential(nn.Linear(2304, 64), nn.ReLU(), nn.Linear(1152, 10), nn.Linear(64, 64))
    params = list(model.parameters())
    groups = split_no_decay(fan_in_groups([{"params": params, "weight_decay": 0.01}], model, 0.002))
    assert groups[0]["params"] == [model[3].weight] and "lr" not in groups[0]  # the first group: optim.lr's (logs)
    assert groups[1]["weight_decay"] == 0.0 and len(groups[1]["params"]) == 3  # the biases: full LR, no decay
    assert [(g["params"], g["lr"]) for g in groups[2:]] == [([model[2].weight], pytest.approx(0.001)),
                                                            ([model[0].weight], pytest.approx(0.0005))]  # fmt: skip
    assert sum(len(g["params"]) for g in groups) == len(params)
    # a group with its own LR (discriminative fine-tuning) keeps its share of it
    own = fan_in_groups([{"params": params, "lr": 0.01}], model, 0.002)
    assert [g["lr"] for g in own] == [0.01, pytest.approx(0.005), pytest.approx(0.0025)]
    narrow = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8, 2))  # nothing wide: the groups as given
    given = [{"params": list(narrow.parameters())}]
    assert fan_in_groups(given, narrow, 0.002) is given


def test_a_weight_that_feeds_a_batch_norm_keeps_the_lr_and_a_dense_layer_after_the_convs_does_not():
    """A VGG-style net with batch norm: its 3x3 convolutions over 128 channels (1,152 inputs) feed batch norms and
    keep the LR; its flatten into a dense layer (2,048 inputs) does not feed one and takes 576 / 2,048 of it."""
    vgg = nn.Sequential(
        nn.Conv2d(3, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(2048, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip
    assert scaled_weights(vgg) == {"8.weight": (2048, pytest.approx(576 / 2048))}

    class Block(nn.Module):  # a ResNet block, made conv1, bn1, conv2, bn2 as torchvision and timm write them
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128)
            self.conv2, self.bn2 = nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128)

    assert scaled_weights(Block()) == {}
    no_norm = nn.Sequential(nn.Conv2d(128, 128, 3), nn.ReLU(), nn.BatchNorm2d(128))  # a ReLU between: counted
    assert scaled_weights(no_norm) == {"0.weight": (1152, 0.5)}
    pooled = nn.Sequential(nn.Conv2d(128, 128, 3), nn.MaxPool2d(2), nn.BatchNorm2d(128))  # a pool between: kept
    assert scaled_weights(pooled) == {}
    assert scaled_weights(ResNet(3, 10, width=128, pool_first=True)) == {}  # every stage's conv, pooled, then BN
    assert scaled_weights(ResNet(3, 10, width=128, pool_first=False)) == {}


def test_auto_is_on_for_adam_said_with_the_weights_it_slows_and_off_for_sgd():
    recipe, notes = resolve_fan_in_lr(Recipe(), wide_mlp())
    assert recipe.optim.fan_in_lr is True and "fan-in 3,072: 0.19x" in notes[0] and "0.weight" not in notes[0]
    assert "1.weight" in notes[0]
    batch_norm = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    recipe, notes = resolve_fan_in_lr(Recipe(), batch_norm)
    assert recipe.optim.fan_in_lr is True and "3.weight (fan-in 7,200" in notes[0]
    recipe, notes = resolve_fan_in_lr(load_recipe(None, ["optim.name=sgd"]), wide_mlp())
    assert recipe.optim.fan_in_lr is False and "optim.name=sgd" in notes[0]
    recipe, notes = resolve_fan_in_lr(Recipe(), nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    assert recipe.optim.fan_in_lr is True and notes == []  # nothing to slow: nothing said
    kept, notes = resolve_fan_in_lr(load_recipe(None, ["optim.fan_in_lr=false"]), wide_mlp())
    assert kept.optim.fan_in_lr is False and notes == []
    assert rules.default_fan_in_lr("adamw") and rules.default_fan_in_lr("adam") and not rules.default_fan_in_lr("muon")


def test_a_run_records_the_choice_and_its_optimizer_takes_the_wide_layer_at_its_share(tmp_path, capsys):
    """A user's model with a lazy 768-input layer (16x16 RGB): materialised, then given 576/768 of the LR."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (64, 3, 16, 16), dtype=np.uint8), np.arange(64) % 2
    run = tmp_path / "run"
    overrides = ["train.epochs=1", "train.batch_size=16", "precision=fp32", "run.progress=false",
                 "run.tensorboard=false", "optim.lr=0.004", f"run.dir={run}", "run.save_weights=true"]  # fmt: skip
    hasten.train(None, overrides, model=Net, data=((images, labels), (images[:16], labels[:16]), ["a", "b"]))
    assert yaml.safe_load((run / "recipe.yaml").read_text())["optim"]["fan_in_lr"] is True
    assert "optim.fan_in_lr=auto -> true" in capsys.readouterr().err
    state = torch.load(next((run / "checkpoints").glob("*.pt")), weights_only=True)["optimizer"]
    peaks = sorted({group["initial_lr"] for group in state["param_groups"]})
    batch_lr = 0.004 * (16 / 32) ** 0.5  # the sqrt rule from optim.base_batch 32
    assert peaks == [pytest.approx(batch_lr * 576 / 768), pytest.approx(batch_lr)]
