"""The generated image folders of the generalization suite (benchmarks/datasets.py): seeded (same seed, same
bytes), the classes, counts, modes and sizes declared, readable by the image-folder reader, mirror-sensitive where
they claim to be, and never written over a folder that is there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
import torch
from PIL import Image

from benchmarks import datasets
from benchmarks.glyphs import GLYPHS_100, LETTERS, glyph_mask
from benchmarks.procedural import ARROW_MIRROR, GREY_TEXTURES, TEXTURE_MIRROR
from hasten.data.imagefolder import open_image_folder, read_into_memory
from hasten.errors import DataError

# a few images a class: enough to check the bytes, classes and shapes
SMALL = {name: {"train_per_class": 3, "val_per_class": 1} for name in datasets.REGISTRY}
SMALL["imbalanced"] = {"largest": 6, "smallest": 2, "val_per_class": 1}
# name -> (image mode, size): (width, height), or None where each image has its own
SHAPES = {
    "letters": ("RGB", (32, 32)),
    "letters-jpeg": ("RGB", None),
    "glyphs-100": ("RGB", (32, 32)),
    "imbalanced": ("RGB", (32, 32)),
    "few-shot": ("RGB", (32, 32)),
    "textures-grey": ("L", (32, 32)),
    "textures-colour": ("RGB", (32, 32)),
    "scenes": ("RGB", (40, 40)),
    "arrows": ("L", (28, 28)),
    "colours": ("RGB", (32, 32)),
    "shapes": ("L", (28, 28)),
}


def test_every_registered_set_is_checked_here() -> None:
    assert set(SHAPES) == set(datasets.REGISTRY)
    assert len(datasets.REGISTRY) >= 11


@pytest.mark.parametrize("name", sorted(datasets.REGISTRY))
def test_same_seed_same_bytes_other_seed_other_images(tmp_path: Path, name: str) -> None:
    a = datasets.generate(name, tmp_path / "a", seed=3, **SMALL[name])
    b = datasets.generate(name, tmp_path / "b", seed=3, **SMALL[name])
    c = datasets.generate(name, tmp_path / "c", seed=4, **SMALL[name])
    assert a["sha256"] == b["sha256"] == datasets.folder_digest(tmp_path / "b")
    assert a["sha256"] != c["sha256"]
    assert json.loads((tmp_path / "a" / "dataset.json").read_text()) == a
    assert a["name"] == name and a["seed"] == 3 and a["version"] == datasets.VERSION


@pytest.mark.parametrize("name", sorted(datasets.REGISTRY))
def test_classes_counts_modes_sizes_and_the_reader(tmp_path: Path, name: str) -> None:
    spec = datasets.REGISTRY[name]
    record = datasets.generate(name, tmp_path, seed=0, **SMALL[name])
    train_counts = [6, 5, 5, 4, 4, 3, 3, 3, 2, 2] if name == "imbalanced" else [3] * spec.classes
    assert record["counts"] == {"train": sum(train_counts), "val": spec.classes}
    mode, size = SHAPES[name]
    for split, counts in (("train", train_counts), ("val", [1] * spec.classes)):
        folders = sorted(p for p in (tmp_path / split).iterdir())
        assert len(folders) == spec.classes
        assert len({f.name.lower() for f in folders}) == spec.classes  # distinct on a case-folding file system
        assert [len(list(f.iterdir())) for f in folders] == counts
        for folder in folders:
            with Image.open(next(folder.iterdir())) as image:
                assert image.mode == mode
                if size:
                    assert image.size == size
                else:
                    assert image.format == "JPEG" and all(48 <= side <= 96 for side in image.size)
    assert not list(tmp_path.glob(".generating-*"))  # the staging folder is gone
    read = dict(item.split("=") for item in spec.read)
    folder = open_image_folder(tmp_path, size=int(read["data.size"]) if "data.size" in read else None)
    data = read_into_memory(folder)
    assert data.num_classes == spec.classes
    assert numpy.bincount(data.test_labels.numpy()).tolist() == [1] * spec.classes
    assert data.train_images.float().std() > 10  # not blank images


def test_the_default_sizes(tmp_path: Path) -> None:
    """The imbalanced set falls from 300 to 30 (10:1) geometrically; few-shot has 20 training images a class."""
    counts = datasets.geometric_counts(300, 30, 10)
    assert counts == [300, 232, 180, 139, 108, 83, 65, 50, 39, 30] and sum(counts) == 1226
    assert datasets.generate("few-shot", tmp_path / "few")["counts"] == {"train": 200, "val": 400}


def test_letters_jpeg_sizes_vary(tmp_path: Path) -> None:
    datasets.generate("letters-jpeg", tmp_path, train_per_class=8, val_per_class=1)
    sizes = set()
    for path in (tmp_path / "train").rglob("*.jpg"):
        with Image.open(path) as image:
            sizes.add(image.size)
    assert len(sizes) > 40 and any(w != h for w, h in sizes)  # non-square, of many sizes


def _ink(image: Image.Image) -> numpy.ndarray:
    """How far each pixel is from the background colour (the border's median), scaled to [0, 1]."""
    pixels = numpy.asarray(image.convert("RGB"), dtype=numpy.float64)
    border = numpy.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    distance = numpy.linalg.norm(pixels - numpy.median(border, axis=0), axis=-1)
    return distance / (distance.max() + 1e-9)


def _lean(image: Image.Image, half: str) -> float:
    """Where the ink of the glyph's top or bottom half sits across its bounding box: < 0 left, > 0 right."""
    ys, xs = numpy.nonzero(_ink(image) > 0.5)
    middle = (ys.min() + ys.max()) / 2
    chosen = ys < middle if half == "top" else ys > middle
    return float((xs[chosen].mean() - (xs.min() + xs.max()) / 2) / max(xs.max() - xs.min(), 1))


def test_letters_are_mirror_sensitive(tmp_path: Path) -> None:
    """In the written images, b's ascender and p's descender lean left, d's and q's right: a mirror turns b into
    what d looks like and p into q, so flips would teach wrong labels."""
    datasets.generate("letters", tmp_path, train_per_class=60, val_per_class=1)
    folders = {folder.name: folder for folder in (tmp_path / "train").iterdir()}
    assert sorted(folders) == ["0_small-b", "1_small-d", "2_small-p", "3_small-q", "4_capital-f", "5_capital-j",
                               "6_capital-l", "7_capital-n", "8_capital-r", "9_capital-s"]  # fmt: skip
    leans = {}
    for name, half in (("0_small-b", "top"), ("1_small-d", "top"), ("2_small-p", "bottom"), ("3_small-q", "bottom")):
        leans[name] = numpy.mean([_lean(Image.open(path), half) for path in sorted(folders[name].iterdir())])
    assert leans["0_small-b"] < -0.04 and leans["1_small-d"] > 0.04, leans
    assert leans["2_small-p"] < -0.04 and leans["3_small-q"] > 0.04, leans
    assert datasets.REGISTRY["letters"].mirror_sensitive


def test_glyph_pairs_are_mirror_images() -> None:
    """The mirror pairs of GLYPHS_100 and LETTERS: a mirrored glyph is nearer its twin than itself."""
    for left, right in ("bd", "()", "[]", "{}", "<>", "≤≥", "pq"):
        assert left in GLYPHS_100 + LETTERS and right in GLYPHS_100 + LETTERS
        a, b = glyph_mask(left, "DejaVuSans"), glyph_mask(right, "DejaVuSans")
        size = (32, 32)
        a, b = (numpy.asarray(m.resize(size), dtype=numpy.float64) for m in (a, b))
        mirrored = a[:, ::-1]
        assert numpy.abs(mirrored - b).mean() < 0.6 * numpy.abs(a - b).mean(), (left, right)


def _diagonal(image: Image.Image) -> float:
    """The mean product of the horizontal and vertical gradients, normalised: > 0 for lines rising to the right
    ("/"), < 0 for falling ones; a mirror flips its sign."""
    gy, gx = numpy.gradient(numpy.asarray(image, dtype=numpy.float64))
    return float((gx * gy).mean() / (gx**2 + gy**2).mean())


def test_textures_grey_diagonals_mirror_into_each_other(tmp_path: Path) -> None:
    datasets.generate("textures-grey", tmp_path, train_per_class=30, val_per_class=1)
    assert list(GREY_TEXTURES)[1:4:2] == ["1_stripes-45", "3_stripes-135"]
    values = {
        name: [_diagonal(Image.open(p)) for p in sorted((tmp_path / "train" / name).iterdir())]
        for name in TEXTURE_MIRROR
    }
    assert min(values["1_stripes-45"]) > 0.0 and numpy.mean(values["1_stripes-45"]) > 0.2
    assert max(values["3_stripes-135"]) < 0.0 and numpy.mean(values["3_stripes-135"]) < -0.2
    flipped = [_diagonal(Image.open(p).transpose(Image.Transpose.FLIP_LEFT_RIGHT))
               for p in sorted((tmp_path / "train" / "1_stripes-45").iterdir())]  # fmt: skip
    assert max(flipped) < 0.0  # a mirrored 45-degree texture is a 135-degree one


def test_arrows_mirror_into_another_class(tmp_path: Path) -> None:
    """Mirroring swaps an arrow class with its twin: what tells class A's mean image from class B's (A minus B),
    mirrored, is B minus A (cosine similarity near 1), while a mirror-invariant set would give A minus B back."""
    datasets.generate("arrows", tmp_path, seed=0, train_per_class=200, val_per_class=1)
    folder = open_image_folder(tmp_path)
    data = read_into_memory(folder)
    images, labels = data.train_images.float()[:, 0], data.train_labels
    means = {name: images[labels == i].mean(0) for i, name in enumerate(folder.classes)}

    def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a * b).sum() / (a.norm() * b.norm()))

    sensitive = [name for name, twin in ARROW_MIRROR.items() if twin != name]
    assert len(sensitive) == 6  # up and down are their own mirror images; the other six are not
    for name in sensitive:
        difference = means[name] - means[ARROW_MIRROR[name]]
        assert cosine(difference.flip(-1), -difference) > 0.6, name
    up_minus_down = means["2_up"] - means["6_down"]
    assert cosine(up_minus_down.flip(-1), up_minus_down) > 0.7
    assert ARROW_MIRROR["4_left"] == "0_right"


def test_colours_need_colour(tmp_path: Path) -> None:
    """Same shape, different colour: the mean of each colour channel differs between red, green and blue classes."""
    datasets.generate("colours", tmp_path, seed=0, train_per_class=30, val_per_class=1)
    folder = open_image_folder(tmp_path)
    data = read_into_memory(folder)
    images = data.train_images.float()
    channel_means = {name: images[data.train_labels == i].mean((0, 2, 3)) for i, name in enumerate(folder.classes)}
    for shape in ("circle", "square", "triangle"):
        for channel, colour in enumerate(("red", "green", "blue")):
            mine = channel_means[f"{colour}_{shape}"][channel]
            others = [channel_means[f"{c}_{shape}"][channel] for c in ("red", "green", "blue") if c != colour]
            assert all(mine > other + 10 for other in others), (colour, shape)


def _pairing(image: Image.Image) -> float:
    """|mean chroma| / mean |chroma| over the pixels: near 0 for two complementary hues (they cancel), near 1 for
    two neighbouring hues."""
    rgb = numpy.asarray(image, dtype=numpy.float64) / 255
    chroma = numpy.stack([rgb[..., 0] - rgb[..., 1], (rgb[..., 0] + rgb[..., 1]) / 2 - rgb[..., 2]], -1)
    chroma = chroma.reshape(-1, 2)
    return float(numpy.linalg.norm(chroma.mean(0)) / numpy.linalg.norm(chroma, axis=1).mean())


def test_textures_colour_classes_differ_by_the_pairing_of_hues(tmp_path: Path) -> None:
    datasets.generate("textures-colour", tmp_path, train_per_class=40, val_per_class=1)
    for pattern in ("stripes", "checkers", "dots", "rings", "blobs"):
        (complementary,) = (tmp_path / "train").glob(f"*_{pattern}-complementary")
        (analogous,) = (tmp_path / "train").glob(f"*_{pattern}-analogous")
        near = numpy.median([_pairing(Image.open(p)) for p in complementary.iterdir()])
        far = numpy.median([_pairing(Image.open(p)) for p in analogous.iterdir()])
        assert far > near + 0.3, (pattern, near, far)


def test_existing_folder_unknown_name_and_a_stale_folder_are_errors(tmp_path: Path) -> None:
    datasets.generate("shapes", tmp_path / "s", **SMALL["shapes"])
    before = datasets.folder_digest(tmp_path / "s")
    with pytest.raises(DataError, match="already exist"):
        datasets.generate("shapes", tmp_path / "s", **SMALL["shapes"])
    assert datasets.folder_digest(tmp_path / "s") == before
    with pytest.raises(DataError, match="letters"):
        datasets.generate("letter", tmp_path / "x")
    # ensure(): made when absent, reused when it is the same set, an error naming the folder otherwise
    made = datasets.ensure("few-shot", tmp_path / "f")
    assert datasets.ensure("few-shot", tmp_path / "f") == made
    with pytest.raises(DataError, match="few-shot seed 0 version"):
        datasets.ensure("few-shot", tmp_path / "f", seed=1)
    with pytest.raises(DataError, match="sizes"):
        datasets.ensure("shapes", tmp_path / "s")  # made at other sizes
    assert datasets.folder_digest(tmp_path / "f") == made["sha256"]


def test_the_command_line_writes_sets_and_contact_sheets(tmp_path: Path, capsys) -> None:
    assert datasets.main(["few-shot", str(tmp_path), "--sheets"]) == 0
    assert (tmp_path / "few-shot" / "dataset.json").is_file()
    with Image.open(tmp_path / "few-shot.png") as sheet:
        assert sheet.size[1] == 10 * 42  # one row a class
    assert datasets.main(["few-shot", str(tmp_path)]) == 2  # it is there: an error, not a second copy
    assert "already exist" in capsys.readouterr().err
