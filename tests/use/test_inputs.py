"""What predict and evaluate take from a user's Python (hasten/use/load.py's `Predicts`, hasten/data/preprocessing.py):
one image or a batch, in each layout training takes, and the input they refuse, each refusal naming what is wrong.
A stand-in model whose logits are an image's first pixels serves: no training needed to see which image went where."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import Tensor

import hasten
from hasten.data.preprocessing import Preprocessing
from hasten.errors import DataError, HastenError, RecipeError
from hasten.use.load import Predicts
from hasten.use.result import Trained

CLASSES = [f"c{i}" for i in range(10)]


class FirstPixels(Predicts):
    """Logits: the first ten values of each normalised image, so each image's top class is where its brightest
    early pixel is."""

    def __init__(self, mode: str):
        channels = {"L": 1, "RGB": 3}[mode]
        self.classes = CLASSES
        self.preprocessing = Preprocessing(mode, 8, 8, (0.5,) * channels, (0.25,) * channels)

    def logits_of(self, pixels: Tensor) -> Tensor:
        return self.preprocessing.normalise(pixels).flatten(1)[:, : len(self.classes)]


def grey_images(count: int = 4) -> np.ndarray:
    """(N, 8, 8) uint8, image i brightest at its pixel i (so its class is c{i})."""
    images = np.full((count, 8, 8), 10, np.uint8)
    for i in range(count):
        images[i, 0, i] = 250
    return images


def labels_of(predictions) -> list[str]:
    return [p.label for p in predictions]


def test_one_grey_image_without_a_batch_axis_gives_one_prediction_in_each_layout():
    model, images = FirstPixels("L"), grey_images()
    expected = labels_of(model.predict(images[1:2]))
    assert expected == ["c1"]
    for one in (images[1], images[1][..., None], images[1][None], torch.from_numpy(images[1])):
        predicted = model.predict(one)
        assert labels_of(predicted) == expected and predicted[0].source == "#0", one.shape
    assert labels_of(model.predict(Image.fromarray(images[1]))) == expected  # a Pillow image alone
    assert model.probabilities(images[1]).shape == (1, len(CLASSES))
    assert labels_of(model.predict(images)) == ["c0", "c1", "c2", "c3"]  # a batch stays a batch


def test_one_colour_image_without_a_batch_axis_gives_one_prediction_channels_first_or_last():
    model = FirstPixels("RGB")
    colour = np.repeat(grey_images()[..., None], 3, -1)  # (N, H, W, 3)
    expected = labels_of(model.predict(colour[2:3]))
    assert expected == ["c2"]
    assert labels_of(model.predict(colour[2])) == expected  # (H, W, 3)
    assert labels_of(model.predict(colour[2].transpose(2, 0, 1))) == expected  # (3, H, W)
    assert labels_of(model.predict(Image.fromarray(colour[2]))) == expected


def test_a_shape_that_reads_two_ways_or_none_is_refused_naming_it():
    grey, colour = FirstPixels("L"), FirstPixels("RGB")
    one_colour = np.repeat(grey_images()[0][..., None], 3, -1)  # (8, 8, 3): one RGB image, or 8 images 8 x 3
    with pytest.raises(DataError, match=r"images: \(8, 8, 3\) reads as one image .* or as 8 grey images"):
        grey.predict(one_colour)
    with pytest.raises(DataError, match=r"expected uint8 pixels \(N, 3, H, W\).* got torch.uint8 \(8, 8\)"):
        colour.predict(grey_images()[0])
    with pytest.raises(DataError, match=r"images\[1\]: \(2, 8, 8\) is 2 images, where a list holds one image"):
        grey.predict([grey_images()[0], grey_images(2)])


def stand_in_result(mode: str = "L") -> Trained:
    """What hasten.train returns, its model the stand-in (loaded already: no run folder is read)."""
    result = Trained({"run_dir": "unread"})
    result._loaded = FirstPixels(mode)
    return result


def test_evaluate_takes_labels_as_training_does_and_refuses_a_label_no_class_has():
    result, images = stand_in_result(), grey_images()
    indices = np.arange(4)
    expected = result.evaluate((images, indices))
    assert expected["accuracy"] == 1.0 and expected["images"] == 4
    for labels in (indices.astype(np.float64), np.eye(10)[indices], [f"c{i}" for i in indices],
                   np.array([f"c{i}" for i in indices])):  # fmt: skip
        assert result.evaluate((images, labels)) == expected
    for wrong, found in ((indices - 1, r"found -1 at index 0"), (indices + 7, r"found 10 at index 3")):
        with pytest.raises(DataError, match=r"evaluate: labels: labels outside \[0, 10\).*" + found):
            result.evaluate((images, wrong))
    with pytest.raises(DataError, match=r"evaluate: label 'dog' is not one of the class names"):
        result.evaluate((images, ["c0", "c1", "dog", "c3"]))
    with pytest.raises(DataError, match=r"evaluate: labels: labels must be class indices.* 2.5 at index 1"):
        result.evaluate((images, [0, 2.5, 2, 3]))
    with pytest.raises(DataError, match=r"evaluate: labels: 4 images but 3 labels"):
        result.evaluate((images, indices[:3]))


def test_images_holding_nan_or_inf_are_refused_as_training_refuses_them():
    model = FirstPixels("L")
    images = grey_images().astype(np.float32)
    images[2, 3, 3] = np.nan
    with pytest.raises(DataError, match=r"images: 1 pixel value\(s\) are NaN \(first in image 2\); replace them"):
        model.predict(images)
    images[2, 3, 3], images[1, 0, 0] = 0, np.inf
    with pytest.raises(DataError, match=r"are inf \(first in image 1\)"):
        model.probabilities(images)
    with pytest.raises(DataError, match=r"are NaN"):
        model.predict([np.full((8, 8), np.nan, np.float32)])


@pytest.mark.parametrize("top_k", [0, -1, 2.5, "3", None, True])
def test_a_top_k_that_is_not_a_count_of_classes_is_refused_naming_it(top_k):
    result = stand_in_result()
    for call in (lambda: result.predict(grey_images(), top_k=top_k),
                 lambda: result.evaluate((grey_images(), np.arange(4)), top_k=top_k)):  # fmt: skip
        with pytest.raises(HastenError, match=rf"top_k: {re.escape(repr(top_k))} .*give a whole number of 1 or more"):
            call()


def test_top_k_lists_that_many_classes_and_at_most_all():
    result = stand_in_result()
    assert [len(p.top) for p in result.predict(grey_images(2), top_k=np.int64(3))] == [3, 3]
    assert len(result.predict(grey_images(1), top_k=20)[0].top) == len(CLASSES)
    assert "top10_accuracy" in result.evaluate((grey_images(), np.arange(4)), top_k=20)


@pytest.mark.parametrize(
    ("recipe", "overrides", "said"),
    [
        (None, "train.epochs=1 run.dir=x", r"overrides: a list of 'key=value' strings, got one string \('train"),
        (None, {"train.epochs": 1}, r"overrides: a list of 'key=value' strings.*got dict"),
        (None, ["train.epochs=1", 2], r"overrides: .*got 2 \(int\) among them"),
        ({"train": {"epochs": 1}}, [], r"recipe: a Recipe, a YAML file's path or a shipped recipe's name .*got dict"),
    ],
)
def test_train_refuses_a_recipe_or_overrides_of_another_kind_naming_the_argument(recipe, overrides, said):
    with pytest.raises(RecipeError, match=said):
        hasten.train(recipe, overrides, data=(grey_images(), np.arange(4)))


@pytest.mark.parametrize(
    ("device", "said"),
    [("gpu0", r"device: 'gpu0' is not auto, cpu, cuda, cuda:N or mps"), (3, r"device: 3 is not auto")]
    + [("cuda", r"device: cuda asked for, but this machine has no CUDA device")] * (not torch.cuda.is_available())
    + [("cuda:99", r"device: cuda:99: this machine has \d+ CUDA device")] * torch.cuda.is_available(),
)
def test_load_refuses_a_device_as_training_does_before_reading_the_source(device, said, tmp_path):
    with pytest.raises(RecipeError, match=said):
        hasten.load(tmp_path / "no-such-run", device=device)
