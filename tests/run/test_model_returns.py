"""A model that returns its logits inside something else trains on them: a tuple with an auxiliary head's or the
features (torchvision's GoogLeNet in training, `(features, logits)`), a mapping or an object with `logits` (Hugging
Face's outputs); the rest is left out of the loss, and the run says where the logits came from
(hasten/models/user.py: main_output, OutputReader)."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import hasten
from hasten.errors import RecipeError
from hasten.models.user import check_model, describe_output, main_output
from tests.run.test_model_output import Logits
from tests.run.test_user import quadrants

Outputs = namedtuple("Outputs", ["logits", "aux_logits"])  # torchvision's GoogLeNetOutputs, in form


def test_the_logits_are_found_in_what_a_model_returns():
    logits, features = torch.randn(4, 10), torch.randn(4, 32)
    assert main_output(logits, 10) is logits
    assert main_output({"logits": logits, "hidden": features}, 10) is logits
    assert main_output(SimpleNamespace(logits=logits, loss=None), 10) is logits
    assert main_output((logits, features), 10) is logits
    assert main_output([features, logits], 10) is logits  # (features, logits): the first of shape (N, 10)
    assert main_output(Outputs(logits, torch.randn(4, 10)), 10) is logits  # the main head first, as torchvision's
    assert main_output((features, features), 10) is None and main_output({"out": logits}, 10) is None
    assert describe_output((features, logits), 10) == (
        "element 1 of the tuple it returns ((4, 32), (4, 10)): the first of shape (N, 10)"
    )
    assert describe_output({"logits": logits}, 10) == "its `logits` (dict)" and describe_output(logits, 10) is None


class FeaturesAndLogits(Logits):
    def forward(self, x):
        features = self.features(x)
        return features, self.head(features)


class HuggingFaceStyle(Logits):
    def forward(self, x):
        return {"logits": self.head(self.features(x))}


class AuxInTraining(Logits):
    """Returns (logits, aux_logits) in training and the logits alone in evaluation, as GoogLeNet does."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        self.aux = nn.Linear(32, num_classes)

    def forward(self, x):
        features = self.features(x)
        logits = self.head(features)
        return Outputs(logits, self.aux(features)) if self.training else logits


@pytest.mark.parametrize("model", [FeaturesAndLogits, HuggingFaceStyle, AuxInTraining])
def test_a_model_returning_more_than_its_logits_trains_predicts_and_loads(tmp_path, model, capsys):
    data = (quadrants(96, 0), quadrants(48, 1))
    overrides = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "train.batch_size=16",
                 "train.epochs=6", "precision=fp32", "optim.lr=0.01", f"run.dir={tmp_path}"]  # fmt: skip
    result = hasten.train(None, overrides, model=model, data=data)
    assert result["test_accuracy"] >= 0.75  # four quadrants: learnt, from the logits
    said = capsys.readouterr().err
    if model is FeaturesAndLogits:
        assert "its class logits are element 1 of the tuple it returns ((2, 32), (2, 4))" in " ".join(said.split())
    images, labels = data[1]
    predicted = [p.index for p in result.predict(images[:8])]
    loaded = hasten.load(tmp_path, model=model)
    assert [p.index for p in loaded.predict(images[:8])] == predicted
    assert float(np.mean(np.array(predicted) == labels[:8])) >= 0.5


def test_a_tuple_without_logits_is_refused_naming_what_it_holds():
    class FeaturesOnly(Logits):
        def forward(self, x):
            features = self.features(x)
            return features, features

    with pytest.raises(RecipeError, match=r"returns a tuple of \(2, 32\), \(2, 32\) for a batch of 2 images"):
        check_model(FeaturesOnly(), (3, 12, 12), 4, torch.device("cpu"))
