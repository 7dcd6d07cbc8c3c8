"""Readers for CIFAR-10 and CIFAR-100 (Krizhevsky, 2009, "Learning Multiple Layers of Features from Tiny
Images"), in the official "python version" layout.

The batches are Python pickles. Unpickling can run arbitrary code, so they are read with an unpickler that
resolves only the numpy globals an ndarray needs and refuses everything else. When only the official
tar.gz is present, the batch files are extracted next to it once (tarfile's "data" filter, and only the
expected members); where that folder is read-only (a system copy), they are read from the archive in memory.
Each member's size is read from its tar header and checked against what a batch of the format can hold before a
byte of it is extracted or read, and so is each extracted batch file's: a small archive may hold a member of
gigabytes of zeros.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy

from hasten.errors import DataError

# (module, name) pairs a pickled ndarray refers to; numpy 2 renamed numpy.core to numpy._core
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


def _reconstruct_function() -> Any:
    """numpy's ndarray unpickling helper, from where this numpy keeps it (without numpy.core's deprecation)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that builds dicts, lists, bytes, numbers and numpy arrays, and refuses any other global."""

    def __init__(self, file: io.BufferedIOBase, source: str):
        # encoding="bytes": the batches were pickled by Python 2, their str keys and data arrive as bytes
        super().__init__(file, encoding="bytes")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise DataError(
                f"refusing to unpickle {module}.{name} from {self.source}: a CIFAR batch holds only numpy "
                "arrays and plain values, so this file is not one (and may be malicious)"
            )
        return _reconstruct_function() if name == "_reconstruct" else getattr(numpy, name)


def load_batch(data: bytes, source: str) -> dict:
    """The dict pickled in `data` (read from `source`, which error messages name)."""
    try:
        loaded = NumpyOnlyUnpickler(io.BytesIO(data), source).load()
    except DataError:
        raise
    # a corrupt pickle can fail in many ways (UnpicklingError, EOFError, ValueError, TypeError, ...)
    except Exception as exc:
        raise DataError(f"{source}: not a readable CIFAR batch ({type(exc).__name__}: {exc})") from exc
    if not isinstance(loaded, dict):
        raise DataError(f"{source}: expected a pickled dict, found {type(loaded).__name__}")
    return loaded


# bytes a batch file may take per image it holds: 3,072 pixel bytes, its labels and its file name, pickled (the official
# files take about 3,105); the class names (batches.meta, meta) take a few KB at most
BATCH_BYTES_PER_IMAGE = 3_300
MAX_META_BYTES = 1 << 20


@dataclass(frozen=True)
class CifarLayout:
    """Where one CIFAR variant keeps its batches and which keys hold labels and class names."""

    folder: str
    archive: str
    train: tuple[str, ...]
    test: str
    meta: str
    label_key: bytes
    names_key: bytes
    train_images: int  # images in each of `train`'s files
    test_images: int

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train, self.test, self.meta)

    def max_bytes(self, name: str) -> int:
        """The largest file `name` (one of `files`) may be: what its images take at most, pickled."""
        if name == self.meta:
            return MAX_META_BYTES
        return BATCH_BYTES_PER_IMAGE * (self.test_images if name == self.test else self.train_images)


LAYOUTS: dict[str, CifarLayout] = {
    "cifar10": CifarLayout(
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        "batches.meta",
        b"labels",
        b"label_names",
        10_000,
        10_000,
    ),
    # fine labels: the 100-class task; the 20 coarse superclasses are not used
    "cifar100": CifarLayout(
        "cifar-100-python",
        "cifar-100-python.tar.gz",
        ("train",),
        "test",
        "meta",
        b"fine_labels",
        b"fine_label_names",
        50_000,
        10_000,
    ),
}


class CifarArrays(NamedTuple):
    train_images: numpy.ndarray  # uint8 [N, 3, 32, 32]
    train_labels: numpy.ndarray  # int64 [N]
    test_images: numpy.ndarray
    test_labels: numpy.ndarray
    classes: list[str]


def batch_folder(folder: Path, layout: CifarLayout) -> Path | None:
    """The folder holding all of the layout's batch files: `folder/<layout.folder>` or `folder` itself."""
    for candidate in (folder / layout.folder, folder):
        if all((candidate / name).is_file() for name in layout.files):
            return candidate
    return None


# tarfile's "data" filter (Python 3.10.12+, 3.11.4+, 3.12) refuses links, devices and paths outside the
# target; older Pythons lack it, where taking only the expected regular files (below) is the safeguard
_DATA_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def _wanted_members(layout: CifarLayout) -> dict[str, str]:
    return {f"{layout.folder}/{name}": name for name in layout.files}


def _check_size(source: str, size: int, layout: CifarLayout, name: str) -> None:
    """DataError naming `source` when batch file `name` is `size` bytes, more than the format's batch can be."""
    if size > layout.max_bytes(name):
        raise DataError(
            f"{source}: {size:,} bytes, more than a CIFAR {name} file can hold ({layout.max_bytes(name):,}); is it the "
            f"official {layout.archive}?"
        )


def _extract(archive: Path, folder: Path, layout: CifarLayout) -> Path | None:
    """Extract the batch files beside the archive; None when `folder` is not writable."""
    try:
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=f".{layout.folder}."))
    except OSError:
        return None
    wanted = _wanted_members(layout)
    try:
        found = set()
        with tarfile.open(archive, "r:*") as tar:
            # one pass over the stream; a gzipped tar cannot seek back cheaply
            for member in tar:
                name = member.name.removeprefix("./")
                if name in wanted and member.isfile():
                    _check_size(f"{archive} (member {name})", member.size, layout, wanted[name])
                    tar.extract(member, staging, **_DATA_FILTER)  # copies member.size bytes, no more
                    found.add(name)
        missing = sorted(set(wanted) - found)
        if missing:
            raise DataError(f"{archive}: archive lacks {', '.join(missing)}; is it the official {layout.archive}?")
        try:
            os.replace(staging / layout.folder, folder / layout.folder)
        except OSError:
            # another process may have extracted it first; keep theirs if it is complete
            if batch_folder(folder, layout) != folder / layout.folder:
                raise DataError(
                    f"{folder / layout.folder} exists but lacks some of {', '.join(layout.files)}; "
                    f"remove it so that it is extracted again from {archive}"
                ) from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{archive}: cannot extract ({exc}); delete it and fetch it again") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder / layout.folder


def _read_from_archive(archive: Path, layout: CifarLayout) -> dict[str, bytes]:
    """Batch file contents by name, read from the archive in memory (nothing is written)."""
    wanted = _wanted_members(layout)
    blobs: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if name in wanted and member.isfile():
                    _check_size(f"{archive} (member {name})", member.size, layout, wanted[name])
                    blobs[wanted[name]] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{archive}: cannot read ({exc}); delete it and fetch it again") from exc
    missing = sorted(set(layout.files) - set(blobs))
    if missing:
        raise DataError(f"{archive}: archive lacks {', '.join(missing)}; is it the official {layout.archive}?")
    return blobs


def _images_and_labels(batch: dict, source: str, label_key: bytes) -> tuple[numpy.ndarray, numpy.ndarray]:
    data, labels = batch.get(b"data"), batch.get(label_key)
    if not isinstance(data, numpy.ndarray) or data.dtype != numpy.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        found = f"{data.dtype} {data.shape}" if isinstance(data, numpy.ndarray) else type(data).__name__
        raise DataError(f"{source}: expected b'data' as uint8 [N, 3072], found {found}")
    if labels is None:
        raise DataError(f"{source}: no {label_key!r} entry")
    labels = numpy.asarray(labels, dtype=numpy.int64)
    if labels.shape != (len(data),):
        raise DataError(f"{source}: {len(data)} images but labels of shape {labels.shape}")
    # rows are 1024 red, then green, then blue values, each 32x32 in row-major order
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar(folder: Path, variant: str) -> CifarArrays:
    """CIFAR-10 or CIFAR-100 ('cifar10' / 'cifar100') from `folder`: its extracted batch folder, or the
    official archive in it (extracted on first use)."""
    folder = Path(folder)
    layout = LAYOUTS[variant]
    blobs: dict[str, bytes] | None = None
    batches = batch_folder(folder, layout)
    if batches is None:
        archive = next((p for p in (folder / layout.archive, folder / layout.archive[:-3]) if p.is_file()), None)
        if archive is None:
            raise DataError(
                f"{folder}: holds neither {layout.folder}/ ({', '.join(layout.files)}) nor {layout.archive}"
            )
        batches = _extract(archive, folder, layout)
        if batches is None:
            blobs = _read_from_archive(archive, layout)
            batches = archive

    def load(name: str) -> tuple[dict, str]:
        if blobs is not None:
            return load_batch(blobs[name], f"{batches} (member {layout.folder}/{name})"), f"{batches}:{name}"
        path = batches / name
        try:
            with open(path, "rb") as f:
                _check_size(str(path), os.fstat(f.fileno()).st_size, layout, name)
                data = f.read(layout.max_bytes(name) + 1)  # a file that grows while it is read stops at the bound
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        _check_size(str(path), len(data), layout, name)
        return load_batch(data, str(path)), str(path)

    train_parts = [_images_and_labels(*load(name), label_key=layout.label_key) for name in layout.train]
    test_images, test_labels = _images_and_labels(*load(layout.test), label_key=layout.label_key)
    meta, meta_source = load(layout.meta)
    names = meta.get(layout.names_key)
    if not isinstance(names, list) or not all(isinstance(n, bytes) for n in names):
        raise DataError(f"{meta_source}: expected {layout.names_key!r} as a list of names")
    classes = [n.decode("utf-8") for n in names]
    train_images = numpy.concatenate([images for images, _ in train_parts])
    train_labels = numpy.concatenate([labels for _, labels in train_parts])
    for split, labels in (("train", train_labels), ("test", test_labels)):
        if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
            raise DataError(f"{folder}: {split} labels outside 0..{len(classes) - 1} (the classes in {meta_source})")
    return CifarArrays(train_images, train_labels, test_images, test_labels, classes)
