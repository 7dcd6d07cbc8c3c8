"""A class whose output is the same for every test image (a ReLU after the classifier that stopped at 0 for it) is
said at the end of the run, named (hasten/run/evaluation.py `constant_outputs`, hasten/run/verdicts.py
`constant_classes_warning`): the accuracy alone does not show that part of the model is dead."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import hasten
from hasten.run.evaluation import CONSTANT_MIN_IMAGES, Measured, constant_outputs
from hasten.run.verdicts import constant_classes_warning
from tests.run.test_user import QUIET


class ReluHead(nn.Module):
    """A small CNN whose classifier is followed by a ReLU, as some tutorials write it; the last class's unit starts
    dead (zero weights, bias -5: 0 for every image, so no gradient ever reaches it); the others start at +2, which a
    few dozen Adam steps of about the LR each cannot bring under 0."""

    def __init__(self, num_classes: int, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(8, num_classes)
        with torch.no_grad():
            self.classifier.bias.fill_(2.0)
            self.classifier.weight[-1].zero_()
            self.classifier.bias[-1] = -5.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.classifier(self.features(x).flatten(1)))


def colour_classes(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8x8 RGB noise with one bright channel a class (class 3: all three dim), 4 classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, count)
    images = rng.integers(0, 60, (count, 8, 8, 3), dtype=np.uint8)
    for channel in range(3):
        images[labels == channel, :, :, channel] += 180
    return images, labels


def test_a_class_whose_output_never_moves_is_named_at_the_end(tmp_path):
    train, test = colour_classes(192, 0), colour_classes(64, 1)
    result = hasten.train(None, [*QUIET, "train.epochs=3", "precision=fp32", f"run.dir={tmp_path}"],
                          model=ReluHead, data=(train, test, ["red", "green", "blue", "dim"]))  # fmt: skip
    said = [w for w in result["warnings"] if "got the same output" in w]
    assert said == [
        "1 of the 4 classes ('dim') got the same output (0) for every test image: what the model says of them does "
        "not depend on the image. A ReLU or another clamp after the model's last layer that stopped at 0 for a "
        "class passes it no gradient again, so no longer run mends it: end the model in its last layer, with no "
        "activation after it (the loss takes its outputs as logits)"
    ], result["warnings"]
    assert result["test_accuracy"] > 0.5  # the three live classes learnt: the accuracy alone looks like a model
    assert any("(a ReLU at its end?)" in w for w in result["warnings"])  # said at the start too


def test_the_constant_classes_of_an_evaluation():
    measured = Measured(*(torch.zeros((), dtype=torch.long) for _ in range(3)), torch.zeros((), dtype=torch.long))
    assert constant_outputs(measured, torch.device("cpu")) == ()  # nothing seen: nothing to say
    measured.low, measured.high = torch.tensor([0.0, -1.5, 2.0]), torch.tensor([0.0, 3.0, 2.0])
    measured.count = CONSTANT_MIN_IMAGES
    assert constant_outputs(measured, torch.device("cpu")) == ((0, 0.0), (2, 2.0))
    measured.count = CONSTANT_MIN_IMAGES - 1  # a few alike images could give one output by themselves
    assert constant_outputs(measured, torch.device("cpu")) == ()


def test_the_warning_names_up_to_five_and_leaves_a_whole_collapse_to_the_chance_warning():
    names = [f"c{i}" for i in range(10)]
    assert constant_classes_warning((), 10, names) is None
    assert constant_classes_warning(tuple((c, 0.0) for c in range(10)), 10, names) is None  # every class: collapsed
    said = constant_classes_warning(tuple((c, 0.0) for c in range(7)), 10, names)
    assert said is not None and said.startswith("7 of the 10 classes ('c0', 'c1', 'c2', 'c3', 'c4', ...) got the same")
    said = constant_classes_warning(((1, 0.0), (4, 0.25)), 10)  # no names: the index; two outputs
    assert said is not None and said.startswith("2 of the 10 classes ('1', '4') got the same output (one value each)")
