"""data.resize (hasten/data/fitting.py): squash, crop and pad give the expected shapes and, on small hand-made images
whose every pixel is known, the expected pixels, alike through Pillow (files, a user's items) and torch (in-memory
arrays); an image folder decodes and caches by it, and the recorded preprocessing repeats it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.data import foldercache
from hasten.data.fitting import fit_pil, fit_pillow, fit_torch, fitted_size, place
from hasten.data.imagefolder import decode, open_image_folder, read_into_memory
from hasten.data.preprocessing import Preprocessing
from hasten.data.transforms import resize_images


def grid(height: int = 4, width: int = 8) -> np.ndarray:
    """uint8 H x W x 3: every pixel known (red = 10 x column + row + 1, green = 2 x red, blue 50), none zero."""
    rows, cols = np.mgrid[0:height, 0:width]
    red = 10 * cols + rows + 1
    return np.stack([red, 2 * red, np.full_like(red, 50)], -1).astype(np.uint8)


def chw(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))


def three_ways(pixels: np.ndarray, size: int, fit: str) -> list[torch.Tensor]:
    """An H x W x 3 image brought to size x size by each path: a Pillow image (folders, predict), a tensor item
    resized plane by plane with Pillow (lists, Datasets), a batch resized by torch (arrays)."""
    return [
        torch.from_numpy(fit_pil(Image.fromarray(pixels), size, size, fit)),
        fit_pillow(chw(pixels), size, size, fit),
        fit_torch(chw(pixels)[None], size, size, fit)[0],
    ]


@pytest.mark.parametrize(
    ("shape", "size", "expected"),
    [
        ((4, 8), 4, {"squash": (4, 4), "crop": (4, 8), "pad": (2, 4)}),
        ((8, 4), 4, {"squash": (4, 4), "crop": (8, 4), "pad": (4, 2)}),
        ((30, 40), 16, {"squash": (16, 16), "crop": (16, 21), "pad": (12, 16)}),
        ((5, 5), 16, {"squash": (16, 16), "crop": (16, 16), "pad": (16, 16)}),
    ],
)
def test_each_mode_resizes_to_its_geometry(shape, size, expected):
    for fit, resized in expected.items():
        assert fitted_size(*shape, size, size, fit) == resized
        for way in three_ways(np.zeros((*shape, 3), dtype=np.uint8), size, fit):
            assert tuple(way.shape) == (3, size, size)
    with pytest.raises(ValueError, match="squash, crop, pad"):
        fitted_size(4, 8, 4, 4, "stretch")


def test_crop_keeps_the_centre_and_pad_fills_the_short_axis_with_zeros():
    image = grid()  # 4 x 8
    centre = chw(image)[:, :, 2:6]  # the short side is already 4: nothing resampled, the middle 4 columns kept
    for way in three_ways(image, 4, "crop"):
        assert torch.equal(way, centre)
    for way in three_ways(image, 8, "pad"):  # the long side is already 8: the 4 rows centred, 2 zero rows each side
        assert torch.equal(way[:, 2:6], chw(image))
        assert int(way[:, :2].abs().sum()) == 0 and int(way[:, 6:].abs().sum()) == 0
    odd = grid(4, 7)  # an odd overhang: one column cut on the left, two on the right
    for way in three_ways(odd, 4, "crop"):
        assert torch.equal(way, chw(odd)[:, :, 1:5])
    bright = np.full((4, 8, 3), 200, dtype=np.uint8)  # resampled to 2 x 4, then padded to 4 x 4
    for way in three_ways(bright, 4, "pad"):
        assert torch.equal(way[:, 1:3], torch.full((3, 2, 4), 200, dtype=torch.uint8))
        assert int(way[:, 0].sum()) == 0 and int(way[:, 3].sum()) == 0
    # squash is a plain resize to the square, exactly Pillow's (the folder path's, as it always was)
    assert torch.equal(
        three_ways(image, 4, "squash")[0],
        chw(np.asarray(Image.fromarray(image).resize((4, 4), Image.Resampling.BILINEAR))),
    )
    floats = torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 7)  # a float item keeps its values
    assert torch.equal(fit_pillow(floats, 4, 4, "crop"), floats[:, :, 2:6])
    assert torch.equal(torch.as_tensor(place(np.ones((1, 2, 2)), 4, 4)).sum(), torch.tensor(4.0))


def write_tall_wide_folder(root: Path) -> np.ndarray:
    """train/ and val/ of two classes, each image the 4 x 8 grid (or its mirror); returns the grid."""
    image = grid()
    for split in ("train", "val"):
        for label, name in enumerate(("a", "b")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(image if label == 0 else image[:, ::-1].copy()).save(folder / f"{i}.png")
    return image


def test_a_folder_decodes_and_caches_by_the_mode(tmp_path):
    image = write_tall_wide_folder(tmp_path)
    path = str(tmp_path / "train" / "a" / "0.png")
    assert np.array_equal(decode(path, "RGB", (4, 4), True, "crop"), image.transpose(2, 0, 1)[:, :, 2:6])
    folders = {fit: open_image_folder(tmp_path, size=4, fit=fit) for fit in ("squash", "crop", "pad")}
    memory = read_into_memory(folders["crop"])
    assert torch.equal(memory.train_images[0], chw(image)[:, :, 2:6])
    assert torch.equal(read_into_memory(folders["pad"]).train_images[0, :, 0], torch.zeros(3, 4, dtype=torch.uint8))
    # each mode has its own cache: the key (and the file) changes with it, and not without a change
    paths = {fit: [plan.path for plan in foldercache.plan_cache(folder)] for fit, folder in folders.items()}
    assert len({tuple(p) for p in paths.values()}) == 3
    assert [plan.path for plan in foldercache.plan_cache(open_image_folder(tmp_path, size=4, fit="crop"))] == paths[
        "crop"
    ]
    cached = foldercache.fill_cache(folders["crop"], foldercache.plan_cache(folders["crop"]))
    assert torch.equal(read_into_memory(cached).train_images, memory.train_images)  # the cache holds the crops


def test_in_memory_arrays_are_brought_to_the_size_by_the_mode():
    images = torch.from_numpy(np.stack([grid(), grid()]).transpose(0, 3, 1, 2).copy())  # (2, 3, 4, 8)
    assert torch.equal(resize_images(images, 4, fit="crop"), images[:, :, :, 2:6])
    padded = resize_images(images, 8, fit="pad")
    assert torch.equal(padded[:, :, 2:6], images) and int(padded[:, :, :2].sum()) == 0
    assert torch.equal(resize_images(images, 4), resize_images(images, 4, fit="squash"))  # squash: the default


def test_the_recorded_preprocessing_repeats_the_mode_and_reads_older_records_as_squash():
    image = Image.fromarray(grid())
    for resizer in ("pillow", "torch"):
        crop = Preprocessing("RGB", 4, 4, (0.5,) * 3, (0.25,) * 3, resizer, "crop")
        assert torch.equal(crop.image(image), chw(grid())[:, :, 2:6])
        assert torch.equal(crop.batch(grid()[None])[0], chw(grid())[:, :, 2:6])  # arrays too, by the same resizer
        again = Preprocessing.from_dict(crop.to_dict())
        assert again == crop and "centre-crop" in crop.to_dict()["steps"]
        squash = Preprocessing("RGB", 4, 4, (0.5,) * 3, (0.25,) * 3, resizer)
        assert not torch.equal(squash.image(image), crop.image(image))
    older = {k: v for k, v in crop.to_dict().items() if k != "fit"}  # a summary.json written before data.resize
    assert Preprocessing.from_dict(older).fit == "squash"
    with pytest.raises(ValueError, match="preprocessing.fit"):
        Preprocessing.from_dict(crop.to_dict() | {"fit": "stretch"})
