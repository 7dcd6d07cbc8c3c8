"""A user's images as they come: a list or a Dataset of mixed sizes (grey beside colour, PIL images, arrays, tensors)
trains at data.size or at the median shorter side, as an image folder does; data.resize (squash, crop, pad) applies
to them, is recorded with the decided size and channels in recipe.yaml, and predict, hasten.load and exports bring a
new image to the model as training brought its own (hasten/data/conform.py, hasten/data/fitting.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import hasten
from hasten.cli import main
from hasten.data import user
from hasten.data.datasets import ImageDataset
from hasten.data.user import StreamedData, own_data
from hasten.errors import DataError
from tests.run.test_user import QUIET, TinyNet

FAST = [*QUIET, "train.epochs=1", "precision=fp32", "train.channels_last=false", "data.workers=0"]
SIZES = [(10, 14), (12, 12), (16, 9), (20, 20), (9, 13)]  # (height, width)
MEDIAN = int(np.median([min(h, w) for h, w in SIZES]))  # 12: the side the images are resized to without data.size


def quadrant(label: int, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """H x W x 3 uint8 noise with a bright patch in the quadrant `label` names: learnable at any size."""
    image = rng.integers(0, 100, (height, width, 3), dtype=np.uint8)
    row, col = divmod(label, 2)
    image[row * height // 2 : (row + 1) * height // 2, col * width // 2 : (col + 1) * width // 2] += 150
    return image


def pictures(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """n H x W x 3 uint8 images of the five SIZES in turn, and their labels."""
    rng = np.random.default_rng(seed)
    labels = [i % 4 for i in range(n)]
    return [quadrant(label, rng, *SIZES[i % len(SIZES)]) for i, label in enumerate(labels)], labels


def mixed(n: int, seed: int = 0) -> tuple[list, list[int]]:
    """`pictures` as a user holds them: PIL images, H x W x C arrays and C x H x W tensors in turn."""
    arrays, labels = pictures(n, seed)
    kinds = (Image.fromarray, lambda a: a, lambda a: torch.from_numpy(a.transpose(2, 0, 1).copy()))
    return [kinds[i % 3](array) for i, array in enumerate(arrays)], labels


class Photos(torch.utils.data.Dataset):
    """A user's Dataset of photos as they come: PIL images of the five SIZES, every seventh one grey."""

    def __init__(self, n: int, seed: int = 0):
        arrays, self.labels = pictures(n, seed)
        self.images = [Image.fromarray(a).convert("L" if i % 7 == 0 else "RGB") for i, a in enumerate(arrays)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return self.images[index], self.labels[index]


def mixed_data(n: int = 80) -> tuple:
    """A data target (data.name=import): a list of mixed sizes."""
    return mixed(n)


def recorded(run) -> dict:
    return yaml.safe_load((run / "recipe.yaml").read_text())["data"]


def decided(run) -> tuple:
    """What recipe.yaml records of the images: (data.size, data.rgb, data.resize)."""
    data = recorded(run)
    return data["size"], data["rgb"], data["resize"]


def test_a_list_of_mixed_sizes_trains_at_data_size_and_at_its_median_side(tmp_path, capsys):
    images, labels = mixed(80)
    held = own_data((images, labels), val_fraction=0.25, size=16)
    assert isinstance(held, ImageDataset) and held.train_images.shape[1:] == (3, 16, 16)  # in memory, as one tensor
    assert held.train_images.dtype == torch.uint8 and held.resizer == "pillow"
    overrides = [*FAST, "data.val_fraction=0.25"]
    summary = hasten.train(None, [*overrides, "data.size=16", f"run.dir={tmp_path / 'a'}"], model=TinyNet,
                           data=(images, labels))  # fmt: skip
    assert decided(tmp_path / "a") == (16, True, "squash")
    pre = summary["preprocessing"]
    assert (pre["height"], pre["width"], pre["resize"], pre["fit"]) == (16, 16, "pillow", "squash")
    capsys.readouterr()
    summary = hasten.train(None, [*overrides, f"run.dir={tmp_path / 'b'}"], model=TinyNet, data=(images, labels))
    note = f"data.size: the images come in 5 sizes (9-20 x 9-20 pixels); each is resized to {MEDIAN}x{MEDIAN}"
    assert note in " ".join(capsys.readouterr().err.split())  # said at the start, as for a folder
    assert recorded(tmp_path / "b")["size"] == MEDIAN and summary["preprocessing"]["height"] == MEDIAN


def test_a_dataset_of_mixed_sizes_and_modes_streams_each_item_brought_to_the_size(tmp_path, capsys):
    photos = Photos(80)
    streamed = own_data(photos, val_fraction=0.25, size=16, fit="crop")
    assert isinstance(streamed, StreamedData) and streamed.image_shape == (3, 16, 16)
    images, labels = streamed.train.batches()[list(range(8))]
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.uint8 and len(labels) == 8
    assert any("data.rgb: the images looked at have 1 or 3 channels" in n for n in streamed.notes)
    overrides = [*FAST, "data.val_fraction=0.25", "data.workers=1"]
    summary = hasten.train(None, [*overrides, "data.size=16", "data.resize=crop", f"run.dir={tmp_path / 'a'}"],
                           model=TinyNet, data=photos)  # fmt: skip
    assert decided(tmp_path / "a") == (16, True, "crop")
    assert summary["preprocessing"]["fit"] == "crop" and summary["preprocessing"]["resize"] == "pillow"
    capsys.readouterr()
    summary = hasten.train(None, [*overrides, "data.resize=pad", f"run.dir={tmp_path / 'b'}"], model=TinyNet,
                           data=photos)  # fmt: skip
    said = " ".join(capsys.readouterr().err.split())
    assert f"each is resized to {MEDIAN}x{MEDIAN}, the median shorter side" in said and "read as RGB" in said
    assert decided(tmp_path / "b") == (MEDIAN, True, "pad")
    assert summary["epochs"] == 1 and summary["preprocessing"]["height"] == MEDIAN


def test_the_decided_size_and_channels_are_recorded_and_read_the_same_when_run_again(tmp_path):
    """By import path too (data.name=import), and for arrays of one size: recipe.yaml holds no null it decided."""
    overrides = [*FAST, "data.val_fraction=0.25", "data.name=import", f"data.target={__name__}:mixed_data",
                 "model.name=import", "model.target=tests.run.test_user:TinyNet"]  # fmt: skip
    first = hasten.train(None, [*overrides, f"run.dir={tmp_path / 'a'}"])
    assert decided(tmp_path / "a") == (MEDIAN, True, "squash")
    again = hasten.train(str(tmp_path / "a" / "recipe.yaml"), [f"run.dir={tmp_path / 'b'}"])
    assert again["preprocessing"] == first["preprocessing"] and recorded(tmp_path / "b") == recorded(tmp_path / "a")
    grey = np.random.default_rng(0).integers(0, 255, (40, 10, 10), dtype=np.uint8)  # arrays of one size, grey
    hasten.train(None, [*FAST, "data.val_fraction=0.25", f"run.dir={tmp_path / 'c'}"], model=TinyNet(in_channels=1),
                 data=(grey, np.arange(40) % 4))  # fmt: skip
    assert decided(tmp_path / "c") == (10, False, "squash")


def test_predict_from_the_run_folder_applies_the_recorded_mode(tmp_path, capsys):
    """Images 8 x 16 whose left, centre and right differ: crop keeps the centre, squash would keep all three; the run
    folder, the command line and an export give the model the pixels training gave it."""
    rng = np.random.default_rng(1)
    labels = [i % 4 for i in range(64)]
    images = [Image.fromarray(quadrant(label, rng, 8, 16)) for label in labels]
    run = tmp_path / "run"
    result = hasten.train(None, [*FAST, "data.size=8", "data.resize=crop", "data.val_fraction=0.25", "model.width=4",
                                 f"run.dir={run}"], data=(images, labels))  # fmt: skip
    picture = tmp_path / "one.png"
    images[0].save(picture)
    seen = own_data((images, labels), val_fraction=0.25, size=8, fit="crop")  # what training saw
    seen = torch.cat([seen.train_images, seen.test_images])
    centre = torch.from_numpy(np.asarray(images[0]).transpose(2, 0, 1)[:, :, 4:12].copy())
    assert any(torch.equal(image, centre) for image in seen)
    loaded = hasten.load(run)  # hasten's own model: the command line can rebuild it too
    assert loaded.preprocessing.fit == "crop" and torch.equal(loaded.preprocessing.batch([picture])[0], centre)
    squash = dataclasses.replace(loaded.preprocessing, fit="squash")
    assert not torch.equal(squash.batch([picture])[0], centre)  # the two modes differ on this image
    expected = float(loaded.probabilities(centre[None])[0].max())
    assert result.predict([str(picture)])[0].probability == pytest.approx(expected)
    capsys.readouterr()
    assert main(["predict", str(run), str(picture), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["top"][0]["probability"] == pytest.approx(expected, abs=1e-6)
    exported = hasten.load(result.export(tmp_path / "model.safetensors"))
    assert exported.preprocessing.fit == "crop" and exported.predict([picture])[0].probability == pytest.approx(
        expected
    )


def test_a_bad_resize_value_is_one_line_naming_the_key_and_its_values(capsys):
    assert main(["train", "data.resize=stretch"]) == 2
    err = capsys.readouterr().err
    assert "data.resize: 'stretch' is not one of squash, crop, pad" in err and "Traceback" not in err


def test_an_odd_size_the_sample_missed_is_named_and_floats_keep_their_values(monkeypatch):
    photos = Photos(40)
    photos.images = [Image.fromarray(np.zeros((12, 12, 3), dtype=np.uint8))] * 40
    photos.images[30] = Image.fromarray(np.zeros((10, 14, 3), dtype=np.uint8))
    monkeypatch.setattr(user, "SIZE_SAMPLE", 2)  # the first and the last item of each part are looked at
    streamed = own_data((photos, photos))
    message = streamed.train.batches()[list(range(40))]
    assert isinstance(message, str) and "[30]: image of shape (3, 10, 14)" in message and "(3, 12, 12)" in message
    assert "set data.size" in message
    with pytest.raises(DataError, match=r"\[30\]: image of shape"):
        user.stream_stats(streamed.train)
    assert own_data((photos, photos), size=12).train.batches()[list(range(40))][0].shape == (40, 3, 12, 12)
    floats = [torch.rand(3, 6, 10), torch.rand(3, 10, 6)]  # float tensors of two sizes: streamed, cropped unrounded
    streamed = own_data(((floats * 4, [0, 1] * 4), (floats, [0, 1])), size=6, fit="crop")
    batch = streamed.train.batches()[[0, 1]][0]
    assert torch.equal(batch[0], floats[0][:, :, 2:8]) and torch.equal(batch[1], floats[1][:, 2:8])
