"""What hasten.train returns: the summary dict and the trained model beside it (hasten/use/result.py), and a run
trained on Python objects that predicts and exports from its folder with the preprocessing it recorded."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
import torch
from PIL import Image

import hasten
from hasten.cli import main
from hasten.use.result import Trained
from tests.run.test_user import CLASSES, QUIET, TinyNet, quadrants


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A user's CNN class trained on arrays (train and test given, class names too)."""
    folder = tmp_path_factory.mktemp("result") / "run"
    train, test = quadrants(192, 0), quadrants(64, 1)
    result = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={folder}"], model=TinyNet,
                          data=(train, test, CLASSES))  # fmt: skip
    return result, test


def test_train_returns_the_summary_and_the_model_it_trained(trained):
    result, (images, labels) = trained
    assert isinstance(result, Trained) and isinstance(result, dict)
    assert (
        result["test_accuracy"]
        == result.summary["test_accuracy"]
        == json.loads((result.run_dir / "summary.json").read_text())["test_accuracy"]
    )
    assert result.classes == CLASSES
    # the model as the run evaluated it: its own test images score the run's test accuracy
    scored = result.evaluate((images, labels))
    assert scored["images"] == len(labels) and scored["accuracy"] == pytest.approx(result["test_accuracy"])
    predicted = result.predict(images[:5])  # N x H x W x C uint8, the layout training took
    assert [p.label for p in predicted] == [CLASSES[p.index] for p in predicted]
    assert torch.equal(result.probabilities(images).argmax(1)[:5], torch.tensor([p.index for p in predicted]))


def test_a_run_on_python_objects_exports_and_loads_from_its_folder(trained, tmp_path):
    result, (images, labels) = trained
    onnx = result.export(tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    pixels = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    logits = session.run(None, {"pixels": pixels})[0]
    assert (logits.argmax(1) == labels).mean() == pytest.approx(result["test_accuracy"])
    again = hasten.load(result.run_dir, model=TinyNet)  # the data need not be given again: summary.json has it
    assert torch.allclose(again.probabilities(images), result.probabilities(images))


def test_the_command_line_predicts_from_a_run_trained_on_arrays(tmp_path, capsys):
    """hasten's own model on arrays: `hasten predict RUN img.png` reads the preprocessing the run recorded."""
    train, test = quadrants(192, 0), quadrants(64, 1)
    folder = tmp_path / "run"
    result = hasten.train(None, [*QUIET, "precision=fp32", "model.width=4", f"run.dir={folder}"],
                          data=(train, test, CLASSES))  # fmt: skip
    capsys.readouterr()
    picture = tmp_path / "one.png"
    Image.fromarray(test[0][0]).save(picture)
    assert main(["predict", str(folder), str(picture)]) == 0
    out = capsys.readouterr().out
    assert result.predict([str(picture)])[0].label in out
