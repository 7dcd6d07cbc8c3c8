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
from hasten.errors import DataError, HastenError
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


def test_a_run_on_four_channel_arrays_predicts_evaluates_and_exports_from_its_folder(tmp_path, capsys):
    """RGBA pixels (N, H, W, 4): the run records Pillow's RGBA mode, so files are read into it (given alpha)."""
    (train, train_labels), (test, test_labels) = quadrants(128, 0), quadrants(64, 1)
    alpha = lambda images: np.concatenate([images, np.full(images.shape[:3] + (1,), 255, np.uint8)], axis=3)  # noqa: E731
    test4 = alpha(test)
    result = hasten.train(None, [*QUIET, "precision=fp32", "model.width=4", f"run.dir={tmp_path / 'run'}"],
                          data=((alpha(train), train_labels), (test4, test_labels), CLASSES))  # fmt: skip
    assert json.loads((result.run_dir / "summary.json").read_text())["preprocessing"]["mode"] == "RGBA"
    assert result.evaluate((test4, test_labels))["accuracy"] == pytest.approx(result["test_accuracy"])
    picture = tmp_path / "one.png"
    Image.fromarray(test[0]).save(picture)  # an RGB file: converted to RGBA, opaque, as the arrays were
    capsys.readouterr()
    assert main(["predict", str(result.run_dir), str(picture)]) == 0
    assert result.predict(test4[:1])[0].label in capsys.readouterr().out
    session = onnxruntime.InferenceSession(str(result.export(tmp_path / "m.onnx")), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixels": np.ascontiguousarray(test4.transpose(0, 3, 1, 2))})[0]
    assert (logits.argmax(1) == test_labels).mean() == pytest.approx(result["test_accuracy"])


def test_a_run_on_floats_in_0_1_reads_pixels_and_files_as_pixels_over_255_and_leaves_the_floats_as_they_were(
    tmp_path, capsys
):
    """Floats in [0, 1] (ToTensor's habit): a file's or a uint8 array's pixels / 255 are what training saw."""
    (train, train_labels), (test, test_labels) = quadrants(128, 0), quadrants(64, 1)
    floats = lambda images: images.astype(np.float32) / 255  # noqa: E731
    given = floats(test)
    kept = given.copy()
    result = hasten.train(None, [*QUIET, "precision=fp32", "model.width=4", f"run.dir={tmp_path / 'run'}"],
                          data=((floats(train), train_labels), (given, test_labels), CLASSES))  # fmt: skip
    pre = json.loads((result.run_dir / "summary.json").read_text())["preprocessing"]
    assert pre["units"] == "fraction" and pre["value_range"][0] >= 0 and pre["value_range"][1] <= 1
    assert result.evaluate((given, test_labels))["accuracy"] == pytest.approx(result["test_accuracy"])
    assert torch.allclose(result.probabilities(test), result.probabilities(given), atol=1e-5)  # uint8 pixels: the same
    assert np.array_equal(given, kept)  # predicting on the user's floats leaves them as they were
    picture = tmp_path / "one.png"
    Image.fromarray(test[0]).save(picture)
    capsys.readouterr()
    assert main(["predict", str(result.run_dir), str(picture)]) == 0
    assert result.predict(test[:1])[0].label in capsys.readouterr().out
    with pytest.raises(DataError, match=r"float images of \(24, 24\) pixels where the model takes 12 x 12"):
        result.predict(np.zeros((2, 24, 24, 3), np.float32))


def test_a_run_on_floats_normalised_by_the_users_code_takes_such_floats_and_refuses_pixels(tmp_path):
    (train, train_labels), (test, test_labels) = quadrants(128, 0), quadrants(64, 1)
    normalised = lambda images: (images.astype(np.float32) / 255 - 0.45) / 0.25  # noqa: E731 - Normalize's habit
    data = ((normalised(train), train_labels), (normalised(test), test_labels), CLASSES)
    result = hasten.train(None, [*QUIET, "precision=fp32", "model.width=4", f"run.dir={tmp_path / 'run'}"], data=data)
    assert json.loads((result.run_dir / "summary.json").read_text())["preprocessing"]["units"] == "own"
    assert result.evaluate((normalised(test), test_labels))["accuracy"] == pytest.approx(result["test_accuracy"])
    with pytest.raises(DataError, match=r"trained on float images of values -1.8 to 1.95.*cannot be brought to them"):
        result.predict(test[:2])
    session = onnxruntime.InferenceSession(str(result.export(tmp_path / "m.onnx")), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)"  # the graph takes the floats, as training did
    logits = session.run(None, {"pixels": np.ascontiguousarray(normalised(test).transpose(0, 3, 1, 2))})[0]
    assert (logits.argmax(1) == test_labels).mean() == pytest.approx(result["test_accuracy"])


@pytest.mark.parametrize(
    ("value_range", "units"),
    [(None, "pixels"), ((0.0, 1.0), "fraction"), ((0.0, 0.8), "fraction"), ((0.0, 255.0), "pixels"),
     ((3.0, 201.0), "pixels"), ((0.0, 16.0), "own"), ((-2.1, 2.6), "own"), ((0.0, 1000.0), "own")],
)  # fmt: skip
def test_the_units_of_float_images_are_read_off_their_values_and_a_scale_unlike_pixels_is_their_own(value_range, units):
    from hasten.data.preprocessing import units_of

    assert units_of(value_range) == units  # scikit-learn's digits, 0..16: their own, which no file's pixels map to


class DoubleNet(TinyNet):
    """A user's model built in float64 that casts its input itself (`x.double()`): it trains as it is."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.double())


def test_a_float64_model_predicts_and_exports_safetensors_and_its_onnx_refusal_says_why(tmp_path):
    """onnxruntime has no float64 convolution: the ONNX file is set aside as unverified, with the reason, instead of
    a traceback and a file that looks exported; the network keeps its own dtype (cast to float32, its `x.double()`
    would meet float32 weights)."""
    train, test = quadrants(96, 0), quadrants(32, 1)
    result = hasten.train(None, [*QUIET, "precision=fp32", "train.epochs=1", f"run.dir={tmp_path / 'run'}"],
                          model=DoubleNet, data=(train, test, CLASSES))  # fmt: skip
    probabilities = result.probabilities(test[0][:4])
    assert probabilities.dtype == torch.float32 and torch.allclose(probabilities.sum(1), torch.ones(4))
    weights = result.export(tmp_path / "m.safetensors")
    again = hasten.load(weights, model=DoubleNet)
    assert torch.allclose(again.probabilities(test[0][:4]), probabilities)
    with pytest.raises(HastenError, match=r"float64: onnxruntime's CPU kernels .* float32 only") as error:
        result.export(tmp_path / "m.onnx")
    assert "m.onnx.unverified" in str(error.value)
    assert not (tmp_path / "m.onnx").exists() and (tmp_path / "m.onnx.unverified").is_file()


class RowGRU(torch.nn.Module):
    """A user's recurrent model: the image read row by row by a GRU."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.rnn = torch.nn.GRU(in_channels * 12, 16, batch_first=True)
        self.head = torch.nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.permute(0, 2, 1, 3).flatten(2)  # N x H x (C*W)
        return self.head(self.rnn(rows)[0][:, -1])


def test_a_recurrent_model_exports_without_torchs_notice_about_its_own_weights(tmp_path, recwarn):
    """torch.export warns that a GRU's `_flat_weights` "were assigned during export" (the module re-assigns its own
    list): nothing the user can change, so the export keeps it out of their output; the graph still matches."""
    train, test = quadrants(64, 0), quadrants(32, 1)
    result = hasten.train(None, [*QUIET, "precision=fp32", "train.epochs=1", f"run.dir={tmp_path / 'run'}"],
                          model=RowGRU, data=(train, test, CLASSES))  # fmt: skip
    onnx = result.export(tmp_path / "m.onnx")
    assert not [w for w in recwarn if "were assigned during export" in str(w.message)]
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixels": np.ascontiguousarray(test[0].transpose(0, 3, 1, 2))})[0]
    assert np.array_equal(logits.argmax(1), result.probabilities(test[0]).argmax(1).numpy())


def test_export_from_python_names_the_python_switch_and_reads_a_home_folder(trained, tmp_path, monkeypatch):
    """The refusal of an existing file said `pass --overwrite`, a command-line flag, to a Python caller; and
    "~/m.safetensors" made a folder named ~ in the current folder."""
    from hasten.errors import HastenError

    result, _ = trained
    out = result.export(tmp_path / "m.safetensors")
    with pytest.raises(HastenError, match=r"pass overwrite=True to replace it"):
        result.export(out)
    assert result.export(out, overwrite=True) == out
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    written = result.export("~/m.safetensors")
    assert written == tmp_path / "home" / "m.safetensors" and written.is_file() and not (tmp_path / "~").exists()


def test_float_images_on_another_scale_than_trainings_are_warned_of(trained, capsys):
    """Trained on uint8 pixels, given floats in 0..1: every image read as nearly black and got one class, without a
    word. Now a warning says which scale the model wants; pixels on its own scale say nothing."""
    result, (images, _) = trained
    capsys.readouterr()
    result.predict(images[:4].astype(np.float32) / 255)
    err = capsys.readouterr().err
    assert "warning: images are floats in" in err and "multiply them by 255" in err
    result.predict(images[:4].astype(np.float32))
    assert "warning" not in capsys.readouterr().err
