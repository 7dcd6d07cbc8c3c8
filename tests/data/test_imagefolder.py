"""Image folders: scanning, decoding in workers, the same batches as the in-memory loader, clear errors for bad
files, `hasten data make-folder`, and a training run that reads a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
import torch
from PIL import Image

import hasten
from hasten.cli import main
from hasten.data import load_dataset
from hasten.data.imagefolder import (
    BatchDecoder,
    ImageFolderLoader,
    image_folder_loaders,
    open_image_folder,
    read_into_memory,
    scan_split,
)
from hasten.data.loader import Augment, InMemoryLoader
from hasten.data.makefolder import folder_name
from hasten.data.transforms import prepare
from hasten.errors import DataError
from hasten.recipe.schema import load_recipe
from hasten.run.loading import open_folder
from tests.counted import assert_counted

CLASSES = ["cat", "dog", "emu"]


def write_folder(root: Path, per_class: int = 5, size: int = 6, val_per_class: int = 2) -> dict[str, numpy.ndarray]:
    """A folder of RGB PNGs whose pixels all equal the image's number (0, 1, 2, ...), so a batch can be traced
    back to its files; returns the pixel value of each path."""
    values = {}
    count = 0
    for split, n in (("train", per_class), ("val", val_per_class)):
        for cls in CLASSES:
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = numpy.full((size, size, 3), count, dtype=numpy.uint8)
                path = folder / f"{i:03d}.png"
                Image.fromarray(pixels).save(path)
                values[str(path)] = count
                count += 1
    (root / "train" / "cat" / "notes.txt").write_text("not an image, ignored")
    return values


def test_entries_that_are_not_regular_files_are_skipped_unopened(tmp_path: Path) -> None:
    import os
    import socket

    write_folder(tmp_path)
    os.mkfifo(tmp_path / "train" / "cat" / "fifo.png")  # opening it would wait for a writer for ever
    os.mkfifo(tmp_path / "val" / "dog" / "fifo.png")
    (tmp_path / "train" / "dog" / "folder.png").mkdir()
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(os.path.relpath(tmp_path / "train" / "emu" / "socket.png"))  # a relative path: AF_UNIX's 108 bytes
    finally:
        server.close()
    (tmp_path / "train" / "emu" / "linked.png").symlink_to(tmp_path / "train" / "emu" / "000.png")  # read as today
    skipped: list = []
    val = scan_split(tmp_path / "val", CLASSES, skipped)  # first, as scanning opens nothing: no wait without the skip
    assert len(val.paths) == 6 and skipped == [(tmp_path / "val" / "dog" / "fifo.png", "a FIFO")]
    data = open_image_folder(tmp_path)
    assert len(data.train.paths) == 16 and len(data.test.paths) == 6
    assert str(tmp_path / "train" / "emu" / "linked.png") in data.train.paths
    assert not [p for p in data.train.paths + data.test.paths if "fifo" in p or "folder" in p or "socket" in p]
    assert data.notes == (
        f"data.root={tmp_path}: skipped 4 entries named like an image but not a regular file (FIFOs, sockets, devices, "
        "folders), e.g. train/cat/fifo.png (a FIFO)",
    )


def test_scan_classes_labels_and_shape(tmp_path: Path) -> None:
    write_folder(tmp_path)
    data = open_image_folder(tmp_path)
    assert data.classes == CLASSES and data.num_classes == 3
    assert len(data.train.paths) == 15 and len(data.test.paths) == 6
    assert data.train.labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert data.image_shape == (3, 6, 6) and data.mode == "RGB"
    assert open_image_folder(tmp_path, size=4, rgb=False).image_shape == (1, 4, 4)
    # subset visits the classes in turn; per_class takes the first N of each
    assert open_image_folder(tmp_path, subset=4).train.labels.tolist() == [0, 1, 2, 0]
    assert open_image_folder(tmp_path, per_class=2).train.labels.tolist() == [0, 0, 1, 1, 2, 2]


def test_batches_decode_every_file_once_normalised_and_labelled(tmp_path: Path) -> None:
    values = write_folder(tmp_path)
    data = open_image_folder(tmp_path)
    decoder = BatchDecoder(data.train, data.mode, data.size, data.resize)
    # mean 0, std 1/255: a normalised pixel equals its uint8 value
    loader = ImageFolderLoader(decoder, 4, mean=torch.zeros(3), std=torch.ones(3) / 255, shuffle=True, seed=1)
    assert len(loader) == 4 and loader.shard_size == 15
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.float32 and labels.dtype == torch.int64 and images.shape[1:] == (3, 6, 6)
        seen += images[:, 0, 0, 0].round().long().tolist()
        for value, label in zip(images[:, 0, 0, 0].tolist(), labels.tolist(), strict=True):
            path = next(p for p, v in values.items() if v == round(value))
            assert CLASSES[label] == Path(path).parent.name
    train_values = sorted(v for p, v in values.items() if "/train/" in p)
    assert sorted(seen) == train_values


def test_same_batches_as_the_in_memory_loader_with_and_without_workers(tmp_path: Path) -> None:
    write_folder(tmp_path, per_class=7)
    data = open_image_folder(tmp_path)
    decoder = BatchDecoder(data.train, data.mode, data.size, data.resize)
    images, labels = decoder[list(range(len(decoder)))]
    common = dict(mean=torch.zeros(3), std=torch.ones(3), shuffle=True, seed=3, augment=Augment(flip=True, translate=1))
    memory = InMemoryLoader(images, labels, 5, **common)
    for workers in (0, 1):
        folder = ImageFolderLoader(decoder, 5, workers=workers, **common)
        for epoch in (0, 1):  # the second epoch reuses the persistent workers
            memory.set_epoch(epoch)
            folder.set_epoch(epoch)
            pairs = list(zip(memory, folder, strict=True))
            assert all(torch.equal(m[0], f[0]) and torch.equal(m[1], f[1]) for m, f in pairs)
        resumed = list(folder.batches(start=2))  # mid-epoch resume, as the in-memory loader does it
        assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed, list(memory)[2:], strict=True))


def test_read_into_memory_matches_the_files(tmp_path: Path) -> None:
    values = write_folder(tmp_path)
    data = read_into_memory(open_image_folder(tmp_path, rgb=False))
    assert data.train_images.shape == (15, 1, 6, 6) and data.test_images.shape == (6, 1, 6, 6)
    assert data.classes == CLASSES and data.train_labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    first_val = min(v for p, v in values.items() if "/val/" in p)
    assert int(data.test_images[0, 0, 0, 0]) == first_val  # grey of an equal-channel pixel is its value


def test_ranks_partition_the_epoch(tmp_path: Path) -> None:
    write_folder(tmp_path, per_class=4)  # 12 images over 5 ranks: padded to 15
    data = open_image_folder(tmp_path)
    decoder = BatchDecoder(data.train, data.mode, data.size, data.resize)
    stats = dict(mean=torch.zeros(3), std=torch.ones(3) / 255)
    shards = [
        torch.cat(
            [x[:, 0, 0, 0] for x, _ in ImageFolderLoader(decoder, 2, shuffle=True, rank=r, world_size=5, **stats)]
        )
        for r in range(5)
    ]
    union = torch.cat(shards).round().long()
    assert {len(s) for s in shards} == {3} and len(set(union.tolist())) == 12


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_is_a_data_error_naming_the_file(tmp_path: Path, workers: int, monkeypatch) -> None:
    from hasten.data import imagefolder

    write_folder(tmp_path)
    bad = tmp_path / "train" / "dog" / "002.png"
    bad.write_bytes(bad.read_bytes()[:40])  # a truncated PNG
    with pytest.raises(DataError, match=r"dog/002\.png.*cannot decode"):  # its header, read with the sizes
        open_image_folder(tmp_path)
    monkeypatch.setattr(imagefolder, "SIZE_SAMPLE", 1)  # a folder too large for every header to be read
    data = open_image_folder(tmp_path)
    with pytest.raises(DataError, match=r"dog/002\.png.*cannot decode"):
        train, _ = image_folder_loaders(data, 4, 4, workers=workers)  # the normalisation statistics read it
    decoder = BatchDecoder(data.train, data.mode, data.size, data.resize)
    loader = ImageFolderLoader(decoder, 4, mean=torch.zeros(3), std=torch.ones(3), workers=workers)
    with pytest.raises(DataError, match=r"dog/002\.png.*cannot decode") as error:
        list(loader)
    assert "Traceback" not in str(error.value)


@pytest.mark.parametrize("workers", [0, 1])
def test_every_unreadable_file_is_named_in_one_error_not_one_run_at_a_time(tmp_path: Path, workers, monkeypatch):
    from hasten.data import imagefolder

    write_folder(tmp_path, per_class=6)
    bad = [tmp_path / "train" / "dog" / "002.png", tmp_path / "train" / "emu" / "005.png",
           tmp_path / "val" / "cat" / "001.png"]  # fmt: skip
    bad[0].write_bytes(bad[0].read_bytes()[:40])  # truncated
    bad[1].write_bytes(b"")  # empty
    bad[2].write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match=r"^3 files cannot be read as images \(move or replace them\): ") as error:
        open_image_folder(tmp_path)  # the headers: the held-out split's and the training sample's
    assert all(str(path) in str(error.value) for path in bad)
    bad[2].unlink()
    monkeypatch.setattr(imagefolder, "SIZE_SAMPLE", 1)  # a folder too large for every header to be read at the start
    monkeypatch.setattr(imagefolder, "DECODE_CHUNK", 4)  # the two bad files in different chunks of the pass
    data = open_image_folder(tmp_path)
    with pytest.raises(DataError, match=r"^2 files cannot be read as images") as error:
        read_into_memory(data, workers=workers)  # the pass that decodes every file
    assert all(str(path) in str(error.value) for path in bad[:2]) and "Traceback" not in str(error.value)
    for i in range(12):  # more than the error shows: the count says how many
        (tmp_path / "train" / "cat" / f"bad{i:02d}.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"^14 files cannot be read as images .*; and 4 more$"):
        read_into_memory(open_image_folder(tmp_path), workers=workers)


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I", "F", "F255"])
def test_images_of_more_than_8_bits_are_scaled_to_8_not_clipped(tmp_path: Path, mode: str) -> None:
    from hasten.data.preprocessing import Preprocessing

    ramp = (numpy.arange(64).reshape(8, 8) * 4).astype(numpy.uint8)  # 0..252
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            path = tmp_path / split / cls / "x.tif"
            if mode == "F":
                Image.fromarray(ramp.astype(numpy.float32) / 255, "F").save(path)  # floats in 0..1
            elif mode == "F255":
                Image.fromarray(ramp.astype(numpy.float32), "F").save(path)  # floats in 0..255
            else:
                wide = ramp.astype(numpy.uint32) * 257  # the 8-bit ramp at 16 bits
                dtype = {"I;16": "<u2", "I;16B": ">u2", "I": "<i4"}[mode]
                Image.fromarray(wide.astype(dtype)).save(path)
                with Image.open(path) as image:
                    assert image.mode == mode  # as Pillow reads the file back
    data = open_image_folder(tmp_path)
    assert data.mode == "L"  # one grey channel, each of these modes
    images = read_into_memory(data).train_images
    assert numpy.array_equal(images[0, 0].numpy(), ramp)  # Pillow's convert had made them 255 (or 0) everywhere
    read = Preprocessing("L", 8, 8, (0.5,), (0.25,)).read(
        tmp_path / "val" / "a" / "x.tif"
    )  # predict's reading: the same pixels
    assert numpy.array_equal(read[0].numpy(), ramp)


def test_corrupt_file_met_during_training_names_it(tmp_path: Path) -> None:
    write_folder(tmp_path)
    data = open_image_folder(tmp_path)
    train, test = image_folder_loaders(data, 4, 4, workers=1)
    bad = tmp_path / "val" / "emu" / "001.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    list(train)
    with pytest.raises(DataError) as error:
        list(test)
    assert str(bad) in str(error.value) and "Traceback" not in str(error.value)


def test_a_folder_of_mixed_sizes_is_resized_to_its_median_shorter_side(tmp_path: Path, capsys) -> None:
    write_folder(tmp_path)  # 6x6 images
    for name, (height, width) in {"zzz.jpg": (9, 7), "zzy.jpg": (40, 40), "zzx.jpg": (60, 50)}.items():
        Image.fromarray(numpy.zeros((height, width, 3), dtype=numpy.uint8)).save(tmp_path / "train" / "emu" / name)
    data = open_image_folder(tmp_path)
    assert data.size == (6, 6) and data.resize  # the median shorter side (the mean would be 9, the largest 50)
    note = "the images come in 4 sizes (6-50 x 6-60 pixels); each is resized to 6x6"
    # the data layer decides; the run says it
    assert any(note in line for line in data.notes) and capsys.readouterr().err == ""
    open_folder(load_recipe(None, ["data.name=imagefolder", f"data.root={tmp_path}"]), tmp_path)
    assert note in " ".join(capsys.readouterr().err.split())  # (wrapped to the terminal's width)
    assert open_image_folder(tmp_path, size=5).notes == ()  # data.size given: nothing decided
    train, _ = image_folder_loaders(data, 16, 4, workers=0)
    (images, _), *_ = list(train)
    assert images.shape == (16, 3, 6, 6)  # every image comes out 6x6, whatever its size on disk
    resized, _ = image_folder_loaders(open_image_folder(tmp_path, size=5), 16, 4, workers=0)  # data.size wins
    (images, _), *_ = list(resized)
    assert images.shape == (16, 3, 5, 5)


def test_a_folder_of_colour_images_with_a_grey_one_first_keeps_its_colour(tmp_path: Path, capsys) -> None:
    write_folder(tmp_path)  # RGB PNGs
    first = tmp_path / "train" / "cat" / "000.png"  # the first training file, now grey
    Image.open(first).convert("L").save(first)
    data = open_image_folder(tmp_path)
    assert data.mode == "RGB" and data.image_shape == (3, 6, 6)  # not every image read as grey for the first's sake
    note = "data.rgb: 1 of 21 images looked at are grey, the rest in colour; all are read as RGB"
    assert any(note in line for line in data.notes)
    open_folder(load_recipe(None, ["data.name=imagefolder", f"data.root={tmp_path}"]), tmp_path)
    assert note in " ".join(capsys.readouterr().err.split())  # said at the run's start
    assert open_image_folder(tmp_path, rgb=False).mode == "L" and open_image_folder(tmp_path, rgb=False).notes == ()
    for path in (tmp_path / "train").rglob("*.png"):  # every image grey: one channel, nothing to say
        Image.open(path).convert("L").save(path)
    for path in (tmp_path / "val").rglob("*.png"):
        Image.open(path).convert("L").save(path)
    grey = open_image_folder(tmp_path)
    assert grey.mode == "L" and grey.image_shape == (1, 6, 6) and grey.notes == ()


def test_an_odd_size_the_sample_missed_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    from hasten.data import imagefolder

    write_folder(tmp_path)
    odd = tmp_path / "train" / "emu" / "zzz.jpg"
    Image.fromarray(numpy.zeros((9, 7, 3), dtype=numpy.uint8)).save(odd)
    monkeypatch.setattr(imagefolder, "SIZE_SAMPLE", 1)  # only the first training image's header is read
    data = open_image_folder(tmp_path)
    assert data.size == (6, 6) and not data.resize
    with pytest.raises(DataError, match=r"zzz\.jpg: 7x9 pixels.*data\.size"):
        image_folder_loaders(data, 16, 4, workers=0)


def test_missing_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no train/ folder.*make-folder"):
        open_image_folder(tmp_path)
    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="no val/ or test/"):
        open_image_folder(tmp_path)
    (tmp_path / "val" / "b").mkdir(parents=True)
    with pytest.raises(DataError, match="class 'b' is not among the training classes"):
        open_image_folder(tmp_path)


def test_make_folder_writes_each_class_and_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "digits-16"
    assert main(["data", "make-folder", "digits", str(out), "--size", "16", "--rgb", "--limit", "40"]) == 0
    assert "40 training and 40 validation" in capsys.readouterr().out
    digits = prepare(load_dataset("digits"), size=16, rgb=True)
    assert sorted(p.name for p in (out / "train").iterdir()) == [folder_name(i, str(i), 10) for i in range(10)]
    for split, images, labels in (("train", digits.train_images, digits.train_labels), ("val", None, None)):
        files = sorted((out / split).glob("*/*.png"))
        assert len(files) == 40
        if images is None:
            continue
        for path in files[:5]:
            index = int(path.stem)
            with Image.open(path) as image:
                assert image.size == (16, 16) and image.mode == "RGB"
                assert numpy.array_equal(numpy.asarray(image).transpose(2, 0, 1), images[index].numpy())
            assert path.parent.name == folder_name(int(labels[index]), str(int(labels[index])), 10)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the staging folder is gone
    assert main(["data", "make-folder", "digits", str(out)]) == 2  # never written over
    assert "already exist" in capsys.readouterr().err
    assert main(["data", "info", "digits", "--size", "8"]) == 2


def test_training_reads_the_folder_end_to_end(tmp_path: Path, tiny_overrides: list[str]) -> None:
    out = tmp_path / "folder"
    assert main(["data", "make-folder", "synthetic", str(out), "--size", "12", "--rgb", "--limit", "96"]) == 0
    overrides = [o for o in tiny_overrides if not o.startswith(("data.", "model.width"))]
    summary = hasten.train(
        "seed-cnn-32", [*overrides, f"data.root={out}", "data.size=12", "data.workers=1", "train.epochs=1"]
    )
    assert summary["epochs"] == 1 and summary["dataset"]["test_size"] == 96  # the folder's val/
    assert_counted(summary)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["steps"] == 6  # 96 images, batch 16
    # decoded once into memory (data.in_memory=auto), still a folder: its split and its Pillow resize recorded
    assert saved["dataset"]["test_split"] == "val" and saved["preprocessing"]["resize"] == "pillow"


def test_decoding_in_workers_or_not_leaves_the_global_generator_and_so_the_run_as_it_was(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch
) -> None:
    """A DataLoader draws its workers' seed from the global generator unless given one, and that generator then
    initialises the model: reading a folder into memory in workers (data.workers's default on a machine of two
    cores or more) gave a seed other first weights than reading it in the main process. Neither the read, the
    streamed epochs nor a run's results now depend on the workers."""
    import hasten.data.imagefolder as imagefolder

    monkeypatch.setattr(imagefolder, "DECODE_CHUNK", 4)  # several chunks: the workers' DataLoader is made
    write_folder(tmp_path / "images", per_class=4)
    data = open_image_folder(tmp_path / "images")
    torch.manual_seed(0)
    expected = torch.rand(3)
    for workers in (0, 1):
        torch.manual_seed(0)
        read_into_memory(data, workers)
        train, _ = image_folder_loaders(data, 4, 4, workers=workers)
        for epoch in (0, 1):
            train.set_epoch(epoch)
            list(train)
        assert torch.equal(torch.rand(3), expected), workers
    out = tmp_path / "folder"
    assert main(["data", "make-folder", "synthetic", str(out), "--size", "12", "--rgb", "--limit", "96"]) == 0
    overrides = [o for o in tiny_overrides if not o.startswith(("data.", "model.width", "run.dir"))]
    curves = []
    for workers in (0, 1):
        run = tmp_path / f"run-{workers}"
        common = [f"data.root={out}", "data.size=12", f"data.workers={workers}", "train.epochs=2", f"run.dir={run}"]
        hasten.train("seed-cnn-32", [*overrides, *common])
        curves.append([line.split(",")[2:7] for line in (run / "metrics.csv").read_text().splitlines()[1:]])
    assert len(curves[0]) == 2 and curves[0] == curves[1]  # LR, training and test loss and accuracy, epoch by epoch


def test_images_in_folders_inside_class_folders_are_a_warning_naming_them(tmp_path: Path, capsys) -> None:
    write_folder(tmp_path)
    open_image_folder(tmp_path)
    assert "inside class folders" not in capsys.readouterr().err
    for inner in ("train/dog/2019", "train/dog/2019/june", "val/emu/extra"):
        (tmp_path / inner).mkdir()
        Image.fromarray(numpy.zeros((6, 6, 3), dtype=numpy.uint8)).save(tmp_path / inner / "a.png")
    (tmp_path / "train" / "cat" / "empty-subfolder").mkdir()  # no images in it: nothing to say
    data = open_image_folder(tmp_path)
    assert len(data.train.paths) == 15 and len(data.test.paths) == 6  # read as before: the files directly inside
    said = " ".join(capsys.readouterr().err.split())
    assert (
        f"warning: data.root={tmp_path}: 2 folder(s) inside class folders hold 3 image(s) that are not read: "
        "train/dog/2019 (2), val/emu/extra (1); the images of a class are the files directly inside its folder"
    ) in said


def test_a_photo_is_read_as_its_exif_orientation_shows_it(tmp_path: Path) -> None:
    from hasten.data.imagefolder import _header, decode
    from hasten.data.items import item_pixels
    from hasten.data.preprocessing import Preprocessing

    stored = numpy.zeros((4, 8), dtype=numpy.uint8)  # stored landscape, 8 wide and 4 high: a bright left column
    stored[:, :2] = 255
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6  # a phone's portrait photo: turn it a quarter clockwise to show it
    image.save(tmp_path / "portrait.png", exif=exif)
    shown = numpy.rot90(stored, k=-1)  # 4 wide and 8 high: the bright column now along the top
    assert _header(str(tmp_path / "portrait.png"))[0] == (4, 8)  # (width, height) as shown
    assert numpy.array_equal(decode(str(tmp_path / "portrait.png"), "L", (4, 8), False)[0], shown)
    read = Preprocessing("L", 8, 4, (0.5,), (0.25,)).read(tmp_path / "portrait.png")  # predict's reading
    assert numpy.array_equal(read[0].numpy(), shown)
    assert numpy.array_equal(item_pixels(tmp_path / "portrait.png", "item")[0].numpy(), shown)  # a Dataset's path
    image.save(tmp_path / "plain.png")  # no orientation: as stored
    assert numpy.array_equal(decode(str(tmp_path / "plain.png"), "L", (8, 4), False)[0], stored)
