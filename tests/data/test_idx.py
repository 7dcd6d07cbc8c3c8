"""IDX reader: round trips on files written here (gzipped and raw), every kind of damage names the file, and the
cache of gunzipped copies is used only while a copy matches its gzip file."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib
from pathlib import Path

import numpy
import pytest

from hasten.data.cache import cache_folder
from hasten.data.idx import parse_idx, read_idx, read_idx_pair
from hasten.errors import DataError

TYPE_CODES = {numpy.dtype("uint8"): 0x08, numpy.dtype("int32"): 0x0C, numpy.dtype("float32"): 0x0D}


def idx_bytes(array: numpy.ndarray) -> bytes:
    header = bytes([0, 0, TYPE_CODES[array.dtype], array.ndim])
    header += numpy.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: numpy.ndarray, gz: bool = True) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def images() -> numpy.ndarray:
    return numpy.random.default_rng(0).integers(0, 256, size=(7, 5, 4), dtype=numpy.uint8)


@pytest.mark.parametrize("gz", [True, False])
def test_round_trip_uint8(tmp_path: Path, images: numpy.ndarray, gz: bool) -> None:
    # the name says nothing about compression: gzip is recognised by its magic bytes
    path = write_idx(tmp_path / "images-idx3-ubyte", images, gz=gz)
    read = read_idx(path)
    assert read.dtype == numpy.uint8 and read.shape == (7, 5, 4)
    numpy.testing.assert_array_equal(read, images)
    assert read.flags.writeable


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_multibyte_types_are_big_endian_on_disk_native_in_memory(tmp_path: Path, dtype: str) -> None:
    values = (numpy.arange(12).reshape(3, 4) * 1000 - 5000).astype(dtype)
    read = read_idx(write_idx(tmp_path / "values.idx", values))
    assert read.dtype == numpy.dtype(dtype) and read.dtype.isnative
    numpy.testing.assert_array_equal(read, values)


def test_pair_shapes_and_dtypes(tmp_path: Path, images: numpy.ndarray) -> None:
    labels = numpy.arange(7, dtype=numpy.uint8) % 3
    x, y = read_idx_pair(write_idx(tmp_path / "i.gz", images), write_idx(tmp_path / "l.gz", labels))
    assert x.shape == (7, 1, 5, 4) and x.dtype == numpy.uint8
    assert y.shape == (7,) and y.dtype == numpy.int64
    numpy.testing.assert_array_equal(x[:, 0], images)
    numpy.testing.assert_array_equal(y, labels)


def test_bad_magic(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "bad-magic-idx3-ubyte"
    path.write_bytes(b"\x01\x02\x08\x03" + idx_bytes(images)[4:])
    with pytest.raises(DataError, match="not an IDX file") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_unknown_type_code(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "type.idx"
    path.write_bytes(b"\x00\x00\x07\x03" + idx_bytes(images)[4:])
    with pytest.raises(DataError, match="not an IDX file") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_truncated_payload(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "short.gz"
    path.write_bytes(gzip.compress(idx_bytes(images)[:-10]))
    with pytest.raises(DataError) as error:
        read_idx(path)
    message = str(error.value)
    assert str(path) in message
    assert "truncated: expected 140 bytes of data" in message and "found 130" in message


def test_truncated_header(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "header"
    path.write_bytes(idx_bytes(images)[:9])
    with pytest.raises(DataError, match="truncated") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_trailing_bytes(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "long"
    path.write_bytes(idx_bytes(images) + b"junk")
    with pytest.raises(DataError, match="4 unexpected bytes after the data") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_count_mismatch_names_both_files(tmp_path: Path, images: numpy.ndarray) -> None:
    images_path = write_idx(tmp_path / "train-images.gz", images)
    labels_path = write_idx(tmp_path / "train-labels.gz", numpy.zeros(6, dtype=numpy.uint8))
    with pytest.raises(DataError) as error:
        read_idx_pair(images_path, labels_path)
    message = str(error.value)
    assert str(images_path) in message and str(labels_path) in message
    assert "7 images" in message and "6 labels" in message


def test_wrong_ndim(tmp_path: Path, images: numpy.ndarray) -> None:
    images_path = write_idx(tmp_path / "i.gz", images)
    labels_2d = write_idx(tmp_path / "l.gz", numpy.zeros((7, 2), dtype=numpy.uint8))
    with pytest.raises(DataError, match="labels of shape") as error:
        read_idx_pair(images_path, labels_2d)
    assert str(labels_2d) in str(error.value)
    flat = write_idx(tmp_path / "flat.gz", numpy.zeros(7, dtype=numpy.uint8))
    with pytest.raises(DataError, match=r"\[N, H, W\]") as error:
        read_idx_pair(flat, flat)
    assert str(flat) in str(error.value)


def test_corrupt_gzip_crc(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "crc.gz"
    data = bytearray(gzip.compress(idx_bytes(images)))
    data[-8] ^= 0xFF  # the stored CRC32 of the payload
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt gzip") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_cut_gzip_stream(tmp_path: Path, images: numpy.ndarray) -> None:
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(idx_bytes(images))[:-20])
    with pytest.raises(DataError, match="corrupt gzip") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_garbled_deflate_data(tmp_path: Path) -> None:
    path = tmp_path / "garbled.gz"
    # a valid gzip header followed by bytes that are not a deflate stream
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 64)
    with pytest.raises(DataError, match="corrupt gzip") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.gz"
    with pytest.raises(DataError, match="cannot read") as error:
        read_idx(path)
    assert str(path) in str(error.value)


def decoded_copies() -> list[Path]:
    folder = cache_folder("decoded")
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_gunzipped_once_then_read_from_the_cache(tmp_path: Path, images: numpy.ndarray, monkeypatch) -> None:
    path = write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    numpy.testing.assert_array_equal(read_idx(path), images)
    (copy,) = decoded_copies()
    assert copy.name.endswith("-train-images-idx3-ubyte") and copy.read_bytes() == idx_bytes(images)

    def no_gunzip(reader: object, path: Path) -> bytes:
        raise AssertionError("gunzipped again although the cache holds a matching copy")

    monkeypatch.setattr("hasten.data.idx._gunzip", no_gunzip)
    read = read_idx(path)
    numpy.testing.assert_array_equal(read, images)
    assert read.flags.writeable


def test_a_damaged_copy_is_ignored_and_written_again(tmp_path: Path, images: numpy.ndarray) -> None:
    path = write_idx(tmp_path / "images.gz", images)
    read_idx(path)
    (copy,) = decoded_copies()
    damaged = bytearray(copy.read_bytes())
    damaged[-1] ^= 0xFF  # same length: only the CRC-32 of the gzip trailer tells
    copy.write_bytes(bytes(damaged))
    numpy.testing.assert_array_equal(read_idx(path), images)
    assert copy.read_bytes() == idx_bytes(images)
    copy.write_bytes(b"")  # and one of another length
    numpy.testing.assert_array_equal(read_idx(path), images)
    assert copy.read_bytes() == idx_bytes(images)


def test_a_rewritten_file_is_read_again_not_from_its_old_copy(tmp_path: Path, images: numpy.ndarray) -> None:
    path = write_idx(tmp_path / "images.gz", images)
    read_idx(path)
    changed = (255 - images).astype(numpy.uint8)
    write_idx(path, changed)
    os.utime(path, ns=(1, 1))  # another modification time, whatever the file system's resolution
    numpy.testing.assert_array_equal(read_idx(path), changed)


def test_a_damaged_trailer_is_an_error_even_with_a_copy_cached(tmp_path: Path, images: numpy.ndarray) -> None:
    path = write_idx(tmp_path / "crc.gz", images)
    read_idx(path)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the stored CRC-32; same size, and the old modification time put back
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(path)


def test_several_gzip_members_are_read_whole_and_not_cached(tmp_path: Path, images: numpy.ndarray) -> None:
    data = idx_bytes(images)
    path = tmp_path / "members.gz"
    path.write_bytes(gzip.compress(data[:50]) + gzip.compress(data[50:]))  # the trailer covers only the last member
    for _ in range(2):
        numpy.testing.assert_array_equal(read_idx(path), images)
    assert decoded_copies() == []


def test_a_cache_that_cannot_be_written_is_left_out(tmp_path: Path, images: numpy.ndarray, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HASTEN_CACHE", str(blocker))
    path = write_idx(tmp_path / "images.gz", images)
    for _ in range(2):
        numpy.testing.assert_array_equal(read_idx(path), images)


def test_dimensions_whose_product_overflows_64_bits_are_a_truncation_not_a_traceback(tmp_path):
    header = bytes([0, 0, 0x08, 3]) + (2**31).to_bytes(4, "big") * 2 + (4).to_bytes(4, "big")  # 2**64 bytes
    with pytest.raises(DataError, match="truncated: expected 18446744073709551616 bytes"):
        parse_idx(header + b"\0" * 16, tmp_path / "x-idx3-ubyte")


def gzip_of(header: bytes, zeros: int) -> bytes:
    """A gzip file of `header` and then `zeros` zero bytes, compressed a MiB at a time (never held whole)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    parts = [packer.compress(header)]
    for start in range(0, zeros, 1 << 20):
        parts.append(packer.compress(bytes(min(1 << 20, zeros - start))))
    return b"".join(parts) + packer.flush()


def test_gunzipping_stops_at_the_size_the_header_gives(tmp_path: Path) -> None:
    # a header of 7x5x4 bytes, then 256 MiB of zeros in 256 KB of gzip: refused after 140 bytes of data, and never
    # held (gzip.decompress took 256 MiB first)
    path = tmp_path / "bomb-idx3-ubyte.gz"
    header = bytes([0, 0, 0x08, 3]) + numpy.asarray([7, 5, 4], dtype=">u4").tobytes()
    path.write_bytes(gzip_of(header, 256 << 20))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"more than the 140 bytes its IDX header gives for shape \(7, 5, 4\)"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert decoded_copies() == []


@pytest.mark.parametrize("gz", [True, False])
def test_a_header_beyond_the_bound_is_refused_before_reading(tmp_path: Path, gz: bool) -> None:
    header = bytes([0, 0, 0x08, 3]) + numpy.asarray([60000, 28, 28 * 1000], dtype=">u4").tobytes()  # 47 GB
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(gzip_of(header, 4 << 20) if gz else header + bytes(4 << 20))
    with pytest.raises(DataError, match=r"gives shape \(60000, 28, 28000\), 47,040,000,016 bytes, more than the "
                       "1,073,741,824") as error:  # fmt: skip
        read_idx(path)
    assert str(path) in str(error.value)


def test_a_header_that_claims_more_than_the_gzip_holds_takes_what_it_holds(tmp_path: Path) -> None:
    # 512 MiB claimed (within the bound), 1 MiB there: a truncation, named as for an uncompressed file
    header = bytes([0, 0, 0x08, 3]) + numpy.asarray([1 << 19, 32, 32], dtype=">u4").tobytes()
    path = tmp_path / "short-idx3-ubyte.gz"
    path.write_bytes(gzip_of(header, 1 << 20))
    with pytest.raises(DataError, match="truncated: expected 536870912 bytes of data") as error:
        read_idx(path)
    assert str(path) in str(error.value)
