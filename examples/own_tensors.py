"""Example (a): your own CNN on your own tensors, with every hasten technique the recipe switches on.

The data here is scikit-learn's 8x8 handwritten digits, loaded as plain numpy arrays (as your own data would
be): uint8 images N x H x W and integer labels. hasten holds them in memory as one tensor and slices batches.

    python examples/own_tensors.py                       # fashion-fast's settings on this data
    python examples/own_tensors.py precision=fp32 train.epochs=5 tricks.mixup=0.2

The same model and data from the command line, by import path (from the repository root):

    python -m hasten train fashion-fast model.name=import model.target=examples.own_tensors:DigitNet \\
        model.args={width: 32} data.name=import data.target=examples.own_tensors:load_digits

HASTEN_EXAMPLE_SMALL=1 makes it a seconds-long run (the test suite runs it that way).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from torch import Tensor, nn

import hasten

SMALL = bool(os.environ.get("HASTEN_EXAMPLE_SMALL"))


class DigitNet(nn.Module):
    """A plain CNN written without hasten in mind; hasten passes num_classes and in_channels from the data."""

    def __init__(self, num_classes: int, in_channels: int, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveMaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * width, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def load_digits(small: bool = SMALL) -> tuple:
    """(train, test, class_names), each part an (images, labels) pair of numpy arrays."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255, N x 8 x 8
    labels = digits.target
    order = np.random.default_rng(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = 1400 if not small else 300
    end = len(labels) if not small else 400
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    return (images[:cut], labels[:cut]), (images[cut:end], labels[cut:end]), names


def main(overrides: list[str]) -> dict:
    small = ["train.epochs=1", "run.progress=false", "train.threads=1", "tricks.ema=0"] if SMALL else []
    # the recipe keeps every setting; digits are not mirror images (no flips); translate=1 suits 8 pixels
    settings = ["data.augment.translate=1", "data.augment.flip=false", "train.tta_flip=false", "train.batch_size=64"]
    settings.append("run.dir=runs/own-tensors")
    summary = hasten.train("fashion-fast", [*settings, *small, *overrides], model=DigitNet, data=load_digits())
    print(f"test accuracy {summary['test_accuracy']:.4f} on {summary['evaluated_on']}; run folder {summary['run_dir']}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
