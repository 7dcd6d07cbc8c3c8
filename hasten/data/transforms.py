"""What a recipe's `data` keys do to a dataset after it is read: image size and channel count, a cap on the
training images per class, and label noise.

Label noise follows Nakkiran et al., "Deep Double Descent: Where Bigger Models and More Data Hurt" (2019):
a fixed fraction of the training labels is replaced by a different class, drawn uniformly from a seeded
generator, so the training set cannot be fitted without memorising those images; that is the setting where
test error peaks at the interpolation threshold. The test labels are never touched.

Each function is pure (labels or images in, new tensors out, randomness passed in); `prepare` applies the
recipe's keys to an in-memory `ImageDataset`, and the image-folder reader applies the label ones to its file list.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hasten.data.datasets import ImageDataset
from hasten.data.fitting import SQUASH, fit_torch
from hasten.data.seeds import LABEL_NOISE, stream
from hasten.errors import DataError

# ITU-R 601-2 luma weights, as Pillow's convert("L") uses, so a folder written in colour and read as grey
# matches the in-memory path
LUMA = (0.299, 0.587, 0.114)


def resize_images(images: Tensor, size: int, chunk: int = 4096, fit: str = SQUASH) -> Tensor:
    """uint8 (N, C, H, W) images brought to (size, size) as `fit` (data.resize) says: bilinear (antialiased when
    shrinking), then cropped or padded (hasten/data/fitting.py), in chunks."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, images.shape[0], chunk):
        out[start : start + chunk] = fit_torch(images[start : start + chunk], size, size, fit)
    return out


def set_channels(images: Tensor, rgb: bool) -> Tensor:
    """uint8 (N, C, H, W) images with 3 channels (grey repeated) when `rgb`, else 1 (luma of colour images)."""
    channels = images.shape[1]
    if rgb and channels == 1:
        return images.expand(-1, 3, -1, -1).contiguous()
    if not rgb and channels == 3:
        weights = torch.tensor(LUMA).view(1, 3, 1, 1)
        return (images.float() * weights).sum(1, keepdim=True).round_().clamp_(0, 255).to(torch.uint8)
    return images


def first_per_class(labels: Tensor, count: int) -> Tensor:
    """Indices (in dataset order) of the first `count` images of each class."""
    keep = torch.zeros(len(labels), dtype=torch.bool)
    for cls in labels.unique():
        keep[torch.nonzero(labels == cls).flatten()[:count]] = True
    return torch.nonzero(keep).flatten()


def class_interleaved(labels: Tensor) -> Tensor:
    """Indices that visit the classes in turn (first of each class, then second of each, ...): taking the
    first N of them gives a balanced subset of a folder whose files are grouped by class."""
    if len(labels) == 0:
        return torch.zeros(0, dtype=torch.long)
    rank_in_class = torch.zeros(len(labels), dtype=torch.long)
    for cls in labels.unique():
        members = torch.nonzero(labels == cls).flatten()
        rank_in_class[members] = torch.arange(len(members))
    # stable sort by (rank within class, label): the file order breaks no ties, the key is unique
    return torch.argsort(rank_in_class * (int(labels.max()) + 1) + labels)


def flip_labels(labels: Tensor, fraction: float, num_classes: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """`labels` with exactly round(fraction * N) of them (chosen by `generator`) moved to another class, drawn
    uniformly from the other num_classes - 1; returns (noisy labels, sorted indices of the flipped ones)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"label noise must be in [0, 1), got {fraction}")
    if num_classes < 2:
        raise ValueError("label noise needs at least 2 classes")
    count = round(fraction * len(labels))
    chosen = torch.randperm(len(labels), generator=generator)[:count]
    # an offset in 1..C-1 added modulo C never lands on the true class, and is uniform over the others
    offsets = torch.randint(1, num_classes, (count,), generator=generator)
    noisy = labels.clone()
    noisy[chosen] = (labels[chosen] + offsets) % num_classes
    return noisy, chosen.sort().values


def noise_generator(seed: int) -> torch.Generator:
    """The generator label noise draws from: fixed by the run's seed, separate from every other stream."""
    return stream(seed, LABEL_NOISE)


def prepare(
    data: ImageDataset,
    *,
    per_class: int | None = None,
    label_noise: float = 0.0,
    size: int | None = None,
    rgb: bool | None = None,
    seed: int = 0,
    fit: str = SQUASH,
) -> ImageDataset:
    """`data` with the recipe's data keys applied: at most `per_class` training images per class, a fraction
    `label_noise` of training labels flipped (seeded), images resized to `size` (as `fit`, data.resize, says) and
    given 3 (`rgb`) or 1 channel."""
    if per_class is not None:
        keep = first_per_class(data.train_labels, per_class)
        data.train_images, data.train_labels = data.train_images[keep], data.train_labels[keep]
    if label_noise:
        if len(data.train_labels) == 0:
            raise DataError(f"{data.name}: no training images to add label noise to")
        data.train_labels, _ = flip_labels(data.train_labels, label_noise, data.num_classes, noise_generator(seed))
    if size is not None:
        data.train_images = resize_images(data.train_images, size, fit=fit)
        data.test_images = resize_images(data.test_images, size, fit=fit)
    if rgb is not None:
        data.train_images, data.test_images = set_channels(data.train_images, rgb), set_channels(data.test_images, rgb)
    return data
