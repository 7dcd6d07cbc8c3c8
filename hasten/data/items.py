"""A user's Dataset read item by item: each item's image as (C, H, W) pixels and its label as a class index, both
checked and named at the user's own index; whole batches of items for `ImageFolderLoader`'s DataLoader workers
(`DatasetBatches`, each image brought to the run's shape: hasten/data/conform.py), and the labels and image shapes
of items without stacking them (`ItemFacts`), which the labels' pass and the size sample read.

An exception the Dataset raises is the user's: it comes back as a message naming the item and where in their code
it was raised (hasten.errors.their_error), as text, because a worker's exception reaches the main process wrapped in
a traceback of DataLoader's internals, without the item.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy
import torch
from PIL import Image
from torch import Tensor

from hasten.data.conform import Target
from hasten.data.preprocessing import UNREADABLE, open_image, upright
from hasten.data.seeds import loader_generator
from hasten.errors import DataError, first_line, their_error
from hasten.text import printable

# Pillow modes whose pixels numpy reads as they are; others (palette, 1-bit, CMYK, YCbCr, ...) are converted first
PLAIN_MODES = ("L", "LA", "RGB", "RGBA", "I", "I;16", "F")


def item_pixels(image: Any, where: str) -> Tensor:
    """One streamed image as (C, H, W): PIL images (and files, read with Pillow) are H x W or H x W x C; arrays and
    tensors H x W, or of 3 axes in either layout, told apart as an array of images is (hasten/data/user.py): the
    channel axis is the smaller of the first and the last, the first on a tie, so a numpy C x H x W or a tensor
    H x W x C is not read with its channels as rows. A palette or other coded Pillow mode is converted to the
    colours it stands for (RGB, RGBA where it has transparency; 1-bit to grey). uint8 stays uint8 (normalised like
    the in-memory path); other types become float32. An image that is None or no pixels is a DataError naming
    `where`."""
    if image is None:
        raise DataError(f"{where}: image is None; give a PIL image, an array or tensor, or an image file's path")
    pillow = isinstance(image, (str, Path, Image.Image))  # its array is H x W x C, however small the image
    if isinstance(image, str | Path):
        try:
            with open_image(image) as opened:
                where, image = printable(str(image)), numpy.array(plain_mode(upright(opened)))
        except UNREADABLE as error:
            raise DataError(f"{where}: cannot read {printable(str(image))} as an image ({first_line(error)})") from None
    if isinstance(image, Image.Image):
        image = plain_mode(image)
    if isinstance(image, Tensor):
        pixels = image.detach().cpu()
    else:
        try:
            array = numpy.asarray(image)
        except Exception as error:  # a type numpy cannot read: say which item
            raise DataError(f"{where}: cannot read the image ({type(image).__name__}): {error}") from None
        if array.dtype.kind not in "biufc":  # objects, strings: nothing numpy holds as pixels
            raise DataError(f"{where}: the image is a {type(image).__name__} ({array.dtype}), not pixels; give a PIL "
                            "image, an array or tensor, or an image file's path")  # fmt: skip
        pixels = torch.from_numpy(numpy.array(array))  # a copy: PIL's arrays are read-only
    if pixels.ndim == 2:
        pixels = pixels[None]
    elif pixels.ndim == 3 and (pillow or pixels.shape[2] < pixels.shape[0]):
        pixels = pixels.permute(2, 0, 1)  # channels last
    if pixels.dtype.is_complex:
        raise DataError(f"{where}: the image is {str(pixels.dtype).removeprefix('torch.')} (complex numbers); "
                        "give real pixels, uint8 0..255 or floats (e.g. their magnitude, .abs())")  # fmt: skip
    if pixels.ndim != 3:
        raise DataError(f"{where}: an image must be H x W, H x W x C or C x H x W, got "
                        f"{tuple(pixels.shape)}")  # fmt: skip
    if pixels.dtype.is_floating_point and not bool(torch.isfinite(pixels).all()):
        raise DataError(f"{where}: the image holds NaN or inf pixel values; replace them before training")
    return pixels if pixels.dtype == torch.uint8 else pixels.float()


def plain_mode(image: Image.Image) -> Image.Image:
    """`image` in a mode whose pixels are its colours (PLAIN_MODES): a palette image converted to RGB (RGBA where it
    has transparency), a 1-bit one to grey, CMYK, YCbCr and others to RGB."""
    if image.mode in PLAIN_MODES:
        return image
    if image.mode == "1":
        return image.convert("L")
    transparent = image.mode == "PA" or (image.mode == "P" and "transparency" in image.info)
    return image.convert("RGBA" if transparent else "RGB")


def item_label(label: Any, where: str, num_classes: int | None = None) -> int:
    """One item's label as a class index: an int, a numpy integer or a one-element integer tensor; a whole-number
    float as its integer (as `as_labels` takes them). `int()` is not used to convert: it truncates 2.5 to 2 and
    reads the string "3", moving an example to a class its author did not give it without a word."""
    value = label
    if isinstance(label, (Tensor, numpy.ndarray)):
        if (label.size if isinstance(label, numpy.ndarray) else label.numel()) != 1:
            raise DataError(f"{where}: a label must be one class index, got a {type(label).__name__} of shape "
                            f"{tuple(label.shape)}")  # fmt: skip
        value = label.item()
    elif isinstance(label, numpy.generic):
        value = label.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise DataError(f"{where}: the label {value!r} ({type(label).__name__}) is not a class index, an integer "
                        "0..K-1")  # fmt: skip
    if value < 0 or (num_classes is not None and value >= num_classes):
        bounds = f"[0, {num_classes})" if num_classes is not None else "[0, classes)"
        raise DataError(f"{where}: the label {value} is outside {bounds}")
    return int(value)


# the keys a dict item's image and label go by, first found first (Hugging Face's "image"/"img", "label"/"labels")
IMAGE_KEYS = ("image", "img", "pixel_values", "pixels", "input", "x")
LABEL_KEYS = ("label", "labels", "target", "targets", "class", "y")


def read_item(dataset: Any, index: int, name: str) -> tuple[Any, Any] | str:
    """A Dataset's item `index` as (image, label), or the message naming it: what their __getitem__ raised
    (hasten.errors.their_error), or an item that is not an (image, label) pair."""
    try:
        item = dataset[index]
    except Exception as error:  # noqa: BLE001 - whatever their __getitem__ raises is theirs to see
        return f"{name}: your Dataset's item {index} raised {their_error(error)}"
    if isinstance(item, Mapping):  # {"image": ..., "label": ...}, as Hugging Face datasets and many users give
        image_key = next((key for key in IMAGE_KEYS if key in item), None)
        label_key = next((key for key in LABEL_KEYS if key in item), None)
        if image_key is None or label_key is None:
            return (
                f"{name}[{index}]: an item that is a dict must hold an image under one of {list(IMAGE_KEYS)} and "
                f"its label under one of {list(LABEL_KEYS)}; got the keys {list(item)[:8]}"
            )
        return item[image_key], item[label_key]
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        return f"{name}[{index}]: an item must be (image, label), got {type(item).__name__}"
    return item[0], item[1]


class DatasetBatches(torch.utils.data.Dataset):
    """`batches[list of indices]` -> (images (B, C, H, W), int64 labels), or the error message as a str: the batch
    source `ImageFolderLoader` streams through its DataLoader workers, here over any Dataset's (image, label)
    items. `indices` maps positions to the Dataset's own indices (a subset or a holdout split); labels are checked
    against `num_classes` when it is known; each image is brought to `target` (hasten/data/conform.py), and must
    then have its shape.

    An exception the Dataset raises is the user's: it comes back as the message naming the item and where in
    their code it was raised (hasten.errors.their_error), as text because a worker's exception would reach the main
    process wrapped in a traceback of DataLoader's internals, without the item."""

    def __init__(self, dataset: Any, indices: Tensor, name: str, num_classes: int | None = None,
                 target: Target | None = None):  # fmt: skip
        self.dataset, self.indices, self.name, self.num_classes = dataset, indices, name, num_classes
        self.target = target or Target()

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, positions: list[int]) -> tuple[Tensor, Tensor] | str:
        images, labels = [], []
        try:
            for position in positions:
                index = int(self.indices[position])
                item = read_item(self.dataset, index, self.name)
                if isinstance(item, str):
                    return item
                where = f"{self.name}[{index}]"
                images.append(self.target.apply(item_pixels(item[0], where), where))
                labels.append(item_label(item[1], where, self.num_classes))
                expected = self.target.shape or tuple(images[0].shape)
                if tuple(images[-1].shape) != expected:
                    raise DataError(
                        f"{where}: image of shape {tuple(images[-1].shape)} but the images looked at first are "
                        f"{expected}; set data.size to resize every image (data.rgb for the channels)"
                    )
        except DataError as error:
            return str(error)
        stacked = torch.stack(images) if images[0].dtype == torch.uint8 else torch.stack([i.float() for i in images])
        return stacked, torch.tensor(labels, dtype=torch.int64)


class ItemFacts(torch.utils.data.Dataset):
    """`facts[list of indices]` -> (int64 labels, the images' shapes (C, H, W)), or the error message as a str: what
    the labels' pass and the size sample read of a Dataset's items, whose images may differ in size, without
    stacking them."""

    def __init__(self, dataset: Any, name: str, num_classes: int | None = None):
        self.dataset, self.name, self.num_classes = dataset, name, num_classes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, list[tuple[int, int, int]]] | str:
        labels, shapes = [], []
        try:
            for index in indices:
                item = read_item(self.dataset, index, self.name)
                if isinstance(item, str):
                    return item
                where = f"{self.name}[{index}]"
                shapes.append(tuple(int(n) for n in item_pixels(item[0], where).shape))
                labels.append(item_label(item[1], where, self.num_classes))
        except DataError as error:
            return str(error)
        return torch.tensor(labels, dtype=torch.int64), shapes


def read_passes(source: torch.utils.data.Dataset, plan: list[list[int]], workers: int) -> Iterator[Any]:
    """`source[indices]` for each list of `plan`, in order, read by `workers` DataLoader workers (0: here); a message
    in place of a batch is raised as the DataError it names."""
    loader = torch.utils.data.DataLoader(source, batch_size=None, sampler=plan, collate_fn=whole_batch,
                                         num_workers=workers, generator=loader_generator())  # fmt: skip
    for item in loader:
        if isinstance(item, str):
            raise DataError(item)
        yield item


@dataclasses.dataclass
class StreamSplit:
    """A split of a Dataset: which of its items (`indices`) and their labels; `num_classes` when known, which every
    label an item gives in training is checked against; `target`, the shape each image is brought to."""

    dataset: Any
    indices: Tensor
    labels: Tensor
    name: str
    num_classes: int | None = None
    target: Target | None = None

    def take(self, positions: Tensor) -> StreamSplit:
        return dataclasses.replace(self, indices=self.indices[positions], labels=self.labels[positions])

    def batches(self) -> DatasetBatches:
        return DatasetBatches(self.dataset, self.indices, self.name, self.num_classes, self.target)

    def shapes(self, count: int, workers: int = 0) -> list[tuple[int, int, int]]:
        """The image shapes (C, H, W) of up to `count` items spread over the split, from its first on."""
        spread = numpy.linspace(0, len(self.indices) - 1, min(count, len(self.indices))).round().astype(int)
        indices = [int(self.indices[p]) for p in sorted(set(spread.tolist()))]
        facts = ItemFacts(self.dataset, self.name, self.num_classes)
        plan = [indices[i : i + 64] for i in range(0, len(indices), 64)]
        return [shape for _, shapes in read_passes(facts, plan, workers) for shape in shapes]


class TensorItems(torch.utils.data.Dataset):
    """In-memory images as Dataset items, for a pair that is evaluated beside a streamed part."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])


def whole_batch(item: object) -> object:
    """collate_fn for a DataLoader whose source already returns whole batches (`DatasetBatches`, and the image
    folders' decoders in hasten/data/imagefolder.py); a module function: workers may pickle it."""
    return item
