"""Reader for IDX files, the format of MNIST, Fashion-MNIST and KMNIST (LeCun et al., 1998).

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions), one
big-endian uint32 per dimension, then the values in C order. The files are usually gzipped; gzip is
detected by its magic bytes, not by the file name, so a file unpacked by hand reads the same.
The whole payload becomes one array with `numpy.frombuffer`: no per-sample Python.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy

from hasten.errors import DataError

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


def _file_bytes(path: Path) -> bytes:
    """The file's contents, gunzipped when it starts with the gzip magic bytes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        # gzip.decompress checks the CRC and length of every member
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc}); delete it and fetch it again") from exc


def parse_idx(data: bytes, path: Path) -> numpy.ndarray:
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
    expected = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
    found = len(data) - header_bytes
    if found < expected:
        raise DataError(f"{path}: truncated: expected {expected} bytes of data for shape {shape}, found {found}")
    if found > expected:
        raise DataError(f"{path}: {found - expected} unexpected bytes after the data of shape {shape}")
    values = numpy.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header_bytes)
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
