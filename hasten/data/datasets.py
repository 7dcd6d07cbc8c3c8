"""Datasets as whole uint8 tensors in memory: the train and test images and labels, and the class names.

Keeping a small dataset as one tensor and slicing batches out of it is what the fast MNIST and CIFAR
training records do (DESIGN.md, "Where speed comes from"); the batch loader works on this object.
Files are found (or downloaded) by `sources.resolve`; each dataset's reader is named by its registry entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hasten.data.readers import ReadOptions, digits_arrays, synthetic_arrays
from hasten.data.sources import get_spec, resolve

__all__ = ["ImageDataset", "digits_arrays", "load_dataset", "synthetic_arrays"]  # the readers' old home


@dataclass
class ImageDataset:
    """A labelled image dataset held in memory, images uint8 [N, C, H, W] and labels int64 [N]."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: list[str]
    # the image folder these were decoded from (data.in_memory), else None: its val/ or test/ split and its
    # Pillow resize are what summaries and exports record
    root: str | None = None
    # "pillow" where a user's list of images was resized with Pillow to one size, else None: what the run records
    # (hasten.data.preprocessing.resizer_of)
    resizer: str | None = None
    notes: tuple[str, ...] = ()  # what was decided about a user's images (size, channels): the run says each

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(self.train_images.shape[1:])


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
    folder = resolve(name, root, download) if spec.files else None  # generated sets have no files to find
    *arrays, classes = spec.reader(spec, folder, ReadOptions(synthetic_size=synthetic_size, seed=seed))
    train_images, train_labels, test_images, test_labels = (torch.from_numpy(a) for a in arrays)
    return ImageDataset(name, train_images, train_labels, test_images, test_labels, list(classes))
