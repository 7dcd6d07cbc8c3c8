"""Datasets as whole uint8 tensors in memory: the train and test images and labels, and the class names.

Keeping a small dataset as one tensor and slicing batches out of it is what the fast MNIST and CIFAR
training records do (DESIGN.md, "Where speed comes from"); the batch loader works on this object.
Files are found (or downloaded) by `sources.resolve`; readers live in `idx` and `cifar`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy
import torch

from hasten.data.cifar import read_cifar
from hasten.data.idx import read_idx_pair
from hasten.data.sources import DatasetSpec, get_spec, resolve
from hasten.errors import DataError


@dataclass
class ImageDataset:
    """A labelled image dataset held in memory, images uint8 [N, C, H, W] and labels int64 [N]."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(self.train_images.shape[1:])


def synthetic_arrays(size: int, seed: int) -> tuple[numpy.ndarray, ...]:
    """A learnable stand-in for Fashion-MNIST: 10 classes of 1x28x28 uint8 images, `size` train and `size // 4`
    test, balanced. Class c is a sinusoidal grating at angle c * 18 degrees (frequency and phase drawn from
    `seed`) plus Gaussian noise: oriented edges suit convolutions, and the fixed phase suits linear models."""
    if size < 1:
        raise DataError(f"synthetic_size must be at least 1, got {size}")
    # separate streams, so the prototypes and the test set do not change with the train size
    proto_rng, train_rng, test_rng = (numpy.random.default_rng(s) for s in numpy.random.SeedSequence(seed).spawn(3))
    angles = numpy.arange(10) * numpy.pi / 10
    cycles = proto_rng.uniform(2, 4, size=10)  # per image width
    phases = proto_rng.uniform(0, 2 * numpy.pi, size=10)
    y, x = numpy.mgrid[0:28, 0:28] / 28
    along = numpy.cos(angles)[:, None, None] * x + numpy.sin(angles)[:, None, None] * y
    prototypes = 127.5 + 100 * numpy.sin(2 * numpy.pi * cycles[:, None, None] * along + phases[:, None, None])

    def draw(rng: numpy.random.Generator, n: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        labels = rng.permutation(numpy.arange(n) % 10)
        # noise of sd 64 (a quarter of the range) hides single pixels but not the grating
        pixels = prototypes[labels, None] + rng.normal(0, 64, size=(n, 1, 28, 28))
        return numpy.clip(numpy.rint(pixels), 0, 255).astype(numpy.uint8), labels.astype(numpy.int64)

    return (*draw(train_rng, size), *draw(test_rng, max(size // 4, 1)))


def digits_arrays() -> tuple[numpy.ndarray, ...]:
    """scikit-learn's 8x8 digits (UCI optdigits test set, 1797 images), scaled from 0..16 to 0..255 and
    split 80/20, stratified by class, with a fixed seed so every run sees the same test set."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = numpy.rint(digits.images * (255 / 16)).astype(numpy.uint8)[:, None, :, :]
    labels = digits.target.astype(numpy.int64)
    train, test = train_test_split(numpy.arange(len(labels)), test_size=0.2, random_state=0, stratify=labels)
    return images[train], labels[train], images[test], labels[test]


def _idx_arrays(spec: DatasetSpec, folder: Path) -> tuple[numpy.ndarray, ...]:
    path = {role: spec.path_of(folder, file) for role, file in spec.files.items()}
    train_images, train_labels = read_idx_pair(path["train_images"], path["train_labels"])
    test_images, test_labels = read_idx_pair(path["test_images"], path["test_labels"])
    if train_images.shape[1:] != test_images.shape[1:]:
        raise DataError(
            f"{path['train_images']} holds {train_images.shape[2:]} images but {path['test_images']} "
            f"holds {test_images.shape[2:]}; they are not from the same dataset"
        )
    for labels_path, labels in ((path["train_labels"], train_labels), (path["test_labels"], test_labels)):
        if len(labels) and (labels.min() < 0 or labels.max() >= spec.num_classes):
            raise DataError(f"{labels_path}: labels outside 0..{spec.num_classes - 1}; is this {spec.name}?")
    return train_images, train_labels, test_images, test_labels


def load_dataset(
    name: str,
    root: str | Path | None = None,
    *,
    download: bool = True,
    synthetic_size: int = 512,
    seed: int = 0,
) -> ImageDataset:
    """Dataset `name` (see `DATASETS`) in memory. `root` is a folder holding its files (else they are
    resolved as `sources.resolve` says); `synthetic_size` and `seed` shape only the synthetic dataset."""
    spec = get_spec(name)
    classes = list(spec.classes)
    if name == "synthetic":
        arrays = synthetic_arrays(synthetic_size, seed)
    elif name == "digits":
        arrays = digits_arrays()
    elif spec.cifar_layout is not None:
        *arrays, classes = read_cifar(resolve(name, root, download), name)
    else:
        arrays = _idx_arrays(spec, resolve(name, root, download))
    train_images, train_labels, test_images, test_labels = (torch.from_numpy(a) for a in arrays)
    return ImageDataset(name, train_images, train_labels, test_images, test_labels, classes)
