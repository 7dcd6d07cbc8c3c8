"""A model that returns its logits inside something else trains on them: a tuple with an auxiliary head's or the
features (torchvision's GoogLeNet in training, `(features, logits)`), a mapping or an object with `logits` (Hugging
Face's outputs); the rest is left out of the loss, and the run says where the logits came from
(hasten/models/user.py: main_output, OutputReader)."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from PIL import Image
from torch import nn

import hasten
from hasten.cli import main
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


def halves(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two classes of the quadrants: the patch in the top left (0) or the top right (1)."""
    images, labels = quadrants(2 * n, seed)
    keep = labels < 2
    return images[keep], labels[keep]


class OneLogit(Logits):
    """A binary classifier as tutorials write one for BCEWithLogitsLoss: one output per image."""

    def __init__(self, in_channels: int = 3):
        super().__init__(1, in_channels)


class OneLogitSqueezed(OneLogit):
    def forward(self, x):
        return super().forward(x).squeeze()  # (N,), and () for a batch of one


class OneLogitViewed(OneLogit):
    def forward(self, x):
        return super().forward(x).view(-1)  # (N,), and (1,) for a batch of one


class OneSigmoid(OneLogit):
    def forward(self, x):
        return torch.sigmoid(super().forward(x))


def test_one_output_per_image_on_two_classes_is_read_as_the_logits_0_z():
    z = torch.tensor([[-2.0], [0.5], [3.0]])
    assert torch.equal(main_output(z, 2), torch.tensor([[0.0, -2.0], [0.0, 0.5], [0.0, 3.0]]))
    assert torch.equal(main_output(z.squeeze(1), 2, batch=3), main_output(z, 2))
    assert torch.equal(main_output(torch.tensor(0.5), 2, batch=1), torch.tensor([[0.0, 0.5]]))
    assert torch.equal(main_output(torch.tensor([0.5]), 2, batch=1), torch.tensor([[0.0, 0.5]]))
    # softmax((0, z)) gives class 1 sigmoid(z): BCEWithLogitsLoss's reading
    assert torch.allclose(main_output(z, 2).softmax(1)[:, 1], torch.sigmoid(z[:, 0]))
    # a batch of one's two logits squeezed to (2,) is not two images' one logit each; nor is one output on 3 classes
    assert torch.equal(main_output(torch.tensor([1.0, 2.0]), 2, batch=1), torch.tensor([1.0, 2.0]))
    assert main_output(torch.tensor([1.0, 2.0]), 2) is not None and main_output(z, 3) is z
    assert "for class 1 against class 0" in describe_output(z, 2, batch=3)
    with pytest.raises(RecipeError, match=r"returns \(2, 1\) for a batch of 2 images"):
        check_model(OneLogit(), (3, 12, 12), 4, torch.device("cpu"))


@pytest.mark.parametrize("model", [OneLogit, OneLogitSqueezed, OneLogitViewed, OneSigmoid])
def test_a_binary_classifier_with_one_output_trains_predicts_and_exports(tmp_path, model, capsys):
    """One logit (or a sigmoid's probability) per image on two classes trains as the logits (0, z) (a sigmoid's p as
    (log(1 - p), log p)), the same loss as BCEWithLogitsLoss; no class is warned as constant for the zero column."""
    data = (halves(96, 0), halves(48, 1))
    overrides = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "train.batch_size=16",
                 "train.epochs=6", "precision=fp32", "optim.lr=0.01", f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    result = hasten.train(None, overrides, model=model, data=data)
    said = " ".join(capsys.readouterr().err.split())
    assert result["test_accuracy"] >= 0.9
    assert ("ends in a sigmoid" in said) == (model is OneSigmoid)
    recorded = yaml.safe_load((result.run_dir / "recipe.yaml").read_text())["model"]["output"]
    assert recorded == ("probabilities" if model is OneSigmoid else "logits")
    assert not any("got the same output" in w for w in result["warnings"])
    images, labels = data[1]
    probabilities = result.probabilities(images[:1])  # a batch of one: the squeezed model's () output
    assert probabilities.shape == (1, 2) and torch.allclose(probabilities.sum(1), torch.ones(1))
    predicted = [p.index for p in result.predict(images[:8])]
    assert float(np.mean(np.array(predicted) == labels[:8])) >= 0.75
    picture = tmp_path / "one.png"  # the command line's predict of one file: a batch of one, from the run folder
    Image.fromarray(images[0]).save(picture)
    capsys.readouterr()
    assert main(["predict", str(result.run_dir), str(picture), "--model", f"{__name__}:{model.__name__}"]) == 0
    assert result.predict(images[:1])[0].label in capsys.readouterr().out
    session = onnxruntime.InferenceSession(str(result.export(tmp_path / "m.onnx")), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixels": np.ascontiguousarray(images.transpose(0, 3, 1, 2))})[0]
    assert logits.shape == (len(labels), 2)
    assert (logits.argmax(1) == labels).mean() == pytest.approx(result["test_accuracy"])
