"""Dataset readers: each turns a dataset's files (or its seed) into uint8 image and int64 label arrays, and its
class names. The registry (hasten/data/registry.py) names each dataset's reader, so a new dataset is its reader
and its registry entry. Every reader has the signature of `Reader`."""

from __future__ import annotations

import importlib.metadata
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy

from hasten.data.cache import cache_folder
from hasten.data.cifar import read_cifar
from hasten.data.idx import read_idx_pair
from hasten.errors import DataError
from hasten.files import write_atomic_bytes

# train images [N, C, H, W] uint8, train labels [N] int64, test images, test labels, class names
Arrays = tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, numpy.ndarray, Sequence[str]]


@dataclass(frozen=True)
class ReadOptions:
    """What a generated dataset depends on (file-backed readers ignore it)."""

    synthetic_size: int = 512
    seed: int = 0


class Spec(Protocol):
    """What a reader reads of a dataset's registry entry (hasten/data/registry.py's DatasetSpec)."""

    name: str
    files: Any  # role -> FileSpec
    num_classes: int
    classes: tuple[str, ...]

    def path_of(self, folder: Path, file: Any) -> Path | None: ...


Reader = Callable[[Spec, Path | None, ReadOptions], Arrays]  # folder: None for datasets without files


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
    split 80/20, stratified by class, with a fixed seed so every run sees the same test set. Kept in hasten's cache
    folder after the first read (one file per scikit-learn version), so a later run does not import scikit-learn:
    importing it was 1.5 s of a 7 s three-epoch run."""
    path = _digits_cache_path()
    cached = _read_digits_cache(path) if path is not None else None
    if cached is not None:
        return cached
    arrays = _digits_from_sklearn()
    if path is not None:
        _write_digits_cache(path, arrays)
    return arrays


DIGITS_KEYS = ("train_images", "train_labels", "test_images", "test_labels")


def _digits_from_sklearn() -> tuple[numpy.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = numpy.rint(digits.images * (255 / 16)).astype(numpy.uint8)[:, None, :, :]
    labels = digits.target.astype(numpy.int64)
    train, test = train_test_split(numpy.arange(len(labels)), test_size=0.2, random_state=0, stratify=labels)
    return images[train], labels[train], images[test], labels[test]


def _digits_cache_path() -> Path | None:
    """The cached arrays' file, named by scikit-learn's version (its split could change with it); None when
    scikit-learn is not installed (the read then fails as it would without a cache)."""
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return None
    return cache_folder("digits") / f"digits-sklearn-{version}.npz"


def _read_digits_cache(path: Path) -> tuple[numpy.ndarray, ...] | None:
    """The cached arrays, or None when the file is missing or fails a check (it is then made again): a file in the
    cache is data, read without pickle, its dtypes, shapes and labels checked."""
    try:
        with numpy.load(path, allow_pickle=False) as saved:
            arrays = tuple(saved[key] for key in DIGITS_KEYS)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    images, labels = arrays[0::2], arrays[1::2]
    if not all(i.dtype == numpy.uint8 and i.ndim == 4 and i.shape[1:] == (1, 8, 8) for i in images):
        return None
    if not all(y.dtype == numpy.int64 and y.shape == (len(i),) and len(y) for i, y in zip(images, labels, strict=True)):
        return None
    if any(y.min() < 0 or y.max() > 9 for y in labels) or sum(len(y) for y in labels) != 1797:
        return None
    return arrays


def _write_digits_cache(path: Path, arrays: tuple[numpy.ndarray, ...]) -> None:
    """Written atomically (a reader never sees half a file); a cache that cannot be written (a read-only home) is
    left out, not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_bytes(path, lambda stream: numpy.savez(stream, **dict(zip(DIGITS_KEYS, arrays, strict=True))))
    except OSError:
        pass


def _idx_arrays(spec: Spec, folder: Path) -> tuple[numpy.ndarray, ...]:
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


def read_synthetic(spec: Spec, folder: Path | None, options: ReadOptions) -> Arrays:
    return (*synthetic_arrays(options.synthetic_size, options.seed), spec.classes)


def read_digits(spec: Spec, folder: Path | None, options: ReadOptions) -> Arrays:
    return (*digits_arrays(), spec.classes)


def read_idx(spec: Spec, folder: Path | None, options: ReadOptions) -> Arrays:
    """An MNIST-style dataset: four IDX files (gzipped or not) under their official names in `folder`."""
    assert folder is not None, "load_dataset resolves the folder of a dataset with files"
    return (*_idx_arrays(spec, folder), spec.classes)


def read_cifar_spec(spec: Spec, folder: Path | None, options: ReadOptions) -> Arrays:
    """CIFAR-10/100: the class names come from the archive's meta file."""
    assert folder is not None, "load_dataset resolves the folder of a dataset with files"
    return read_cifar(folder, spec.name)
