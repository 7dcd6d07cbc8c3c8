"""Image folders: `ROOT/train/<class>/*.png|jpg|...` and `ROOT/val/<class>/...` (or `test/`), decoded with Pillow
in torch DataLoader worker processes, resized to the recipe's `data.size` as `data.resize` says (squash, crop or
pad: hasten/data/fitting.py), scaled to [0, 1] and normalised.

This is the path for image sets that do not fit in memory, and the input of the worked example (a small CNN
on a folder of 32x32 colour images). Decoded from the files, it is not the fast path: every epoch decodes every
file again, which the in-memory loader never does (benchmarks/imagefolder.py measures the difference); a split
with a decode cache (foldercache.py) is decoded once and read from a memory map after that
(benchmarks/folder_cache.py). To keep Python out of the per-image work where it can, each worker decodes (or
copies) a whole batch into one uint8 tensor; the main process then augments and normalises whole batches exactly
as `InMemoryLoader` does, with the same seeded order (`loader.shard_indices`) and augmentation seeds, so one seed
gives the same batches on every path.

Classes are the sorted names of the folders under `train/`, so label i is the i-th name; `hasten data
make-folder` (makefolder.py) prefixes them with their label index to keep a dataset's own label order.

Only regular files are images: a FIFO named `x.png` would block the first read of it for ever, and a device could
read without end, so the scan looks at what each name is (following symlinks, opening nothing) and skips, with a
note, what is not a regular file. A symlink to an image is read as the image; a broken one is kept, to be named
when it is read.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from hasten.data.datasets import ImageDataset
from hasten.data.fitting import SQUASH, fit_pil, mixed_sizes_side
from hasten.data.items import whole_batch
from hasten.data.loader import Augment, ShardedEpochs, channel_stats
from hasten.data.preprocessing import UNREADABLE, eight_bit, open_image, shown_size, upright
from hasten.data.seeds import loader_generator
from hasten.data.transforms import class_interleaved, first_per_class, flip_labels, noise_generator
from hasten.errors import DataError
from hasten.machine import current as current_machine
from hasten.machine import loader_workers, pin_memory
from hasten.text import printable

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
TEST_SPLITS = ("val", "test")  # the held-out split's folder name, first found wins
GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"}  # read as one channel when data.rgb is unset
STATS_SAMPLE = 1000  # training images decoded to estimate the per-channel mean and std
# training images whose headers (not pixels) are read at the start, spread over the split, to see whether the folder
# holds one image size or several; the held-out split's headers are all read anyway
SIZE_SAMPLE = 512


@dataclass
class FolderSplit:
    """One split of an image folder: file paths and their int64 labels; `cached`: the split's images already
    decoded, memory-mapped from hasten's cache (hasten/data/foldercache.py), which its decoder then reads instead
    of the files."""

    paths: list[str]
    labels: Tensor
    cached: MappedImages | None = None

    def take(self, indices: Tensor) -> FolderSplit:
        """The files at `indices`: another set of files, so without the cache of this one."""
        return FolderSplit([self.paths[i] for i in indices.tolist()], self.labels[indices])


class MappedImages:
    """Decoded images, uint8 (N, C, H, W), memory-mapped from a `.npy` file: `rows(indices)` copies the rows a
    batch needs out of the page cache (or from the disk), so a split larger than memory is never held in it.

    Pickled (a DataLoader worker started by spawn rather than fork) as its path, and mapped again there: a memmap
    pickles as a copy of all its pixels."""

    def __init__(self, path: Path, array: numpy.ndarray):
        self.path, self.array = path, array

    @classmethod
    def open(cls, path: Path, shape: tuple[int, ...]) -> MappedImages | None:
        """The images at `path` when it holds uint8 images of `shape`, else None (missing, or not what it should
        be: a file in the cache that fails its checks is never trusted)."""
        try:
            array = numpy.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if array.dtype != numpy.uint8 or array.shape != tuple(shape):
            return None
        return cls(path, array)

    def __len__(self) -> int:
        return len(self.array)

    def rows(self, indices: list[int]) -> numpy.ndarray:
        """The images at `indices`, in that order, as a new (writable) array."""
        return self.array[numpy.asarray(indices, dtype=numpy.int64)]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shape": self.array.shape}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.array = numpy.load(self.path, mmap_mode="r", allow_pickle=False)
        if self.array.shape != state["shape"]:  # replaced since: what this process was given is gone
            raise DataError(f"{self.path}: the decode cache changed while the run read it; run again")


@dataclass
class ImageFolder:
    """An image folder on disk: the class names, both splits' files, and how each image is decoded."""

    root: Path
    classes: list[str]
    train: FolderSplit
    test: FolderSplit
    mode: str  # Pillow mode images are converted to: "RGB" or "L"
    size: tuple[int, int]  # (width, height) in pixels every image is brought to
    resize: bool  # False: images of another size are an error rather than resized
    name: str = "imagefolder"
    fit: str = SQUASH  # data.resize: how an image of another size is brought to `size` (hasten/data/fitting.py)
    # what opening it decided about the image size and channels, and what it skipped: the run says each
    notes: tuple[str, ...] = ()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one decoded image."""
        return (3 if self.mode == "RGB" else 1, self.size[1], self.size[0])

    def decoder(self, split: FolderSplit) -> BatchDecoder:
        """The batch source of `split` (one of this folder's), decoding as this folder says."""
        return BatchDecoder(split, self.mode, self.size, self.resize, self.fit)


def _kind(path: Path) -> str | None:
    """None for a regular file, or a symlink to one, or a name that cannot be looked at (the read names it); else
    what it is ("a FIFO", "a folder", ...), from its inode alone: nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def _images_in(folder: Path, skipped: list[tuple[Path, str]]) -> list[Path]:
    """The image files in `folder`; entries named like images that are not regular files go to `skipped`."""
    images = []
    named = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    for path in named:
        kind = _kind(path)
        if kind is None:
            images.append(path)
        else:
            skipped.append((path, kind))
    return images


def _class_folders(split: Path) -> list[Path]:
    return sorted(p for p in split.iterdir() if p.is_dir() and not p.name.startswith("."))


def class_name(folder: Path) -> str:
    """A class folder's name as text: bytes that are not UTF-8 (a folder named on another system) become \\xNN
    escapes, and control characters (ESC, a newline) are escaped as repr writes them (hasten.text.printable), so
    the name prints without acting on the terminal, writes to CSV and JSON, and still tells the folders apart."""
    return printable(os.fsencode(folder.name).decode("utf-8", "backslashreplace"))


def scan_split(split: Path, classes: list[str], skipped: list[tuple[Path, str]] | None = None) -> FolderSplit:
    """The images under `split/<class>/`; a class folder that is not in `classes` is an error naming it. Entries
    named like images that are not regular files are left out, and appended to `skipped` with what they are."""
    skipped = [] if skipped is None else skipped
    index = {name: i for i, name in enumerate(classes)}
    paths: list[str] = []
    labels: list[int] = []
    for folder in _class_folders(split):
        name = class_name(folder)
        if name not in index:
            raise DataError(f"{split / name}: class {name!r} is not among the training classes (train/ folders)")
        files = _images_in(folder, skipped)
        paths += [str(p) for p in files]
        labels += [index[name]] * len(files)
    return FolderSplit(paths, torch.tensor(labels, dtype=torch.int64))


SHOWN_UNREADABLE = 10  # files an error about unreadable images names (the count says how many in all)


def unreadable_error(problems: list[str]) -> DataError:
    """One error for every file of a pass that could not be decoded (each problem: a file and why), so that they
    can all be removed or replaced at once, not found one run at a time."""
    if len(problems) == 1:
        return DataError(problems[0])
    shown = "; ".join(problems[:SHOWN_UNREADABLE])
    more = f"; and {len(problems) - SHOWN_UNREADABLE} more" if len(problems) > SHOWN_UNREADABLE else ""
    return DataError(f"{len(problems)} files cannot be read as images (move or replace them): {shown}{more}")


def decode(path: str, mode: str, size: tuple[int, int], resize: bool, fit: str = SQUASH) -> numpy.ndarray:
    """One image file as uint8 (C, H, W) in `mode`, brought to `size` (width, height) as `fit` (data.resize) says;
    DataError naming the file."""
    try:
        with open_image(path) as image:
            image = upright(image)  # as viewers show it (a phone's EXIF orientation)
            if image.size != size and not resize:
                raise DataError(
                    f"{printable(path)}: {image.size[0]}x{image.size[1]} pixels, but the folder's first training image "
                    f"is {size[0]}x{size[1]}; set data.size to resize every image"
                )
            pixels = fit_pil(eight_bit(image).convert(mode), size[1], size[0], fit)
    except DataError:
        raise
    except UNREADABLE as exc:
        raise DataError(f"{printable(path)}: cannot decode as an image ({type(exc).__name__}: {exc})") from None
    return pixels


class BatchDecoder(torch.utils.data.Dataset):
    """`decoder[list of indices]` -> (uint8 images (B, C, H, W), int64 labels), or the files that could not be decoded
    (one message each, naming the file).

    A worker's exception reaches the main process wrapped in its traceback text; returning the message lets
    the loader raise one clean DataError naming the file instead.
    """

    def __init__(self, split: FolderSplit, mode: str, size: tuple[int, int], resize: bool, fit: str = SQUASH):
        self.paths, self.labels, self.cached = split.paths, split.labels, split.cached
        self.mode, self.size, self.resize, self.fit = mode, size, resize, fit
        self.shape = (3 if mode == "RGB" else 1, size[1], size[0])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, Tensor] | list[str]:
        if self.cached is not None:  # decoded once already: the rows of the map, the same pixels as decode's
            return torch.from_numpy(self.cached.rows(indices)), self.labels[indices]
        images = numpy.empty((len(indices), *self.shape), dtype=numpy.uint8)
        problems = []
        for row, i in enumerate(indices):
            try:
                images[row] = decode(self.paths[i], self.mode, self.size, self.resize, self.fit)
            except DataError as error:  # the rest decoded still: every bad file of the batch is named
                problems.append(str(error))
        if problems:
            return problems
        return torch.from_numpy(images), self.labels[indices]


class _BatchPlan:
    """The sampler: the index lists of the batches still to come this epoch, set before each pass.
    DataLoader re-iterates its sampler on every pass, so persistent workers pick up each new epoch's order."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def default_workers() -> int:
    """Workers when data.workers is unset: hasten.machine.loader_workers of the machine (one per core of this
    process's share but one, at most 4; benchmarks/imagefolder.py)."""
    return loader_workers(current_machine())


class ImageFolderLoader(ShardedEpochs):
    """Batches of (normalised float images, int64 labels) decoded from files by DataLoader workers.

    Same interface and the same sample order as `InMemoryLoader`: `set_epoch`, `batches(start)`, `__len__`,
    `shard_size`; each rank takes its strided share of the epoch's permutation, the remainder padded, dropped
    or split as `remainder` says (hasten/data/loader.py). `workers`: DataLoader worker processes (0: decode in
    this one); `batch_size` and `options`: those of `ShardedEpochs`.
    """

    def __init__(self, decoder: BatchDecoder, batch_size: int, *, workers: int = 0, **options: Any):
        super().__init__(batch_size, **options)
        self.decoder, self.workers = decoder, workers
        self._plan = _BatchPlan()
        self._loader: torch.utils.data.DataLoader | None = None

    @property
    def num_samples(self) -> int:
        return len(self.decoder)

    def _dataloader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:  # made once: persistent workers survive from epoch to epoch
            self._loader = torch.utils.data.DataLoader(
                self.decoder,
                batch_size=None,
                sampler=self._plan,
                collate_fn=whole_batch,
                generator=loader_generator(),  # (the global generator is the model's: hasten/data/seeds.py)
                num_workers=self.workers,
                persistent_workers=self.workers > 0,
                prefetch_factor=4 if self.workers else None,  # batches in flight per worker
                pin_memory=pin_memory(current_machine(), self.device.type),
            )
        return self._loader

    def batches(self, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of the current epoch from batch index `start` on (a resumed run starts mid-epoch)."""
        order = self.indices(self.epoch)
        spans = {b: self.batch_span(b) for b in range(start, len(self))}
        self._plan.batches = [order[first:stop].tolist() for first, stop in spans.values()]
        for b, item in enumerate(self._dataloader(), start):
            if isinstance(item, list):
                raise unreadable_error(item)
            images, labels = item
            idx = order[spans[b][0] : spans[b][1]]
            images = self.augmented(images.to(self.device, non_blocking=True), idx, b)
            yield self.normalise(images), labels.to(self.device, non_blocking=True)


def _headers(paths: list[str]) -> tuple[list[tuple[tuple[int, int], str]], list[str]]:
    """`_header` of each of `paths` that is an image, and a message naming each one that is not."""
    found, problems = [], []
    for path in paths:
        try:
            found.append(_header(path))
        except DataError as error:
            problems.append(str(error))
    return found, problems


def _header(path: str) -> tuple[tuple[int, int], str]:
    """An image file's size and mode from its header (Pillow reads no pixels); DataError naming a file that is
    not an image."""
    try:
        with open_image(path) as image:
            return shown_size(image), image.mode
    except DataError:
        raise
    except UNREADABLE as exc:
        raise DataError(f"{printable(path)}: cannot decode as an image ({type(exc).__name__}: {exc})") from None


def open_image_folder(
    root: str | Path,
    *,
    size: int | None = None,
    rgb: bool | None = None,
    subset: int | None = None,
    test_subset: int | None = None,
    per_class: int | None = None,
    label_noise: float = 0.0,
    seed: int = 0,
    val_fraction: float = 0.0,
    fit: str = SQUASH,
) -> ImageFolder:
    """Scan `root` (train/ and val/ or test/): classes, files and labels, with the recipe's data keys applied.

    `subset` takes the first N training images visiting the classes in turn (the files are grouped by class,
    so the first N in file order would be a few classes only); `per_class` the first N of each class;
    `label_noise` flips that fraction of training labels (seeded). Without `size`: when the images come in one
    size (the held-out split's headers and a sample of the training split's say so), that size; when in several,
    each is resized to a square of the median shorter side (`mixed_sizes_side`); without `rgb`, one grey channel when
    every image looked at (the held-out split's and the training sample's) is grey, else RGB (`folder_mode`).
    `val_fraction` > 0: that share of train/ (seeded, stratified by class) is the evaluation split instead of
    val/ or test/, which the folder then need not have. `fit` (data.resize): how an image of another size is
    brought to the size (squash, crop or pad).
    """
    root = Path(root).expanduser()
    train_dir = root / "train"
    if not root.exists():
        raise DataError(f"data.root={root}: no such folder")
    if not root.is_dir():
        raise DataError(f"data.root={root}: a file, not a folder of images (train/<class>/*.png and val/<class>/...)")
    if not train_dir.is_dir():
        inside = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
        images = [p for p in _class_folders(root) if any(q.suffix.lower() in IMAGE_SUFFIXES for q in p.iterdir())]
        hint = (
            "; its subfolders hold images, so it looks like a split folder itself: give the folder above it and "
            "name this one train/"
            if images
            else f" (it holds: {', '.join(inside[:8]) + (', ...' if len(inside) > 8 else '')})"
            if inside
            else "; it is empty: to make one from a dataset, hasten data make-folder fashion-mnist DIR --size 32 --rgb"
        )
        raise DataError(
            f"data.root={root}: no train/ folder in it (an image folder holds train/<class>/*.png and "
            f"val/<class>/...){hint}"
        )
    test_dir = next((root / s for s in TEST_SPLITS if (root / s).is_dir()), None)
    if test_dir is None and not val_fraction:
        raise DataError(
            f"data.root={root}: no val/ or test/ folder next to train/; or hold out part of train/ with "
            "data.val_fraction=0.1"
        )
    classes = [class_name(p) for p in _class_folders(train_dir)]
    if not classes:
        raise DataError(f"{train_dir}: no class folders (expected train/<class>/*.png)")
    if len(set(classes)) < len(classes):
        raise DataError(f"{train_dir}: two class folders have the same name once shown as text: {classes}")
    skipped: list[tuple[Path, str]] = []
    train = scan_split(train_dir, classes, skipped)
    empty = [name for i, name in enumerate(classes) if not bool((train.labels == i).any())]
    if empty and len(empty) < len(classes):
        print(f"warning: data.root={root}: train/{', train/'.join(empty)} hold(s) no images; kept as class(es) "
              f"{', '.join(str(classes.index(n)) for n in empty)} so the labels match val/, but the model never "
              "sees an example of them", file=sys.stderr)  # fmt: skip
    if (nested := nested_images_warning(root, [train_dir] if test_dir is None else [train_dir, test_dir])) is not None:
        print(f"warning: {nested}", file=sys.stderr)
    if val_fraction:
        from hasten.data.user import stratified_holdout

        kept, held = stratified_holdout(train.labels, val_fraction, seed)
        train, test = train.take(kept), train.take(held)
    else:
        test = scan_split(test_dir, classes, skipped)
    if not train.paths:
        raise DataError(f"{train_dir}: no image files ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    if subset is not None:
        train = train.take(class_interleaved(train.labels)[:subset])
    if per_class is not None:
        train = train.take(first_per_class(train.labels, per_class))
    if test_subset is not None:
        test = test.take(class_interleaved(test.labels)[:test_subset])
    if label_noise:
        noisy, _ = flip_labels(train.labels, label_noise, len(classes), noise_generator(seed))
        train = FolderSplit(train.paths, noisy)
    # the held-out split is read only at the end of the first epoch: a bad file is named now, not after it
    held_out, problems = _headers(test.paths)
    # the training split: a spread sample from its first file on when the size or the channels are to be decided
    # from it, else its first file alone
    count = min(SIZE_SAMPLE, len(train.paths)) if size is None or rgb is None else 1
    spread = numpy.linspace(0, len(train.paths) - 1, count).round().astype(int)
    sampled, more = _headers([train.paths[i] for i in sorted(set(spread.tolist()))])
    if problems or more:  # every file found so far that is not an image, of both splits, in one error
        raise unreadable_error(problems + more)
    first_size = sampled[0][0]
    notes = [skipped_note(root, skipped)] if skipped else []
    if size is None:
        size, note = mixed_sizes_side([first_size, *(found for found, _ in held_out + sampled)])
        notes += [note] * bool(note)
    if rgb is None:
        mode, note = folder_mode([found for _, found in held_out + sampled])
        notes += [note] * bool(note)
    else:
        mode = "RGB" if rgb else "L"
    shape = (size, size) if size else first_size
    return ImageFolder(root, classes, train, test, mode, shape, size is not None, notes=tuple(notes), fit=fit)


def nested_images_warning(root: Path, splits: list[Path]) -> str | None:
    """The warning for folders inside class folders that hold images (`train/dogs/2019/*.jpg`): the scan reads the
    files directly inside each class folder, so those images are not trained or tested on."""
    found = []
    for split in splits:
        for folder in _class_folders(split):
            for inner in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
                count = sum(1 for q in inner.rglob("*") if q.suffix.lower() in IMAGE_SUFFIXES and q.is_file())
                if count:
                    found.append((inner.relative_to(root), count))
    if not found:
        return None
    images = sum(count for _, count in found)
    shown = ", ".join(f"{path} ({count})" for path, count in found[:3]) + (", ..." if len(found) > 3 else "")
    return (
        f"data.root={root}: {len(found)} folder(s) inside class folders hold {images} image(s) that are not read: "
        f"{shown}; the images of a class are the files directly inside its folder (train/<class>/*.png): move "
        "them up into it to train and test on them"
    )


def skipped_note(root: Path, skipped: list[tuple[Path, str]]) -> str:
    """One line on the entries the scan left out: how many, and the first of them with what it is."""
    first, kind = skipped[0]
    count = f"{len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'}"
    return (f"data.root={root}: skipped {count} named like an image but not a regular file (FIFOs, sockets, "
            f"devices, folders), e.g. {first.relative_to(root)} ({kind})")  # fmt: skip


def folder_mode(modes: list[str]) -> tuple[str, str]:
    """How a folder without `data.rgb` is read, from the Pillow modes of the images whose headers were sampled:
    one grey channel when every one is grey, else RGB (a grey image's channel repeated), so that a folder of colour
    photos with a few grey ones in it keeps its colour; with the line that says so when the folder mixes them."""
    grey = sum(mode in GREY_MODES for mode in modes)
    if grey == len(modes):
        return "L", ""
    if not grey:
        return "RGB", ""
    return "RGB", (
        f"data.rgb: {grey} of {len(modes)} images looked at are grey, the rest in colour; all are read as RGB, the "
        "grey ones' channel repeated (data.rgb=false reads every image as grey)"
    )


def folder_stats(data: ImageFolder, sample: int = STATS_SAMPLE, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std in [0, 1] units, from a seeded sample of up to `sample` training images."""
    picked = torch.randperm(len(data.train.paths), generator=torch.Generator().manual_seed(seed))[:sample]
    images = data.decoder(data.train)[picked.sort().values.tolist()]  # in file order: kinder to the disk
    if isinstance(images, list):
        raise unreadable_error(images)
    return channel_stats(images[0])


DECODE_CHUNK = 256  # files a worker decodes into one tensor when a folder is read into memory or into its cache


def decoded_chunks(data: ImageFolder, split: FolderSplit, workers: int = 0) -> Iterator[Tensor]:
    """Every image of `split` (one of `data`'s, decoded as it says), in file order, as uint8 (B, C, H, W) chunks of
    DECODE_CHUNK images (one, empty, for an empty split): what `read_into_memory` and the decode cache are filled
    from. With `workers`, the chunks are decoded in that many DataLoader worker processes, still yielded in order.
    Files that cannot be decoded are one DataError at the end of the pass naming every one of them."""
    decoder = data.decoder(split)
    count = len(split.paths)
    chunks = [list(range(i, min(i + DECODE_CHUNK, count))) for i in range(0, count, DECODE_CHUNK)]
    if not chunks:  # an empty split: no files to decode
        yield torch.empty((0, *decoder.shape), dtype=torch.uint8)
        return
    if workers and len(chunks) > 1 and split.cached is None:  # a cached split is only copied: no work to share
        parts: Any = torch.utils.data.DataLoader(decoder, batch_size=None, sampler=chunks, num_workers=workers,
                                                 collate_fn=whole_batch, generator=loader_generator())  # fmt: skip
    else:
        parts = (decoder[chunk] for chunk in chunks)
    problems: list[str] = []
    for part in parts:
        if isinstance(part, list):  # decoding goes on, so that the error names every file that fails
            problems += part
            continue
        if not problems:
            yield part[0]
    if problems:
        raise unreadable_error(problems)


def read_into_memory(data: ImageFolder, workers: int = 0) -> ImageDataset:
    """Every image of the folder decoded once into an in-memory `ImageDataset`: what `data.in_memory` trains
    from, the naive baseline loop and the in-memory side of benchmarks/imagefolder.py. With `workers`, chunks of
    files are decoded in that many DataLoader worker processes. A split with a decode cache is copied from it."""
    splits = []
    for split in (data.train, data.test):
        images = torch.cat(list(decoded_chunks(data, split, workers)))
        splits += [images, split.labels]
    return ImageDataset(data.name, *splits, list(data.classes), root=str(data.root))


IN_MEMORY_SHARE = 0.25  # data.in_memory=auto: a folder is read into memory when its decoded images take at most
IN_MEMORY_BYTES = 4 * 2**30  # this share of the memory available, and at most this many bytes


def decoded_bytes(data: ImageFolder) -> int:
    """Bytes the folder's images take decoded as uint8 at the run's size, both splits."""
    channels = 3 if data.mode == "RGB" else 1
    return (len(data.train.paths) + len(data.test.paths)) * channels * data.size[0] * data.size[1]


def fits_in_memory(data: ImageFolder, available: int) -> bool:
    """data.in_memory=auto: whether the decoded folder is small enough to hold (IN_MEMORY_SHARE, IN_MEMORY_BYTES)."""
    return decoded_bytes(data) <= min(IN_MEMORY_BYTES, IN_MEMORY_SHARE * available)


def image_folder_loaders(
    data: ImageFolder,
    batch_size: int,
    eval_batch_size: int,
    *,
    seed: int = 0,
    augment: Augment | None = None,
    workers: int | None = None,
    channels_last: bool = False,
    device: torch.device | str = "cpu",
    rank: int = 0,
    world_size: int = 1,
    remainder: str = "pad",
) -> tuple[ImageFolderLoader, ImageFolderLoader]:
    """Training and test loaders over `data`; normalisation statistics come from the training images. The
    training set's remainder over the ranks follows `remainder`; the test set is split, each image once."""
    mean, std = folder_stats(data, seed=seed)
    workers = default_workers() if workers is None else workers
    common = dict(mean=mean, std=std, channels_last=channels_last, device=device, workers=workers)
    common |= dict(rank=rank, world_size=world_size)
    train = ImageFolderLoader(
        data.decoder(data.train),
        batch_size,
        shuffle=True,
        seed=seed,
        augment=augment,
        remainder=remainder,
        **common,
    )
    return train, ImageFolderLoader(data.decoder(data.test), eval_batch_size, remainder="split", **common)
