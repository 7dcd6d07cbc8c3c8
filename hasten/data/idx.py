"""Reader for IDX files, the format of MNIST, Fashion-MNIST and KMNIST (LeCun et al., 1998).

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions), one
big-endian uint32 per dimension, then the values in C order. The files are usually gzipped; gzip is
detected by its magic bytes, not by the file name, so a file unpacked by hand reads the same.
The whole payload becomes one array with `numpy.frombuffer`: no per-sample Python.

Gunzipping Fashion-MNIST's training images takes a third of a second, on every run. The gunzipped bytes of a
gzipped file are therefore kept in hasten's cache folder (`decoded/`, named by the file's path, size and
modification time) and read from there while they match the CRC-32 and length that the gzip file's own trailer
records; a copy that does not match is ignored and written again. A file gzipped in several members (whose trailer
covers only the last) is gunzipped every time.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import zlib
from pathlib import Path

import numpy

from hasten.data.cache import cache_folder
from hasten.errors import DataError
from hasten.files import write_atomic_bytes

GZIP_MAGIC = b"\x1f\x8b"

# type code -> big-endian numpy dtype, from the IDX specification
IDX_TYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


GZIP_SMALLEST = 18  # bytes: a 10-byte header and the 8-byte trailer (CRC-32 and length of the payload, little-endian)


def _file_bytes(path: Path) -> bytes | bytearray:
    """The file's contents, gunzipped when it starts with the gzip magic bytes (from the cache of decoded files when
    a copy there matches the gzip trailer). The file is opened once: a cached copy needs only its trailer."""
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            size = stat.st_size
            if f.read(2) != GZIP_MAGIC:
                return _read_all(f, size)
            copy = trailer = None
            if size >= GZIP_SMALLEST:
                f.seek(-8, os.SEEK_END)
                trailer = struct.unpack("<II", f.read(8))  # (CRC-32, length mod 2**32) of the last member's payload
                copy = _decoded_copy(path, stat)
                if (cached := _read_decoded(copy, *trailer)) is not None:
                    return cached
            raw = _read_all(f, size)
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        # gzip.decompress checks the CRC and length of every member
        data = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc}); delete it and fetch it again") from exc
    if copy is not None and (zlib.crc32(data), len(data) & 0xFFFFFFFF) == trailer:  # one member: the trailer is all
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            write_atomic_bytes(copy, lambda stream: stream.write(data), durable=False)  # a torn copy fails its CRC
        except OSError:
            pass  # a cache that cannot be written (a read-only home) is left out, not an error
    return data


def _read_all(f, size: int) -> bytearray:
    """The whole of open file `f` (of `size` bytes) in one writable buffer: no copy after reading."""
    f.seek(0)
    buffer = bytearray(size)
    got = f.readinto(buffer)
    if got != len(buffer):  # the file shrank while it was read
        del buffer[got:]
    return buffer


def _decoded_copy(path: Path, stat: os.stat_result) -> Path:
    """Where the gunzipped copy of `path` lives in the cache: one name per file path, size and modification time."""
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return cache_folder("decoded") / f"{hashlib.sha256(key).hexdigest()[:20]}-{path.name.removesuffix('.gz')}"


def _read_decoded(copy: Path, crc: int, length: int) -> bytearray | None:
    """The cached gunzipped bytes, or None when the copy is missing or does not match the gzip trailer."""
    try:
        with open(copy, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size & 0xFFFFFFFF != length:
                return None
            data = _read_all(f, size)
    except OSError:
        return None
    return data if len(data) == size and zlib.crc32(data) == crc else None


def parse_idx(data: bytes | bytearray, path: Path) -> numpy.ndarray:
    """The array held in the IDX bytes `data` (read from `path`, which error messages name)."""
    if len(data) < 4:
        raise DataError(f"{path}: truncated: {len(data)} bytes, too short for an IDX header")
    zero0, zero1, type_code, ndim = data[:4]
    if zero0 != 0 or zero1 != 0 or type_code not in IDX_TYPES or ndim == 0:
        raise DataError(
            f"{path}: not an IDX file: magic number {data[:4].hex(' ')} "
            f"(expected 00 00 <type {', '.join(f'{t:02x}' for t in IDX_TYPES)}> <number of dimensions>)"
        )
    header_bytes = 4 + 4 * ndim
    if len(data) < header_bytes:
        raise DataError(f"{path}: truncated: header of {ndim} dimensions needs {header_bytes} bytes, found {len(data)}")
    shape = tuple(int(d) for d in numpy.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = numpy.dtype(IDX_TYPES[type_code])
    expected = math.prod(shape) * dtype.itemsize  # Python ints: dimensions of 2**31 each must not wrap to 0
    found = len(data) - header_bytes
    if found < expected:
        raise DataError(f"{path}: truncated: expected {expected} bytes of data for shape {shape}, found {found}")
    if found > expected:
        raise DataError(f"{path}: {found - expected} unexpected bytes after the data of shape {shape}")
    values = numpy.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header_bytes)
    if values.dtype.isnative and values.flags.writeable:  # bytes of one byte each, in a buffer read for this call
        return values.reshape(shape)
    # one copy: native byte order, and writable, so torch.from_numpy can share it without a warning
    return values.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def read_idx(path: Path) -> numpy.ndarray:
    """The array stored in the IDX file at `path`, gzipped or not; any defect raises DataError naming the file."""
    path = Path(path)
    return parse_idx(_file_bytes(path), path)


def read_idx_pair(images_path: Path, labels_path: Path) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Images as uint8 [N, 1, H, W] and labels as int64 [N] from an IDX image file and its label file."""
    images_path, labels_path = Path(images_path), Path(labels_path)
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.dtype != numpy.uint8:
        raise DataError(f"{images_path}: expected uint8 images of shape [N, H, W], found {images.dtype} {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{labels_path}: expected labels of shape [N], found shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels; "
            "the two files do not belong together"
        )
    return images[:, None, :, :], labels.astype(numpy.int64)
