"""Chance is the best constant guess (hasten/run/verdicts.py): on images mostly of one class, a model that always
says that class is at chance however high its accuracy, and the run says so; balanced images keep 1 / classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hasten
from hasten.run.extension import Extension
from hasten.run.verdicts import (
    absent_classes,
    at_chance,
    at_chance_warning,
    chance_line,
    describe_chance,
    learnt_late,
    majority_share,
)
from tests.run.test_extension import Blind
from tests.run.test_user import QUIET


def test_the_largest_class_share_is_chance_where_one_class_stands_out():
    assert majority_share(torch.tensor([0, 0, 0, 1, 2])) == pytest.approx(0.6)
    assert majority_share(torch.tensor([], dtype=torch.int64)) is None and majority_share(None) is None
    # balanced, or within 5% of it: 1 / classes, as without labels
    assert not at_chance(0.20, 10, chance=0.1025) and at_chance(0.185, 10, chance=0.1025)
    assert describe_chance(10, 0.1025) == describe_chance(10) == "10.00% for 10 classes"
    # 80% of one class: 81% is at chance, 83% is not (the line is 80% + a tenth of the rest)
    assert chance_line(0.8) == pytest.approx(0.82)
    assert at_chance(0.81, 4, chance=0.8) and not at_chance(0.83, 4, chance=0.8) and not at_chance(0.81, 4)
    assert describe_chance(4, 0.8) == "80.00%, the largest class's share of them: always guessing it scores that"
    said = at_chance_warning(0.8, 4, 10, ["optim.lr=0.001"], train_accuracy=0.79, chance=0.8, train_chance=0.78)
    assert said is not None and said.startswith("test accuracy 80.00% is at chance level (80.00%, the largest class")
    assert "did not learn" in said  # training at its own chance too
    curve = [[1.0, 100 * (i + 1), a, 1.0] for i, a in enumerate([0.80, 0.80, 0.81, 0.95])]
    assert learnt_late(curve, 4, chance=0.8) == (300, 400) and learnt_late(curve, 4) is None


def test_the_lengthening_reads_the_training_images_chance():
    extension = Extension(0.5, lambda epochs: None)
    assert extension.decide(5, 10, 0.75, 4, learnt_from=1) is None  # 1 / 4 balanced: 75% learnt, since epoch 1
    record = extension.decide(5, 10, 0.75, 4, chance=0.74)  # 74% one class: 75% is the constant guess
    assert record is not None and record["to"] == 20 and record["chance_line"] == pytest.approx(0.766)


def test_a_model_that_always_guesses_the_largest_class_is_warned_at_chance(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.where(rng.random(160) < 0.8, 0, rng.integers(1, 4, 160))  # about 80% class 0, of 4
    images = rng.integers(0, 255, (160, 8, 8, 3), dtype=np.uint8)  # noise: nothing to learn but the share
    data = ((images[:96], labels[:96]), (images[96:], labels[96:]))
    result = hasten.train(None, [*QUIET, "train.epochs=4", "precision=fp32", "optim.lr=0.05", f"run.dir={tmp_path}"],
                          model=Blind, data=data)  # fmt: skip
    share = float(np.mean(labels[96:] == 0))
    assert result["test_accuracy"] == pytest.approx(share)  # the constant guess: high, and nothing learnt
    warned = [w for w in result["warnings"] if "at chance level" in w]
    assert len(warned) == 1 and f"({share:.2%}, the largest class's share of them" in warned[0], result["warnings"]


def test_classes_without_training_images_are_a_warning_and_labels_counted_from_one_are_told_so(tmp_path):
    names = [str(i) for i in range(5)]
    assert absent_classes(torch.tensor([0, 1, 2, 3, 4, 4]), names) is None
    assert absent_classes(torch.tensor([0, 1, 1, 3]), ["a", "b", "c", "d", "e"]).startswith(
        "2 of the 5 classes have no training images ('c', 'e'): the model never learns to predict them"
    )
    assert absent_classes(torch.tensor([1, 2, 3, 4]), names).endswith(
        "the labels run 1..4: if they count from 1, subtract 1 (labels are 0..K-1)"
    )
    from tests.run.test_user import quadrants

    (images, labels), test = quadrants(64, 0), quadrants(32, 1)
    result = hasten.train(None, [*QUIET, "model.width=4", f"run.dir={tmp_path}"],
                          data=((images, labels + 1), (test[0], test[1] + 1)))  # fmt: skip
    assert any("if they count from 1, subtract 1" in text for text in result["warnings"])


class DeadEnd(torch.nn.Module):
    """A ReLU after the classifier that never opens: every class's output 0, a uniform guess's loss."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.head(x) - 1e3)


def test_a_model_whose_outputs_collapse_to_one_for_every_class_is_told_to_try_a_larger_batch_first(tmp_path):
    from tests.run.test_user import quadrants

    data = (quadrants(64, 0), quadrants(32, 1))
    result = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path}"], model=DeadEnd, data=data)
    (warned,) = [text for text in result["warnings"] if "at chance level" in text]
    assert "its outputs became the same for every class (the training loss ended at ln(4) = 1.386" in warned
    assert "try train.batch_size=64 optim.lr=0.00075 first" in warned  # the rule's 0.0015 per 32 for a model without BN
    assert at_chance_warning(0.25, 4, 2, ["optim.lr=0.001"]).endswith("try train.epochs=8, optim.lr=0.001")
