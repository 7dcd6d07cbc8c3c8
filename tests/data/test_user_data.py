"""The user's data as hasten.train takes it (hasten/data/user.py, hasten/data/items.py): which form a data argument
is read as, and items a Dataset gives, read without training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hasten.data.user import own_data
from hasten.errors import DataError


def digits(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(N, 8, 8) uint8 noise and labels 0..9, each class present."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, 8, 8), dtype=np.uint8), np.arange(count) % 10


@pytest.mark.parametrize("encode", [lambda y: np.eye(10)[y], lambda y: y[:, None]], ids=["one-hot", "column"])
def test_train_and_test_pairs_with_one_hot_or_column_labels_are_two_parts_not_two_images(encode):
    (train, train_labels), (test, test_labels) = digits(40), digits(20, 1)
    data = own_data(((train, encode(train_labels)), (test, encode(test_labels))))
    assert data.train_images.shape == (40, 1, 8, 8) and data.test_images.shape == (20, 1, 8, 8)
    assert torch.equal(data.train_labels, torch.from_numpy(train_labels))
    assert torch.equal(data.test_labels, torch.from_numpy(test_labels))


def test_class_names_given_twice_are_refused_naming_the_name():
    images, labels = digits(20)
    names = [f"c{i}" for i in range(10)]
    names[7] = "c2"
    with pytest.raises(DataError, match=r"data: the class names of \(images, labels, class_names\): 'c2' is given "
                       r"twice \(at 2 and 7\)"):  # fmt: skip
        own_data((images, labels, names), val_fraction=0.5)
    with pytest.raises(DataError, match=r"\(train, test, class_names\): 'c2' is given twice"):
        own_data(((images, labels), digits(10, 1), names))
    with pytest.raises(DataError, match=r"data.classes: 'c2' is given twice"):
        own_data((images, labels), classes=names, val_fraction=0.5)


class Items(torch.utils.data.Dataset):
    """A user's Dataset: item i is make(i)."""

    def __init__(self, make, count: int = 20):
        self.make, self.count = make, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        return self.make(index)


def test_an_item_whose_image_is_none_or_no_pixels_is_refused_naming_the_item():
    with pytest.raises(DataError, match=r"data: train \(Items\)\[0\]: image is None"):
        own_data((Items(lambda i: (None, i % 10)), Items(lambda i: (None, i % 10))))
    with pytest.raises(DataError, match=r"data: train \(Items\)\[0\]: the image is a dict \(object\), not pixels"):
        own_data((Items(lambda i: ({"pixels": 1}, i % 10)), Items(lambda i: (None, i % 10))))


def test_dataset_and_list_images_take_the_layout_rule_of_arrays_channels_first_or_last():
    images, labels = digits(20)
    colour = np.repeat(images[..., None], 3, -1)
    colour[..., 0] //= 2  # the channels differ, so a swap of axes shows
    expected = own_data((colour, labels), val_fraction=0.5).train_images  # the array path: N x H x W x C
    for layout, make in {
        "numpy C x H x W": lambda i: np.ascontiguousarray(colour[i].transpose(2, 0, 1)),
        "tensor H x W x C": lambda i: torch.from_numpy(colour[i]),
        "numpy H x W x C": lambda i: colour[i],
        "tensor C x H x W": lambda i: torch.from_numpy(colour[i]).permute(2, 0, 1),
    }.items():
        listed = own_data(([make(i) for i in range(20)], labels), val_fraction=0.5)
        assert torch.equal(listed.train_images, expected), layout
        streamed = own_data(Items(lambda i, make=make: (make(i), int(labels[i]))), val_fraction=0.5)
        pixels, _ = streamed.train.batches()[list(range(len(streamed.train.indices)))]
        assert torch.equal(pixels, expected), layout


def test_a_stray_huge_label_is_named_not_blamed_on_the_model():
    """One label of 50,000,000 among 0..9 made a model of 50,000,001 classes, refused as too large a model."""
    from hasten.data.user import check_sparse_labels

    labels = torch.arange(200) % 10
    labels[5] = 50_000_000
    with pytest.raises(DataError, match=r"train label 50,000,000 \(at index 5\) makes 50,000,001 classes, of which 11"):
        check_sparse_labels(labels, torch.arange(20) % 10)
    check_sparse_labels(torch.arange(2000) % 1500, torch.arange(10))  # 1,500 classes, all in use: fine
    sparse = torch.tensor([0, 1, 2, 1999])
    with pytest.raises(DataError, match=r"test label 1,999"):
        check_sparse_labels(torch.tensor([0, 1, 2]), sparse)
