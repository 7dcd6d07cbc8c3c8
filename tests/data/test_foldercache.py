"""The decode cache of image folders: batches read from it are bitwise those decoded from the files, a second open
decodes nothing, a changed, added or removed file is decoded again, a failed or killed write leaves no cache, a
disk without room streams as before, and a run records whether it read the cache."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy
import pytest
import torch
import yaml
from PIL import Image

import hasten
from hasten.data import foldercache, imagefolder
from hasten.data.imagefolder import ImageFolder, image_folder_loaders, open_image_folder, read_into_memory
from hasten.data.loader import Augment
from hasten.errors import DataError
from hasten.recipe.schema import load_recipe
from hasten.run import loading

CLASSES = ("ant", "bee", "cow")


def write_mixed_folder(root: Path, per_class: int = 7, val_per_class: int = 3, seed: int = 0) -> None:
    """Random colour and grey images of mixed sizes (9-23 pixels a side), as PNG and JPEG (quality 90)."""
    rng = numpy.random.default_rng(seed)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for cls in CLASSES:
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                write_image(root / split / cls / f"{i:02d}.{'png' if i % 2 else 'jpg'}", rng, grey=i % 3 == 0)


def write_image(path: Path, rng: numpy.random.Generator, grey: bool = False) -> None:
    height, width = (int(side) for side in rng.integers(9, 24, size=2))
    pixels = rng.integers(0, 256, (height, width) if grey else (height, width, 3), dtype=numpy.uint8)
    Image.fromarray(pixels).save(path, quality=90)


def cached(data: ImageFolder, workers: int = 0) -> ImageFolder:
    return foldercache.fill_cache(data, foldercache.plan_cache(data), workers)


def batches(data: ImageFolder, epochs: int = 3, workers: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of `epochs` training epochs (flipped and translated) and of the test split, in order."""
    train, test = image_folder_loaders(data, 5, 4, seed=7, augment=Augment(flip=True, translate=2), workers=workers)
    seen = []
    for epoch in range(epochs):
        train.set_epoch(epoch)
        seen += list(train)
    return seen + list(test)


def assert_same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def cache_files() -> list[Path]:
    folder = foldercache.cache_dir()
    return sorted(folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("workers", [0, 1])
def test_cached_batches_are_bitwise_the_decoded_ones(tmp_path: Path, workers: int) -> None:
    write_mixed_folder(tmp_path)
    for size, rgb in ((12, True), (10, False)):
        data = open_image_folder(tmp_path, size=size, rgb=rgb)
        from_cache = cached(data, workers)
        assert from_cache.train.cached is not None and from_cache.test.cached is not None
        assert_same(batches(from_cache, workers=workers), batches(data, workers=workers))
        memory, memory_cached = read_into_memory(data), read_into_memory(from_cache)
        assert torch.equal(memory.train_images, memory_cached.train_images)
        assert torch.equal(memory.test_images, memory_cached.test_images)
    assert len(cache_files()) == 4  # two splits at each of two decode settings


def test_a_second_open_decodes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mixed_folder(tmp_path)
    data = open_image_folder(tmp_path, size=12)
    first = batches(cached(data))
    plans = foldercache.plan_cache(open_image_folder(tmp_path, size=12))
    assert all(plan.found is not None for plan in plans)

    def refuse(path: str, mode: str, size: tuple[int, int], resize: bool, fit: str = "squash") -> numpy.ndarray:
        raise AssertionError(f"{path} decoded again")

    monkeypatch.setattr(imagefolder, "decode", refuse)
    again = foldercache.fill_cache(open_image_folder(tmp_path, size=12), plans)
    assert_same(batches(again), first)


@pytest.mark.parametrize("change", ["touched", "rewritten", "removed", "added"])
def test_a_changed_file_is_decoded_again(tmp_path: Path, change: str) -> None:
    write_mixed_folder(tmp_path)
    batches(cached(open_image_folder(tmp_path, size=12)))
    before = cache_files()
    target = tmp_path / "train" / "bee" / "03.png"
    if change == "touched":  # the same bytes, a new modification time
        stat = target.stat()
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    elif change == "rewritten":  # other pixels, the same name
        write_image(target, numpy.random.default_rng(99))
    elif change == "removed":
        target.unlink()
    else:
        write_image(tmp_path / "val" / "cow" / "99.png", numpy.random.default_rng(5))
    data = open_image_folder(tmp_path, size=12)
    plans = foldercache.plan_cache(data)
    split = "test" if change == "added" else "train"
    assert [plan.found is None for plan in plans] == [split == "train", split == "test"]
    assert_same(batches(foldercache.fill_cache(data, plans)), batches(data))
    after = cache_files()
    assert len(after) == len(before) == 2 and len(set(after) - set(before)) == 1  # the split's old file replaced


def test_a_failed_or_killed_write_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mixed_folder(tmp_path)
    (tmp_path / "train" / "cow" / "05.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    monkeypatch.setattr(imagefolder, "SIZE_SAMPLE", 1)  # the bad file's header is not read at the open
    data = open_image_folder(tmp_path, size=12)
    with pytest.raises(DataError, match=r"cow/05\.png.*cannot decode"):
        cached(data)
    assert cache_files() == []  # no file under a cache's name, and no temporary file
    write_image(tmp_path / "train" / "cow" / "05.png", numpy.random.default_rng(3))
    data = open_image_folder(tmp_path, size=12)
    plans = foldercache.plan_cache(data)
    # a writer killed mid-write leaves its temporary file; the next complete write of the split removes it
    killed = plans[0].path.with_name(f".{plans[0].path.name}.{2**22 + 1}.tmp")
    killed.parent.mkdir(parents=True, exist_ok=True)
    killed.write_bytes(b"half of a cache")
    assert all(plan.found is None for plan in foldercache.plan_cache(data))  # never read as a cache
    assert_same(batches(foldercache.fill_cache(data, plans)), batches(data))
    assert not killed.exists() and len(cache_files()) == 2


def test_a_file_under_the_cache_name_that_is_not_the_images_is_written_again(tmp_path: Path) -> None:
    write_mixed_folder(tmp_path)
    data = open_image_folder(tmp_path, size=12)
    plans = foldercache.plan_cache(data)
    plans[0].path.parent.mkdir(parents=True)
    numpy.save(plans[0].path, numpy.zeros((3, 3, 12, 12), dtype=numpy.uint8))  # another shape
    plans = foldercache.plan_cache(data)
    assert plans[0].found is None
    assert_same(batches(foldercache.fill_cache(data, plans)), batches(data))


def test_the_map_pickles_as_its_path_not_its_pixels(tmp_path: Path) -> None:
    write_mixed_folder(tmp_path, per_class=40)
    mapped = cached(open_image_folder(tmp_path, size=23)).train.cached
    assert mapped is not None
    sent = pickle.dumps(mapped)  # what a worker started by spawn receives
    assert len(sent) < 1000 < mapped.array.nbytes
    assert numpy.array_equal(pickle.loads(sent).rows([5, 0, 5]), mapped.rows([5, 0, 5]))


def test_without_room_on_the_disk_the_folder_streams_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mixed_folder(tmp_path)
    data = open_image_folder(tmp_path, size=12)
    monkeypatch.setattr(foldercache, "free_bytes", lambda: foldercache.DISK_HEADROOM)
    streamed = loading.with_decode_cache(data, 0)
    assert streamed.train.cached is None and streamed.test.cached is None and cache_files() == []
    said = capsys.readouterr().err
    assert "data.cache: decoding the folder needs" in said and "decoded from the files each epoch" in said


def test_a_run_decodes_once_and_records_its_choice(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "folder"
    write_mixed_folder(folder, per_class=12, val_per_class=4)
    overrides = [o for o in tiny_overrides if not o.startswith(("data.", "model.width"))]
    overrides += [f"data.root={folder}", "data.size=12", "train.epochs=2"]

    def recorded(run: str) -> dict:
        return yaml.safe_load((tmp_path / run / "recipe.yaml").read_text())["data"]

    hasten.train("seed-cnn-32", [*overrides, "data.in_memory=false", f"run.dir={tmp_path / 'first'}"])
    said = capsys.readouterr().err
    assert "data.cache: decoding 48 images once into" in said and recorded("first")["cache"] is True
    assert recorded("first")["workers"] == 0  # rows of a map the page cache holds: copied in the main process
    decoded = []
    decode = imagefolder.decode

    def counted(path: str, mode: str, size: tuple[int, int], resize: bool, fit: str = "squash") -> numpy.ndarray:
        decoded.append(path)
        return decode(path, mode, size, resize, fit)

    monkeypatch.setattr(imagefolder, "decode", counted)
    hasten.train("seed-cnn-32", [*overrides, "data.in_memory=false", f"run.dir={tmp_path / 'second'}"])
    assert "data.cache: reading the 48 images decoded earlier" in capsys.readouterr().err and decoded == []
    off = ["data.in_memory=false", "data.cache=false", "data.workers=0", f"run.dir={tmp_path / 'off'}"]
    hasten.train("seed-cnn-32", [*overrides, *off])
    assert "data.cache" not in capsys.readouterr().err and recorded("off")["cache"] is False
    hasten.train("seed-cnn-32", [*overrides, "data.workers=0", f"run.dir={tmp_path / 'memory'}"])  # fits in memory
    assert recorded("memory")["in_memory"] is True and recorded("memory")["cache"] is False
    a, b, c = (yaml.safe_load((tmp_path / run / "summary.json").read_text()) for run in ("first", "second", "off"))
    assert a["test_accuracy"] == b["test_accuracy"] == c["test_accuracy"]  # the same pixels, the same run


def test_a_cache_larger_than_the_page_cache_keeps_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mixed_folder(tmp_path)
    recipe = load_recipe("seed-cnn-32", [f"data.root={tmp_path}", "data.size=12", "data.in_memory=false"])
    data = cached(open_image_folder(tmp_path, size=12))
    assert loading.placed_workers(recipe, data) == 0
    assert loading.placed_workers(recipe, open_image_folder(tmp_path, size=12)) == loading.default_workers()
    monkeypatch.setattr(loading, "available_memory_bytes", lambda: imagefolder.decoded_bytes(data))
    assert loading.placed_workers(recipe, data) == loading.default_workers()
    given = load_recipe("seed-cnn-32", [f"data.root={tmp_path}", "data.workers=3"])
    assert loading.placed_workers(given, data) == 3
