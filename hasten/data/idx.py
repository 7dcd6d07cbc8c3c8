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

Sizes come from the header, and the header is data: a gzip file is gunzipped a chunk at a time into a buffer of
the size its header gives (at most MAX_IDX_BYTES), and one byte more is refused, so a few MB of deflated zeros
behind a header that claims a small array cost that array, not the gigabytes they unpack to. An uncompressed file
is checked against its header's size before it is read.
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


# bytes one IDX file may hold once gunzipped: twice EMNIST ByClass's training images (698k 28x28 images, 547 MB), the
# largest IDX file published; a header claiming more is refused before anything is allocated
MAX_IDX_BYTES = 1 << 30
GUNZIP_CHUNK = 1 << 20  # bytes gunzipped per step into the buffer: the only copy beside it

GZIP_SMALLEST = 18  # bytes: a 10-byte header and the 8-byte trailer (CRC-32 and length of the payload, little-endian)


def _file_bytes(path: Path) -> bytes | bytearray | memoryview:
    """The file's contents, gunzipped when it starts with the gzip magic bytes (from the cache of decoded files when
    a copy there matches the gzip trailer), never more than its IDX header gives. The file is opened once: a cached
    copy needs only its trailer."""
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            size = stat.st_size
            if f.read(2) != GZIP_MAGIC:
                f.seek(0)
                return _read_plain(f, size, path)
            copy = trailer = None
            if size >= GZIP_SMALLEST:
                f.seek(-8, os.SEEK_END)
                trailer = struct.unpack("<II", f.read(8))  # (CRC-32, length mod 2**32) of the last member's payload
                copy = _decoded_copy(path, stat)
                if (cached := _read_decoded(copy, *trailer)) is not None:
                    return cached
            f.seek(0)
            try:
                # GzipFile checks the CRC and length of every member, as it reaches each member's end
                data = _gunzip(gzip.GzipFile(fileobj=f, mode="rb"), path)
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise DataError(f"{path}: corrupt gzip data ({exc}); delete it and fetch it again") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if copy is not None and (zlib.crc32(data), len(data) & 0xFFFFFFFF) == trailer:  # one member: the trailer is all
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            write_atomic_bytes(copy, lambda stream: stream.write(data), durable=False)  # a torn copy fails its CRC
        except OSError:
            pass  # a cache that cannot be written (a read-only home) is left out, not an error
    return data


def _read_header(stream) -> bytes:
    """The IDX header at the start of `stream`: the magic number, then one uint32 per dimension it names (fewer
    bytes where the stream ends first; only the magic number where it is not an IDX one)."""
    head = stream.read(4)
    if len(head) < 4 or head[:2] != b"\0\0" or head[2] not in IDX_TYPES:
        return head
    return head + stream.read(4 * head[3])


def _read_plain(f, size: int, path: Path) -> bytes | bytearray:
    """An uncompressed IDX file, read whole only when its size is the one its header gives (else the header alone,
    or DataError naming the difference): a file that is not an IDX file is not read into memory."""
    head = _read_header(f)
    try:
        shape, dtype, header_bytes = _layout(head, path)
    except DataError:
        return head  # parse_idx names what is wrong with it
    _check_bound(path, shape, header_bytes + math.prod(shape) * dtype.itemsize)
    _check_length(path, shape, math.prod(shape) * dtype.itemsize, size - header_bytes)
    return _read_all(f, size)


def _gunzip(reader: gzip.GzipFile, path: Path) -> bytes | memoryview:
    """The IDX file gunzipped by `reader`, a chunk at a time into a buffer of the size its header gives: shorter
    where the stream ends first (parse_idx says truncated), DataError where it holds more, or where the header gives
    more than MAX_IDX_BYTES. The buffer's pages are taken as they are written, so a header that claims more than the
    file holds costs what it holds."""
    head = _read_header(reader)
    try:
        shape, dtype, header_bytes = _layout(head, path)
    except DataError:
        return head  # parse_idx names what is wrong with it
    total = header_bytes + math.prod(shape) * dtype.itemsize
    _check_bound(path, shape, total)
    buffer = numpy.empty(total, dtype=numpy.uint8)
    buffer[:header_bytes] = numpy.frombuffer(head, dtype=numpy.uint8)
    view = memoryview(buffer)
    got = header_bytes
    while got < total and (n := reader.readinto(view[got : got + GUNZIP_CHUNK])):
        got += n
    if got < total:
        return view[:got]
    if reader.read(1):  # reads the last member's trailer (its CRC is checked) and anything after it
        raise DataError(
            f"{path}: holds more than the {total - header_bytes:,} bytes its IDX header gives for shape {shape} "
            "(gunzipping stopped there); delete it and fetch it again"
        )
    return view


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
            if size & 0xFFFFFFFF != length or size > MAX_IDX_BYTES:  # a copy is never larger than a file may hold
                return None
            data = _read_all(f, size)
    except OSError:
        return None
    return data if len(data) == size and zlib.crc32(data) == crc else None


def _layout(data: bytes | bytearray | memoryview, path: Path) -> tuple[tuple[int, ...], numpy.dtype, int]:
    """(shape, dtype, header bytes) from the IDX header at the start of `data`; DataError naming `path` when it is
    not one or is cut short."""
    if len(data) < 4:
        raise DataError(f"{path}: truncated: {len(data)} bytes, too short for an IDX header")
    zero0, zero1, type_code, ndim = data[:4]
    if zero0 != 0 or zero1 != 0 or type_code not in IDX_TYPES or ndim == 0:
        raise DataError(
            f"{path}: not an IDX file: magic number {bytes(data[:4]).hex(' ')} "
            f"(expected 00 00 <type {', '.join(f'{t:02x}' for t in IDX_TYPES)}> <number of dimensions>)"
        )
    header_bytes = 4 + 4 * ndim
    if len(data) < header_bytes:
        raise DataError(f"{path}: truncated: header of {ndim} dimensions needs {header_bytes} bytes, found {len(data)}")
    shape = tuple(int(d) for d in numpy.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return shape, numpy.dtype(IDX_TYPES[type_code]), header_bytes


def _check_length(path: Path, shape: tuple[int, ...], expected: int, found: int) -> None:
    """DataError naming `path` when it holds `found` bytes of data where its header gives `expected`."""
    if found < expected:
        raise DataError(f"{path}: truncated: expected {expected} bytes of data for shape {shape}, found {found}")
    if found > expected:
        raise DataError(f"{path}: {found - expected} unexpected bytes after the data of shape {shape}")


def _check_bound(path: Path, shape: tuple[int, ...], total: int) -> None:
    """DataError naming `path` when its header gives more than MAX_IDX_BYTES, before anything that size is made."""
    if total > MAX_IDX_BYTES:
        raise DataError(
            f"{path}: its IDX header gives shape {shape}, {total:,} bytes, more than the {MAX_IDX_BYTES:,} an IDX "
            "file may hold here; is it an IDX file?"
        )


def parse_idx(data: bytes | bytearray | memoryview, path: Path) -> numpy.ndarray:
    """The array held in the IDX bytes `data` (read from `path`, which error messages name)."""
    shape, dtype, header_bytes = _layout(data, path)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: dimensions of 2**31 each must not wrap to 0
    _check_length(path, shape, expected, len(data) - header_bytes)
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
