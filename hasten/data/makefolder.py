"""`hasten data make-folder`: any dataset hasten reads, written as an image folder (`OUT/train/<class>/*.png`,
`OUT/val/<class>/*.png`) that `data.name=imagefolder` reads back, so the image-folder path runs on real images
without a download. Class folders are prefixed with their label index (`0_T-shirt_top`, `1_Trouser`, ...), so
the folder's sorted order is the dataset's own label order.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from PIL import Image

from hasten.data.datasets import ImageDataset, load_dataset
from hasten.data.transforms import prepare
from hasten.errors import DataError


def folder_name(index: int, name: str, count: int) -> str:
    """A class's folder: its label index, zero-padded so the sorted order is the label order, then its name
    with anything but letters, digits, '.', '_' and '-' replaced ("T-shirt/top" -> "0_T-shirt_top")."""
    return f"{index:0{len(str(count - 1))}d}_{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}"


def write_image_folder(data: ImageDataset, out: str | Path, limit: int | None = None) -> dict[str, int]:
    """Write `data` as PNG files `out/train/<class>/<index>.png` and `out/val/...`; at most `limit` images
    per split (the first ones). Written into a staging folder and moved into place, so an interrupted
    write leaves no half folder. Returns the image count per split."""
    out = Path(out).expanduser()
    existing = [str(out / s) for s in ("train", "val") if (out / s).exists()]
    if existing:
        raise DataError(f"{' and '.join(existing)} already exist(s); remove it or choose another output folder")
    names = [folder_name(i, name, data.num_classes) for i, name in enumerate(data.classes)]
    staging = out / f".make-folder-{os.getpid()}"
    counts = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for split, images, labels in (
            ("train", data.train_images, data.train_labels),
            ("val", data.test_images, data.test_labels),
        ):
            images, labels = images[:limit], labels[:limit]
            for name in names:
                (staging / split / name).mkdir(parents=True, exist_ok=True)
            digits = len(str(max(len(images) - 1, 0)))
            pixels = images.permute(0, 2, 3, 1).numpy()  # (N, H, W, C), as Pillow wants
            for i, (array, label) in enumerate(zip(pixels, labels.tolist(), strict=True)):
                image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
                image.save(staging / split / names[label] / f"{i:0{digits}d}.png", compress_level=1)
            counts[split] = len(images)
        for split in ("train", "val"):
            os.replace(staging / split, out / split)
    except OSError as exc:
        raise DataError(f"cannot write the image folder into {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts


def make_folder(
    name: str,
    out: str | Path,
    *,
    root: str | Path | None = None,
    size: int | None = None,
    rgb: bool | None = None,
    limit: int | None = None,
) -> dict[str, int]:
    """`hasten data make-folder`: dataset `name` (found as `load_dataset` finds it) written as an image folder
    in `out`, the first `limit` images of each split, resized to `size` and with 3 channels when `rgb`."""
    data = load_dataset(name, root)
    if limit is not None:
        data.train_images, data.train_labels = data.train_images[:limit], data.train_labels[:limit]
        data.test_images, data.test_labels = data.test_images[:limit], data.test_labels[:limit]
    return write_image_folder(prepare(data, size=size, rgb=rgb), out)
