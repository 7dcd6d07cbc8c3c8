"""Datasets: readers (IDX, CIFAR pickles, scikit-learn digits, synthetic), resolution of a dataset name to a
folder of files (explicit root, $HASTEN_DATA, cache, system copies, checked download), and in-memory tensors."""

from __future__ import annotations

from hasten.data.datasets import ImageDataset, load_dataset
from hasten.data.sources import DATASETS, fetch, info, resolve

__all__ = ["DATASETS", "ImageDataset", "fetch", "info", "load_dataset", "resolve"]
