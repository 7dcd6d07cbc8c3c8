"""The user's own data, in whichever form they hold it, brought to one of hasten's two loader paths.

Forms of one part (a training or an evaluation split):
- an `(images, labels)` pair of tensors or numpy arrays: images uint8 N x H x W (grey), N x H x W x C or
  N x C x H x W (any size and channel count; the channel axis is the smaller of axes 1 and 3, axis 1 on a tie),
  labels integers 0..K-1. Held in memory as one uint8 tensor: the fast path (`InMemoryLoader`). Float images
  (any scale) are kept as they are and go the streamed way, item by item, which is slower.
- an `(images, labels)` pair whose images are a list of single images, each as a Dataset's item below (PIL images,
  arrays, tensors), of one size or several: brought to one shape (hasten/data/conform.py), then held in memory as
  one uint8 tensor (float images: streamed, as above).
- any `torch.utils.data.Dataset` whose items are `(image, label)`: the image a PIL image, or a numpy array or
  tensor H x W, H x W x C or C x H x W (the channel axis the smaller of the first and the last, as above), uint8
  or float. It is streamed: DataLoader
  workers fetch whole batches of the rank's shard of each epoch's order (`ImageFolderLoader`, which takes any
  batch source), so it never has to fit in memory. Its images may differ in size and channels: each is brought to
  the run's shape as it is read.

Images of several sizes or channel counts follow an image folder's rules (hasten/data/conform.py): `data.size`,
else the median shorter side; `data.rgb`, else colour where any is in colour; `data.resize` (squash, crop, pad)
says how an image is brought to the size, with Pillow. Arrays (one size per array) are resized as the registry's
datasets are, with torch.

The whole data argument: one part (the training data; the evaluation split is then `data.val_fraction` of it,
held out seeded and stratified by class), `(images, labels, class_names)` (one part, named), `(train, test)`,
`(train, test, class_names)`, or an image folder's
path (hasten/data/imagefolder.py). Labels come from a Dataset's `targets` or `labels` attribute when it has
one of its length (torchvision's datasets do), else from one pass over its items.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
from PIL import Image
from torch import Tensor

from hasten.data.conform import Target, decide_target
from hasten.data.datasets import ImageDataset
from hasten.data.fitting import SQUASH
from hasten.data.items import ItemFacts, StreamSplit, TensorItems, item_pixels, read_passes
from hasten.data.preprocessing import check_finite
from hasten.data.transforms import resize_images, set_channels
from hasten.errors import DataError, their_error
from hasten.progress import say

STATS_SAMPLE = 1000  # streamed items read to estimate the per-channel mean and std
# items of each streamed part read at the start, spread over it, to see whether its images come in one size and
# channel count or several (an image folder reads 512 headers; an item costs its whole __getitem__)
SIZE_SAMPLE = 256
MAX_ITEMS = 100_000_000  # items of a Dataset hasten indexes (an int64 index of them is 800 MB)


def _is_array(value: object) -> bool:
    return isinstance(value, (Tensor, numpy.ndarray))


def is_image_list(value: object) -> bool:
    """A list (or tuple) of single images: each a PIL image, an array or tensor of 2 or 3 axes, or an image file's
    path (a CSV's column of file names, read with Pillow)."""
    return (
        isinstance(value, (tuple, list))
        and len(value) > 0
        and all(isinstance(v, Image.Image | str | Path) or (_is_array(v) and v.ndim in (2, 3)) for v in value)
    )


def is_pair(value: object) -> bool:
    """An `(images, labels)` pair: a 2-sequence whose first item is an array of 3 or more axes, or a list of single
    images (a list of arrays of 2 or 3 axes, or of PIL images: labels, 1-axis, are never one), and whose second
    is labels. A second item that holds images (an array of 3 or more axes, a PIL image) is no labels: `(train,
    test)` of pairs whose labels are one-hot or (N, 1) would read as a list of two single images otherwise."""
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and ((_is_array(value[0]) and value[0].ndim >= 3) or is_image_list(value[0]))
        and (_is_array(value[1]) or (isinstance(value[1], (list, tuple)) and not _holds_images(value[1])))
    )


def _holds_images(values: list | tuple) -> bool:
    """Whether a sequence given where labels go holds images: an array of 3 or more axes (images; one-hot rows
    have 1, a labels column 2), or a PIL image."""
    return any(isinstance(v, Image.Image) or (_is_array(v) and v.ndim >= 3) for v in values)


def is_dataset(value: object) -> bool:
    """A map-style dataset of (image, label) items: indexable and sized, and not a plain pair or path."""
    if isinstance(value, (tuple, list, str, Path, Tensor, numpy.ndarray, dict)):
        return False
    return hasattr(value, "__getitem__") and hasattr(value, "__len__")


def _channels_first(array: Tensor, where: str) -> Tensor:
    """(N, C, H, W) from N x H x W, N x H x W x C or N x C x H x W: the channel axis is the smaller of 1 and 3."""
    if array.ndim == 3:
        return array[:, None]
    if array.ndim != 4:
        raise DataError(f"{where}: images must be N x H x W, N x H x W x C or N x C x H x W, got {tuple(array.shape)}")
    return array.permute(0, 3, 1, 2) if array.shape[3] < array.shape[1] else array


def _numbers(values: Any, where: str, what: str) -> Tensor:
    """`values` as a CPU tensor; a DataError naming `where` and the type when torch cannot hold it (strings, Python
    objects: numpy's `object_` arrays)."""
    if isinstance(values, Tensor):
        return values.detach().cpu()
    try:
        return torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError):
        dtype = getattr(values, "dtype", None)
        kind = f"{type(values).__name__} of {dtype}" if dtype is not None else type(values).__name__
        raise DataError(f"{where}: the {what} ({kind}) are not numbers torch can hold") from None


def as_images(images: Any, where: str) -> Tensor:
    """(N, C, H, W) images from a tensor or numpy array in any of the layouts above: uint8 for the in-memory path
    (integer types holding 0..255 are converted); floating-point images stay float32, which the loader streams
    (normalised by their own statistics, whatever their scale). Complex numbers are no pixels: refused, since
    keeping their real part (what a cast to float does) would silently drop half of what the user has."""
    array = _numbers(images, where, "images")
    if array.dtype.is_complex:
        raise DataError(f"{where}: images are {str(array.dtype).removeprefix('torch.')} (complex numbers); give "
                        "real pixels, uint8 0..255 or floats (e.g. their magnitude, .abs())")  # fmt: skip
    if array.dtype.is_floating_point:
        check_finite(array, where, "training")
        return _channels_first(array, where).float().contiguous()
    if array.dtype == torch.bool:
        raise DataError(f"{where}: images are bool; give uint8 pixels 0..255 or floats")
    if array.dtype != torch.uint8:
        pixels = array.numpy()  # numpy's min and max: torch has none for uint16, uint32, uint64
        if len(array) and (int(pixels.min()) < 0 or int(pixels.max()) > 255):
            low, high = int(pixels.min()), int(pixels.max())
            raise DataError(
                f"{where}: integer images must hold pixels 0..255, got {low}..{high}; give images of a wider range "
                "(16-bit scans, sensor counts) as floats, e.g. images.astype('float32'): floats are normalised by "
                "their own statistics, whatever their scale"
            )
        array = array.to(torch.uint8)
    return _channels_first(array, where).contiguous()


def as_labels(labels: Any, count: int, where: str, num_classes: int | None = None) -> Tensor:
    """int64 labels (N,) from a tensor, array or list of integers; each must be a class index in [0, num_classes)
    ([0, inf) when the class count is not known), else a DataError naming `where`, the first bad index and its
    value. Whole-number floats (3.0) are taken as the integers they are: label arrays come as floats from pandas,
    MATLAB files and float tensors, and nothing is lost; a fraction (2.5), NaN or inf is refused, since making it
    an integer would move the example to another class without a word."""
    values = _numbers(labels, where, "labels")
    if values.dtype.is_complex:
        raise DataError(f"{where}: labels are {str(values.dtype).removeprefix('torch.')}; they must be class "
                        "indices, integers 0..K-1")  # fmt: skip
    if values.ndim == 2 and values.shape[1] > 1 and len(values) and _one_hot(values):
        values = values.to(torch.int64).argmax(1)  # Keras' to_categorical: one 1 a row
    if values.ndim > 1 and values.shape[1:] != (1,):
        raise DataError(
            f"{where}: labels must be one class index per image (N,), or one-hot rows (one 1, the rest 0); got "
            f"{tuple(values.shape)} that are neither (soft targets: give each image's class)"
        )
    values = values.reshape(-1)
    if len(values) != count:
        raise DataError(f"{where}: {count} images but {len(values)} labels")
    if values.dtype.is_floating_point:
        fractional = ~torch.isfinite(values) | (values != values.round())
        if bool(fractional.any()):
            first = int(fractional.nonzero()[0])
            raise DataError(
                f"{where}: labels must be class indices, whole numbers 0..K-1: found {float(values[first])!r} at "
                f"index {first} ({int(fractional.sum()):,} label(s) are not whole numbers)"
            )
    values = values.to(torch.int64)
    check_label_range(values, where, num_classes)
    return values


def _one_hot(values: Tensor) -> bool:
    """Whether (N, K) labels (real numbers or bool) are one-hot rows: each exactly one 1 and K - 1 zeros."""
    return bool(((values == 0) | (values == 1)).all()) and bool((values.sum(1) == 1).all())


def check_label_range(labels: Tensor, where: str, num_classes: int | None) -> None:
    """DataError naming `where`, the first label outside [0, num_classes) (or below 0 when the class count is not
    known), at its index, and how many there are."""
    bad = labels < 0 if num_classes is None else (labels < 0) | (labels >= num_classes)
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0])
    bounds = f"[0, {num_classes}) (the {num_classes} class names)" if num_classes is not None else "[0, classes)"
    raise DataError(f"{where}: labels outside {bounds}: found {int(labels[first])} at index {first} "
                    f"({int(bad.sum()):,} such label(s))")  # fmt: skip


@dataclasses.dataclass
class ItemList:
    """A part given as a list of single images: each as (C, H, W), in the sizes and channels they came in, until
    `conform` brings them to one shape."""

    images: list[Tensor]
    labels: Tensor
    name: str


@dataclasses.dataclass
class StreamedData:
    """The user's data when a part is a Dataset: both splits streamed, the class names, the image shape."""

    name: str
    train: StreamSplit
    test: StreamSplit
    classes: list[str]
    image_shape: tuple[int, int, int]
    resizer: str | None = None  # "pillow" when images were resized to reach the run's size (preprocessing.resizer_of)
    notes: tuple[str, ...] = ()  # what was decided about the images' size and channels: the run says each
    value_range: tuple[float, float] | None = None  # float training images' smallest and largest value (stream_stats)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def dataset_labels(dataset: Any, name: str, workers: int, num_classes: int | None = None) -> Tensor:
    """Every item's label, each a class index below `num_classes` when that is known: the Dataset's `targets` or
    `labels` when it has them as numbers at its length, else one pass over its items in DataLoader workers (which
    reads the images too)."""
    for attribute in ("targets", "labels"):
        try:
            values = getattr(dataset, attribute, None)
        except Exception as error:  # noqa: BLE001 - a property of theirs that raises
            raise DataError(f"{name}: reading your Dataset's .{attribute} raised {their_error(error)}") from None
        if values is None or callable(values):
            continue
        try:
            sized = len(values) == len(dataset)
            numbers = values if isinstance(values, Tensor) else torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):  # not one number per item (class names, a dict): ask the items
            continue
        if sized:
            return as_labels(numbers, len(dataset), f"{name}.{attribute}", num_classes)
    plan = [list(range(i, min(i + 256, len(dataset)))) for i in range(0, len(dataset), 256)]
    labels = [item[0] for item in read_passes(ItemFacts(dataset, name, num_classes), plan, workers)]
    return torch.cat(labels) if labels else torch.zeros(0, dtype=torch.int64)


def stratified_holdout(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """(kept, held-out) indices: round(fraction x n_c) of each class c's n_c images, drawn from a generator seeded
    by `seed`, at least one of every class that has two or more; each list in dataset order."""
    generator = torch.Generator().manual_seed(seed)
    held = []
    for cls in labels.unique().tolist():
        members = torch.nonzero(labels == cls).flatten()
        count = round(fraction * len(members))
        count = max(count, 1) if len(members) > 1 else count
        held.append(members[torch.randperm(len(members), generator=generator)[:count]])
    mask = torch.zeros(len(labels), dtype=torch.bool)
    if held:
        mask[torch.cat(held)] = True
    return torch.nonzero(~mask).flatten(), torch.nonzero(mask).flatten()


def unwrap_loader(value: Any) -> Any:
    """A DataLoader's Dataset: batching, order and workers come from the recipe (train.batch_size, seed,
    data.workers), so the loader's own settings are set aside, with a note."""
    if isinstance(value, torch.utils.data.DataLoader):
        say(
            f"data: took the Dataset ({type(value.dataset).__name__}) out of the DataLoader; batches, order and "
            "workers come from the recipe (train.batch_size, seed, data.workers)"
        )
        return value.dataset
    return value


def _label_names(part: Any) -> list[str] | None:
    """A pair's labels when they are class names (strings), else None (numbers, or not a pair)."""
    if part is None or not is_pair(part) or isinstance(part[1], Tensor):
        return None
    labels = numpy.asarray(part[1], dtype=object).reshape(-1)
    if not len(labels) or not all(isinstance(label, str) for label in labels):
        return None
    return [str(label) for label in labels]


def named_labels(train: Any, test: Any, names: list[str] | None) -> tuple[Any, Any, list[str] | None]:
    """Pairs whose labels are class names ("cat", "dog") as class indices: into `names` where given, else into
    the names found, sorted (said); the parts as they are where their labels are numbers. A name not among
    `names`, or names in one part and numbers in the other, is a DataError."""
    found = [_label_names(train), _label_names(test)]
    if all(labels is None for labels in found):
        return train, test, names
    if test is not None and is_pair(test) and None in found:
        raise DataError("data: the labels of one part are class names and the other's are numbers: give both alike")
    seen = sorted({label for labels in found if labels is not None for label in labels})
    if names is None:
        names = seen
        print(f"data: the labels are class names: {len(names)} classes, in sorted order ({', '.join(names[:8])}"
              f"{', ...' if len(names) > 8 else ''})")  # fmt: skip
    elif unknown := [label for label in seen if label not in names]:
        raise DataError(f"data: label {unknown[0]!r} is not one of the class names {names} ({len(unknown)} such)")
    index = {name: i for i, name in enumerate(names)}
    train, test = (
        (part[0], [index[label] for label in labels]) if labels is not None else part
        for part, labels in zip((train, test), found, strict=True)
    )
    return train, test, names


def shape_of(pair: bool) -> str:
    """The form of a 3-item data argument, as its errors name it."""
    return "(images, labels, class_names)" if pair else "(train, test, class_names)"


def distinct_names(names: Sequence[str], where: str) -> None:
    """DataError naming `where` and the first name given twice: label i is names[i], and two classes of one name
    would each be shown as the other."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise DataError(f"{where}: {name!r} is given twice (at {names.index(name)} and {i}); each class needs "
                            "a name of its own")  # fmt: skip
        seen.add(name)


def split_parts(data: Any) -> tuple[Any, Any | None, list[str] | None]:
    """(train part, evaluation part or None, class names or None) from the user's data argument."""
    data = unwrap_loader(data)
    if is_pair(data) or is_dataset(data):
        return data, None, None
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        names = data[2] if len(data) == 3 else None
        pair = is_pair(tuple(data[:2]))  # (images, labels, class_names): one part, named, not (train, test, names)
        if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
            raise DataError(f"data: the third item of {shape_of(pair)} must be a list of class names")
        names = list(names) if names is not None else None
        if names is not None:
            distinct_names(names, f"data: the class names of {shape_of(pair)}")
        return (tuple(data[:2]), None, names) if pair else (data[0], data[1], names)
    raise DataError(
        f"data: expected an (images, labels) pair, (images, labels, class_names), a Dataset of (image, label), an "
        f"image folder path, (train, test) or (train, test, class_names); got {type(data).__name__}"
    )


Part = tuple[Tensor, Tensor] | StreamSplit  # one split: uint8 images and labels in memory, or streamed items


def _part(value: Any, where: str, workers: int, num_classes: int | None) -> Part | ItemList:
    """One part of the data (a split), its labels checked: class indices, below `num_classes` when it is known
    (class names given), so a bad one is named at the user's own index, before any holdout or subset moves it."""
    value = unwrap_loader(value)
    if isinstance(value, torch.utils.data.IterableDataset):
        raise DataError(
            f"{where}: an IterableDataset ({type(value).__name__}) has no indices to shuffle, shard per rank and "
            "resume from; give a map-style Dataset (__getitem__ and __len__)"
        )
    if is_pair(value) and not _is_array(value[0]):  # a list of single images, of one size or several
        images = [item_pixels(image, f"{where} images[{i}]") for i, image in enumerate(value[0])]
        return ItemList(images, as_labels(value[1], len(images), f"{where} labels", num_classes), f"{where} images")
    if is_pair(value):
        images = as_images(value[0], f"{where} images")
        labels = as_labels(value[1], len(images), f"{where} labels", num_classes)
        if images.dtype != torch.uint8:  # floats keep their precision: streamed from memory, not sliced as uint8
            return StreamSplit(TensorItems(images, labels), torch.arange(len(labels)), labels, f"{where} (floats)")
        return images, labels
    if is_dataset(value):
        name = f"{where} ({type(value).__name__})"
        try:
            count = len(value)
        except (TypeError, ValueError, OverflowError) as error:  # len() above sys.maxsize, or not an int
            raise DataError(f"{name}: len() fails: {error}") from None
        except Exception as error:  # noqa: BLE001 - whatever their __len__ raises
            raise DataError(f"{name}: your Dataset's len() raised {their_error(error)}") from None
        if count == 0:
            raise DataError(f"{name}: the Dataset is empty")
        if count > MAX_ITEMS:
            raise DataError(f"{name}: len() is {count:,}; hasten indexes at most {MAX_ITEMS:,} items of a Dataset")
        labels = dataset_labels(value, name, workers, num_classes)
        return StreamSplit(value, torch.arange(count), labels, name, num_classes)
    raise DataError(
        f"{where}: expected an (images, labels) pair of arrays or a Dataset of (image, label), "
        f"got {type(value).__name__}"
    )


def _shapes(part: Part | ItemList, workers: int) -> list[tuple[int, int, int]]:
    """The image shapes (C, H, W) of a sample of `part`: every image of a list, a spread of a streamed part's items,
    an array's one shape for each of up to SIZE_SAMPLE images."""
    if isinstance(part, ItemList):
        return [tuple(int(n) for n in image.shape) for image in part.images]
    if isinstance(part, StreamSplit):
        return part.shapes(SIZE_SAMPLE, workers)
    return [tuple(int(n) for n in part[0].shape[1:])] * min(len(part[0]), SIZE_SAMPLE)


def _conform(part: Part | ItemList, target: Target) -> Part:
    """`part` with its images brought to `target`: an array resized with torch as a whole (as `prepare` resizes a
    dataset), a list's images one by one with Pillow and stacked (uint8: held in memory; else streamed as floats),
    a streamed part's as each item is read."""
    if isinstance(part, StreamSplit):
        return dataclasses.replace(part, target=target)
    if isinstance(part, ItemList):
        images = [target.apply(image, f"{part.name}[{i}]") for i, image in enumerate(part.images)]
        for i, image in enumerate(images):
            if tuple(image.shape) != target.shape:
                raise DataError(f"{part.name}[{i}]: image of shape {tuple(image.shape)} but the others are "
                                f"{target.shape}; set data.size (data.rgb for the channels)")  # fmt: skip
        if all(image.dtype == torch.uint8 for image in images):
            return torch.stack(images), part.labels
        floats = torch.stack([image.float() for image in images])
        return StreamSplit(TensorItems(floats, part.labels), torch.arange(len(floats)), part.labels,
                           f"{part.name} (floats)")  # fmt: skip
    images, labels = part
    if target.size is not None and tuple(images.shape[2:]) != target.size:
        images = resize_images(images, target.size[0], fit=target.fit)
    if target.channels is not None:
        images = set_channels(images, target.channels == 3)
    return images, labels


def _stream(part: tuple[Tensor, Tensor] | StreamSplit, name: str) -> StreamSplit:
    if isinstance(part, StreamSplit):
        return part
    images, labels = part
    return StreamSplit(TensorItems(images, labels), torch.arange(len(labels)), labels, name)


def _take(part: tuple[Tensor, Tensor] | StreamSplit, positions: Tensor) -> tuple[Tensor, Tensor] | StreamSplit:
    return part.take(positions) if isinstance(part, StreamSplit) else (part[0][positions], part[1][positions])


def _labels(part: tuple[Tensor, Tensor] | StreamSplit) -> Tensor:
    return part.labels if isinstance(part, StreamSplit) else part[1]


def own_data(
    data: Any,
    *,
    classes: Sequence[str] | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    subset: int | None = None,
    test_subset: int | None = None,
    workers: int = 0,
    name: str = "own",
    size: int | None = None,
    rgb: bool | None = None,
    fit: str = SQUASH,
) -> ImageDataset | StreamedData:
    """The user's data (module docstring) as an in-memory `ImageDataset` when every part is held in memory, else
    as `StreamedData`. `val_fraction` > 0 holds out that share of the training part (seeded, stratified) as the
    evaluation split; it is required when no evaluation part is given. `classes` names the labels (the data's
    own names, when it brings them, must be the same); without names they are "0".."K-1", K = the largest label + 1.
    `size`, `rgb` and `fit` are data.size, data.rgb and data.resize: every image is brought to the shape they and
    the images' own sizes decide (hasten/data/conform.py), said in the result's `notes`."""
    train_value, test_value, names = split_parts(data)
    if classes:
        distinct_names(list(classes), "data.classes")
    train_value, test_value, names = named_labels(
        train_value, test_value, names or (list(classes) if classes else None)
    )
    if names is not None and classes and list(classes) != list(names):
        raise DataError(
            f"data.classes: {list(classes)} are not the class names the data brings ({list(names)}); give one of "
            "the two"
        )
    names = names or (list(classes) if classes else None)
    count = len(names) if names is not None else None
    given = [_part(train_value, "data: train", workers, count)]
    if test_value is None and not val_fraction:
        raise DataError(
            "data: only a training part was given: give (train, test), or hold out a share of it with "
            "data.val_fraction=0.1 (seeded, stratified by class)"
        )
    if test_value is not None and not val_fraction:
        given.append(_part(test_value, "data: test", workers, count))
    elif test_value is not None:
        print("data.val_fraction: evaluating on the held-out part of train; the given test part is not used")
    if any(isinstance(part, StreamSplit) for part in given):  # arrays beside a Dataset: resized as its items are
        given = [_stream(part, f"data: {split}") if type(part) is tuple else part
                 for part, split in zip(given, ("train", "test"), strict=False)]  # fmt: skip
    shapes = [_shapes(part, workers) for part in given]
    target, notes = decide_target([shape for sample in shapes for shape in sample], size, rgb, fit)
    # resized with Pillow: a list's or a streamed part's images of another size (arrays are resized with torch)
    resized = any(target.resizes(sample) for part, sample in zip(given, shapes, strict=True) if type(part) is not tuple)
    train, *rest = (_conform(part, target) for part in given)
    if rest:
        test = rest[0]
    else:
        kept, held = stratified_holdout(_labels(train), val_fraction, seed)
        train, test = _take(train, kept), _take(train, held)
    if subset:
        train = _take(train, torch.arange(min(subset, len(_labels(train)))))
    if test_subset:
        test = _take(test, torch.arange(min(test_subset, len(_labels(test)))))
    if len(_labels(train)) == 0 or len(_labels(test)) == 0:
        raise DataError(_empty_split(len(_labels(train)) == 0, held_out=not rest, val_fraction=val_fraction))
    largest = max(int(_labels(train).max()), int(_labels(test).max()))  # each part checked against the names
    if names is None:
        check_sparse_labels(_labels(train), _labels(test))
    names = names or [str(i) for i in range(largest + 1)]
    if isinstance(train, tuple) and isinstance(test, tuple):
        if train[0].shape[1:] != test[0].shape[1:]:
            raise DataError(f"data: train images are {tuple(train[0].shape[1:])} (C, H, W), test images "
                            f"{tuple(test[0].shape[1:])}")  # fmt: skip
        return ImageDataset(name, train[0], train[1], test[0], test[1], names, resizer="pillow" if resized else None,
                            notes=tuple(notes))  # fmt: skip
    train_split, test_split = (
        dataclasses.replace(_stream(part, f"data: {split}"), num_classes=len(names))
        for part, split in ((train, "train"), (test, "test"))
    )
    first = train_split.batches()[[0]]
    if isinstance(first, str):
        raise DataError(first)
    return StreamedData(name, train_split, test_split, names, tuple(first[0].shape[1:]), "pillow" if resized else None,
                        tuple(notes))  # fmt: skip


SPARSE_CLASSES = 1000  # labels without names implying more classes than this, ...
SPARSE_SHARE = 10  # ... and this many times the labels in use: ids, not class indices


def check_sparse_labels(train: Tensor, test: Tensor) -> None:
    """DataError naming the largest label when labels given without class names imply over SPARSE_CLASSES classes
    (label k makes k + 1) and SPARSE_SHARE times as many as appear: ids (a stray 50,000,000, product codes) read as
    class indices would build a model with a head that size, or one too large to build, blamed on the model."""
    both = torch.cat([train, test])
    implied, used = int(both.max()) + 1, int(torch.unique(both).numel())
    if implied > SPARSE_CLASSES and implied > SPARSE_SHARE * used:
        where = "train" if int(train.max()) + 1 == implied else "test"
        part = train if where == "train" else test
        index = int((part == implied - 1).nonzero()[0])
        raise DataError(
            f"data: {where} label {implied - 1:,} (at index {index:,}) makes {implied:,} classes, of which {used:,} "
            "have images: labels are class indices 0..K-1; map them first (numpy.unique(labels, "
            "return_inverse=True)) or give the class names"
        )


def _empty_split(training: bool, *, held_out: bool, val_fraction: float | None) -> str:
    """Why a split came out empty, and what changes it."""
    if training:
        return "data: the training split is empty: the training part holds no image"
    if held_out:
        return (
            f"data: the evaluation split is empty: data.val_fraction={val_fraction} holds out no image (it takes "
            "round(fraction x count) of each class, at least 1 of a class with 2 or more images); raise "
            "data.val_fraction, or give the evaluation images as (train, test)"
        )
    return "data: the evaluation split is empty: the test part given holds no image"


def hold_out(data: ImageDataset, fraction: float, seed: int) -> ImageDataset:
    """An in-memory dataset whose evaluation split is `fraction` of its training images (seeded, stratified)."""
    kept, held = stratified_holdout(data.train_labels, fraction, seed)
    images, labels = data.train_images, data.train_labels
    return dataclasses.replace(data, train_images=images[kept], train_labels=labels[kept], test_images=images[held],
                               test_labels=labels[held])  # fmt: skip


def stream_stats(
    split: StreamSplit, seed: int = 0, sample: int = STATS_SAMPLE
) -> tuple[Tensor, Tensor, tuple[float, float] | None]:
    """Per-channel mean and std, in the units `ShardedEpochs.normalise` divides by 255 (so float images of any
    scale are standardised too), from a seeded sample of up to `sample` training items; and for float images the
    sample's smallest and largest value (what a file's pixels are brought to: preprocessing.units_of), else None."""
    from hasten.data.loader import channel_stats

    picked = torch.randperm(len(split.indices), generator=torch.Generator().manual_seed(seed))[:sample]
    item = split.batches()[picked.sort().values.tolist()]
    if isinstance(item, str):
        raise DataError(item)
    images = item[0]
    value_range = (float(images.min()), float(images.max())) if images.is_floating_point() and len(images) else None
    return *channel_stats(images), value_range
