"""The decode cache of an image folder: each split decoded once, at the size and mode the run reads it, into one
uint8 `.npy` file in hasten's cache folder (`folders/`), which the split's decoder then memory-maps instead of
decoding the files again. Later epochs and later runs read pixels, not JPEGs or PNGs, and a split larger than
memory is read from the map's pages as batches ask for them, never held whole.

A cache file is named by where its images come from (the folder, the split, the decode settings) and by a key of
what they are: a SHA-256 over every file's name relative to the folder, its size and its modification time (ns),
the mode, the size and how images are brought to it (data.resize), Pillow's version (its decoders and its
resampling make the pixels) and the version of this format: a run with another data.size or data.resize reads its
own file. A file touched, rewritten, added or removed gives another key, so the split is decoded again, and the new
cache file replaces the split's old one. A cache file is written under a temporary name and renamed when whole
(hasten/files.py), so a crash never leaves a file under a cache's name; a file under that name that does not hold
what it should (its shape, its type) is ignored and written again. The free space is checked before anything is
written.

The pixels are exactly those `decode` gives (the cache is filled by the same decoder), so batches read from the
cache are bitwise the batches decoded from the files: same order, same augmentation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy
import PIL
from torch import Tensor

from hasten.data.cache import cache_folder
from hasten.data.imagefolder import FolderSplit, ImageFolder, MappedImages, decoded_chunks
from hasten.files import write_atomic_bytes

CACHE_NAME = "folders"  # the cache's subfolder: `rm -r ~/.cache/hasten/folders` clears every folder's cache
FORMAT = 2  # raised when what a cache file holds changes: every older file then has another key (2: 16-bit and
# float images brought to 8 bits by their range, preprocessing.eight_bit, where 1 held them clipped; photos turned
# upright by their EXIF orientation, preprocessing.upright)
DISK_HEADROOM = 1 << 30  # bytes left free on the cache's disk after a cache is written, for everything else


@dataclass(frozen=True)
class SplitCache:
    """Where one split's decoded images live in the cache, and the images when they are there already."""

    role: str  # "train" or "test": the folder's training split, or its held-out one
    split: FolderSplit
    path: Path
    shape: tuple[int, int, int, int]  # (N, C, H, W)
    found: MappedImages | None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape)


def cache_dir() -> Path:
    """The folder that holds every image folder's decode cache."""
    return cache_folder(CACHE_NAME)


def files_key(root: Path, paths: list[str], settings: str) -> str:
    """Hex SHA-256 of the files at `paths` as the cache sees them (each one's name relative to `root`, size and
    modification time in ns, in order) and of the decode `settings`. Reads the files' metadata, not their bytes."""
    digest = hashlib.sha256(f"hasten folder cache {FORMAT}\0Pillow {PIL.__version__}\0{settings}\0".encode())
    prefix = str(root) + os.sep
    for path in paths:
        stat = os.stat(path)
        name = path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, root)
        digest.update(os.fsencode(name) + f"\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def plan_cache(data: ImageFolder) -> list[SplitCache]:
    """Each non-empty split's place in the cache and its images when a valid cache of them is there. Reads every
    file's metadata (the key), no pixels."""
    width, height = data.size
    settings = f"{data.mode}\0{width}x{height}\0resize={data.resize}\0fit={data.fit}"
    plans = []
    for role, split in (("train", data.train), ("test", data.test)):
        if not split.paths:
            continue
        place = hashlib.sha256(f"{data.root.resolve()}\0{role}\0{settings}".encode()).hexdigest()[:16]
        path = cache_dir() / f"{place}-{files_key(data.root, split.paths, settings)[:32]}.npy"
        shape = (len(split.paths), *data.image_shape)
        plans.append(SplitCache(role, split, path, shape, MappedImages.open(path, shape)))
    return plans


def missing_bytes(plans: list[SplitCache]) -> int:
    """Bytes the splits not yet in the cache will take there."""
    return sum(plan.nbytes for plan in plans if plan.found is None)


def free_bytes() -> int:
    """Bytes free on the disk that holds (or will hold) the cache folder."""
    folder = cache_dir()
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def fits_on_disk(plans: list[SplitCache], free: int) -> bool:
    """Whether writing the missing splits leaves DISK_HEADROOM of `free` bytes free."""
    return missing_bytes(plans) + DISK_HEADROOM <= free


def fill_cache(data: ImageFolder, plans: list[SplitCache], workers: int = 0) -> ImageFolder:
    """`data` with each planned split reading its decoded images from the cache; a split not there yet is decoded
    now (in `workers` DataLoader workers), written whole under a temporary name and renamed into place, and the
    split's older cache files removed. A file that cannot be decoded is a DataError naming it; a cache that cannot
    be written (a full or read-only disk) an OSError, with nothing left under the cache's name."""
    mapped = {}
    for plan in plans:
        found = plan.found
        if found is None:  # another process may have written it since the plan
            found = MappedImages.open(plan.path, plan.shape)
        if found is None:
            write_images(plan.path, plan.shape, decoded_chunks(data, plan.split, workers))
            remove_stale(plan.path)
            found = MappedImages.open(plan.path, plan.shape)
            if found is None:
                raise OSError(f"{plan.path}: the decode cache just written cannot be read back")
        mapped[plan.role] = found
    splits = {role: dataclasses.replace(getattr(data, role), cached=images) for role, images in mapped.items()}
    return dataclasses.replace(data, **splits)


def write_images(path: Path, shape: tuple[int, ...], chunks: Iterable[Tensor]) -> None:
    """uint8 images of `shape`, arriving as `chunks` of rows, as a `.npy` file at `path`, written whole or not at
    all. Durable (fsynced): a cache file is trusted from its name and shape alone, never read through to check it."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(file) -> None:
        numpy.lib.format.write_array_header_1_0(file, {"descr": "|u1", "fortran_order": False, "shape": shape})
        rows = 0
        for chunk in chunks:
            array = numpy.ascontiguousarray(chunk.numpy())
            file.write(array.data)
            rows += len(array)
        if rows != shape[0]:
            raise OSError(f"{path}: {rows} images decoded for a cache of {shape[0]}")

    write_atomic_bytes(path, write, durable=True)


def remove_stale(path: Path) -> None:
    """The split's other cache files (from before a file of it changed) and the temporary files that killed
    writers of it left behind, removed; a temporary file of a live process is its write in progress, and kept."""
    place = path.name.split("-")[0]
    for other in path.parent.glob(f"{place}-*.npy"):
        if other != path:
            other.unlink(missing_ok=True)
    for temporary in path.parent.glob(f".{place}-*.npy.*.tmp"):
        pid = temporary.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            temporary.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
