"""load_dataset: digits and synthetic, CIFAR from fake batch folders and archives, refusal of malicious pickles,
and the real Fashion-MNIST where Debian's package is installed."""

from __future__ import annotations

import os
import pickle
import sys
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import numpy
import pytest
import torch

from hasten.data import DATASETS, info, load_dataset, readers, resolve
from hasten.data.cifar import LAYOUTS, read_cifar
from hasten.errors import DataError

CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the user's $HASTEN_DATA or cache leaks in, and nothing is downloaded."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HASTEN_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HASTEN_CACHE", raising=False)  # (the test session sets one)


def check_tensors(dataset, train: int, test: int, shape: tuple[int, int, int]) -> None:
    assert dataset.train_images.shape == (train, *shape) and dataset.train_images.dtype == torch.uint8
    assert dataset.test_images.shape == (test, *shape) and dataset.test_images.dtype == torch.uint8
    assert dataset.train_labels.shape == (train,) and dataset.train_labels.dtype == torch.int64
    assert dataset.test_labels.shape == (test,) and dataset.test_labels.dtype == torch.int64


def test_digits() -> None:
    digits = load_dataset("digits")
    check_tensors(digits, 1437, 360, (1, 8, 8))
    assert digits.classes == [str(d) for d in range(10)]
    assert int(digits.train_images.max()) == 255  # 16 scaled to 255
    # stratified: every class in the test set, 35 or 36 of each
    assert set(torch.bincount(digits.test_labels).tolist()) <= {35, 36, 37}
    again = load_dataset("digits")
    assert torch.equal(digits.test_images, again.test_images) and torch.equal(digits.test_labels, again.test_labels)


def _without_sklearn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any import of scikit-learn from here on fails, as if it were not installed."""
    for name in ("sklearn", "sklearn.datasets", "sklearn.model_selection"):
        monkeypatch.setitem(sys.modules, name, None)


def test_digits_are_read_from_the_cache_without_scikit_learn_after_the_first_run(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    first = readers.digits_arrays()
    (cached,) = (tmp_path / "cache" / "digits").glob("digits-sklearn-*.npz")
    _without_sklearn(monkeypatch)
    again = readers.digits_arrays()  # scikit-learn is not imported: it would fail
    assert all(numpy.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(first, again, strict=True))
    cached.write_bytes(b"not an npz")  # a damaged cache file is not trusted: made again, from scikit-learn
    with pytest.raises(ImportError):
        readers.digits_arrays()
    monkeypatch.undo()
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    assert all(numpy.array_equal(a, b) for a, b in zip(readers.digits_arrays(), first, strict=True))
    assert numpy.array_equal(numpy.load(cached)["test_labels"], first[3])  # rewritten whole


def test_a_cached_digits_file_of_other_arrays_is_ignored(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    first = readers.digits_arrays()
    (cached,) = (tmp_path / "cache" / "digits").glob("*.npz")
    wrong = {"train_images": first[0], "train_labels": first[1] + 10, "test_images": first[2],
             "test_labels": first[3]}  # fmt: skip
    numpy.savez(cached, **wrong)  # labels out of 0..9
    assert readers._read_digits_cache(cached) is None
    numpy.savez(cached, **(wrong | {"train_labels": first[1], "test_images": first[2][:, :, :4]}))  # other shape
    assert readers._read_digits_cache(cached) is None
    assert numpy.array_equal(readers.digits_arrays()[1], first[1])


def test_digits_are_read_where_the_cache_cannot_be_written(monkeypatch, tmp_path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HASTEN_CACHE", str(blocked))
    assert len(readers.digits_arrays()[0]) == 1437 and blocked.read_text().startswith("a file")


def test_synthetic_is_deterministic_and_balanced() -> None:
    first = load_dataset("synthetic", synthetic_size=200, seed=7)
    check_tensors(first, 200, 50, (1, 28, 28))
    assert torch.bincount(first.train_labels).tolist() == [20] * 10
    same = load_dataset("synthetic", synthetic_size=200, seed=7)
    other = load_dataset("synthetic", synthetic_size=200, seed=8)
    assert torch.equal(first.train_images, same.train_images) and torch.equal(first.test_labels, same.test_labels)
    assert not torch.equal(first.train_images, other.train_images)
    default = load_dataset("synthetic")
    check_tensors(default, 512, 128, (1, 28, 28))


def test_synthetic_classes_are_separable() -> None:
    # nearest class mean on the train set beats chance (10%) by far on the test set
    data = load_dataset("synthetic", seed=1)
    x, xt = data.train_images.float().flatten(1), data.test_images.float().flatten(1)
    means = torch.stack([x[data.train_labels == c].mean(0) for c in range(10)])
    predicted = torch.cdist(xt, means).argmin(1)
    assert (predicted == data.test_labels).float().mean() > 0.5


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DataError) as error:
        load_dataset("imagenet-22k")
    assert "imagenet-22k" in str(error.value) and all(name in str(error.value) for name in DATASETS)


def batch(images: numpy.ndarray, labels: list[int], label_key: bytes = b"labels") -> dict:
    # Python 3 pickles bytes as BINBYTES from protocol 3; the official Python 2 pickles used STRING opcodes
    return {b"batch_label": b"fake", label_key: labels, b"data": images.reshape(len(images), 3072)}


def write_pickle(path: Path, value: object) -> None:
    path.write_bytes(pickle.dumps(value, protocol=4))


def fake_cifar10(root: Path, per_batch: int = 4) -> tuple[numpy.ndarray, numpy.ndarray]:
    """cifar-10-batches-py under `root` with 5 x `per_batch` train and `per_batch` test images."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = numpy.random.default_rng(0)
    images = rng.integers(0, 256, (6 * per_batch, 3, 32, 32), dtype=numpy.uint8)
    labels = (numpy.arange(6 * per_batch) % 10).tolist()
    for i in range(6):
        name = f"data_batch_{i + 1}" if i < 5 else "test_batch"
        part = slice(i * per_batch, (i + 1) * per_batch)
        write_pickle(folder / name, batch(images[part], labels[part]))
    write_pickle(folder / "batches.meta", {b"label_names": CIFAR10_NAMES, b"num_vis": 3072})
    return images, numpy.array(labels)


def test_cifar10_from_batch_folder(tmp_path: Path) -> None:
    images, labels = fake_cifar10(tmp_path)
    data = load_dataset("cifar10", tmp_path, download=False)
    check_tensors(data, 20, 4, (3, 32, 32))
    assert data.classes == [n.decode() for n in CIFAR10_NAMES]
    # rows are all red, then all green, then all blue: channel-first reshaping keeps the pixels in place
    assert torch.equal(data.train_images, torch.from_numpy(images[:20]))
    assert data.test_labels.tolist() == labels[20:].tolist()


def test_cifar10_from_archive_extracts_once(tmp_path: Path) -> None:
    source = tmp_path / "source"
    images, _ = fake_cifar10(source)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    data = load_dataset("cifar10", root, download=False)
    assert torch.equal(data.test_images, torch.from_numpy(images[20:]))
    assert sorted(p.name for p in (root / "cifar-10-batches-py").iterdir()) == sorted(LAYOUTS["cifar10"].files)
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]


def test_cifar10_archive_in_read_only_folder_is_read_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "source"
    images, _ = fake_cifar10(source)
    root = tmp_path / "system"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")

    def unwritable(*args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")

    # a read-only system folder, simulated: chmod does not stop root, who runs many CI jobs
    monkeypatch.setattr(tempfile, "mkdtemp", unwritable)
    arrays = read_cifar(root, "cifar10")
    assert numpy.array_equal(arrays.train_images, images[:20])
    assert arrays.classes == [n.decode() for n in CIFAR10_NAMES]
    assert [p.name for p in root.iterdir()] == ["cifar-10-python.tar.gz"]


def test_cifar10_incomplete_extracted_folder_is_named(tmp_path: Path) -> None:
    source = tmp_path / "source"
    fake_cifar10(source)
    root = tmp_path / "root"
    (root / "cifar-10-batches-py").mkdir(parents=True)
    (root / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"left over")
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    with pytest.raises(DataError, match="remove it") as error:
        load_dataset("cifar10", root, download=False)
    assert str(root / "cifar-10-batches-py") in str(error.value)
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no staging folder left behind


class Zeros:
    """A file object of `size` zero bytes, read without holding them."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def cifar10_archive_with_a_large_member(source: Path, archive: Path, size: int = 64 << 20) -> None:
    """The official layout, its data_batch_1 `size` zero bytes (64 MiB: about 300 KB of gzip)."""
    fake_cifar10(source)
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for path in sorted((source / "cifar-10-batches-py").iterdir()):
            info = tar.gettarinfo(path, arcname=f"cifar-10-batches-py/{path.name}")
            if path.name == "data_batch_1":
                info.size = size
                tar.addfile(info, Zeros(size))
            else:
                with open(path, "rb") as f:
                    tar.addfile(info, f)


@pytest.mark.parametrize("writable", [True, False])
def test_a_cifar_archive_member_larger_than_a_batch_is_refused_unread(tmp_path, monkeypatch, writable) -> None:
    root = tmp_path / "root"
    root.mkdir()
    archive = root / "cifar-10-python.tar.gz"
    cifar10_archive_with_a_large_member(tmp_path / "source", archive)
    assert archive.stat().st_size < 2 << 20
    if not writable:  # read from the archive in memory, as in a read-only system folder

        def unwritable(*args: object, **kwargs: object) -> str:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkdtemp", unwritable)
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as error:
            read_cifar(root, "cifar10")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(error.value)
    assert str(archive) in message and "member cifar-10-batches-py/data_batch_1" in message, message
    assert "67,108,864 bytes, more than a CIFAR data_batch_1 file can hold (33,000,000)" in message, message
    assert peak < 16 << 20, peak  # the member was neither extracted nor read
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-python.tar.gz"]  # no staging folder left


def test_an_extracted_batch_larger_than_a_batch_is_refused_unread(tmp_path) -> None:
    fake_cifar10(tmp_path)
    sparse = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    os.truncate(sparse, 2 << 30)  # 2 GiB that take no disk
    with pytest.raises(DataError, match="2,147,483,648 bytes, more than a CIFAR data_batch_2 file") as error:
        read_cifar(tmp_path, "cifar10")
    assert str(sparse) in str(error.value)


def test_cifar100(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = numpy.random.default_rng(1)
    train = rng.integers(0, 256, (6, 3, 32, 32), dtype=numpy.uint8)
    test = rng.integers(0, 256, (2, 3, 32, 32), dtype=numpy.uint8)
    write_pickle(folder / "train", batch(train, [0, 5, 99, 3, 3, 42], b"fine_labels") | {b"coarse_labels": [0] * 6})
    write_pickle(folder / "test", batch(test, [7, 98], b"fine_labels") | {b"coarse_labels": [1, 1]})
    names = [f"class{i}".encode() for i in range(100)]
    write_pickle(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": [b"x"] * 20})
    data = load_dataset("cifar100", tmp_path, download=False)
    check_tensors(data, 6, 2, (3, 32, 32))
    assert data.train_labels.tolist() == [0, 5, 99, 3, 3, 42] and len(data.classes) == 100


class WritesMarker:
    """A pickle payload that, if unpickled by a plain pickle.load, would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class OpensMarker:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.mark.parametrize("payload", [WritesMarker, OpensMarker])
def test_malicious_pickle_is_refused(tmp_path: Path, payload: type) -> None:
    fake_cifar10(tmp_path)
    marker = tmp_path / "marker"
    evil = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    write_pickle(evil, {b"data": payload(marker), b"labels": [0]})
    with pytest.raises(DataError, match="refusing to unpickle") as error:
        load_dataset("cifar10", tmp_path, download=False)
    message = str(error.value)
    assert str(evil) in message and ("system" in message or "open" in message)
    assert not marker.exists()


def test_corrupt_batch_names_file(tmp_path: Path) -> None:
    fake_cifar10(tmp_path)
    broken = tmp_path / "cifar-10-batches-py" / "test_batch"
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.raises(DataError, match="not a readable CIFAR batch") as error:
        load_dataset("cifar10", tmp_path, download=False)
    assert str(broken) in str(error.value)


def test_cifar_missing_everywhere_names_root(tmp_path: Path) -> None:
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", tmp_path / "empty", download=False)
    assert str(tmp_path / "empty") in str(error.value) and "cifar-10-python.tar.gz" in str(error.value)


def test_datasets_without_files_cannot_be_fetched() -> None:
    for name in ("digits", "synthetic"):
        with pytest.raises(DataError, match="no files to fetch"):
            resolve(name)
        assert info(name)["folder"] is None


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_system_copy() -> None:
    data = load_dataset("fashion-mnist", download=False)
    check_tensors(data, 60000, 10000, (1, 28, 28))
    assert len(data.classes) == 10 and data.classes[0] == "T-shirt/top"
    # Fashion-MNIST is balanced: 6000 train and 1000 test images per class
    assert torch.bincount(data.train_labels).tolist() == [6000] * 10
    assert torch.bincount(data.test_labels).tolist() == [1000] * 10


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_system_copy_verifies() -> None:
    report = info("fashion-mnist")
    assert report["folder"] == str(FASHION)
    # Debian recompresses the official gzip files: same IDX payload, different file hash
    assert all(f["check"] in ("verified", "verified content") for f in report["files"])


def test_the_registry_is_the_one_list_of_dataset_names():
    from typing import get_args

    from hasten.data.registry import DATASETS
    from hasten.recipe.schema import DataConfig

    assert set(get_args(DataConfig.model_fields["name"].annotation)) == {*DATASETS, "imagefolder", "import", "object"}


def test_a_dataset_is_its_reader_and_its_registry_entry(monkeypatch):
    """load_dataset asks the registry entry's reader: nothing else knows the dataset by name."""
    from hasten.data import registry
    from hasten.data.readers import ReadOptions

    def read_tiny(spec, folder, options: ReadOptions):
        assert folder is None  # no files: nothing to resolve
        images = numpy.full((options.synthetic_size, 1, 2, 2), options.seed, dtype=numpy.uint8)
        labels = numpy.arange(options.synthetic_size, dtype=numpy.int64) % 2
        return images, labels, images[:2], labels[:2], spec.classes

    spec = registry.DatasetSpec("tiny", image_shape=(1, 2, 2), num_classes=2, classes=("a", "b"), reader=read_tiny)
    monkeypatch.setitem(registry.SPECS, "tiny", spec)
    data = load_dataset("tiny", synthetic_size=6, seed=7)
    assert data.classes == ["a", "b"] and data.train_images.shape == (6, 1, 2, 2)
    assert int(data.train_images.max()) == 7 and data.test_labels.tolist() == [0, 1]
