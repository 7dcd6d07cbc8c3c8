"""Files written whole or not at all, and their SHA-256: the one way hasten replaces a file and hashes one.

A file is written to a temporary name beside it (same folder, so the rename stays on one filesystem) and renamed
over it: a crash or a full disk mid-write leaves the earlier file as it was, never half of a new one, and the
temporary file is removed on any failure. `durable` adds the fsyncs of the file and its folder, for what must
survive a power cut once written (checkpoints, downloads); a cache that its reader checks can do without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

CHUNK_BYTES = 1 << 20  # read in 1 MiB chunks: memory stays flat for archives and checkpoints of any size


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable; best effort, as some platforms and filesystems refuse to open a folder."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic_bytes(path: Path, write: Callable[[IO[bytes]], Any], *, durable: bool = True) -> None:
    """Call `write(file)` on a temporary file beside `path` (`.NAME.PID.tmp`), fsync it, and rename it over
    `path`. `durable=False` leaves out the fsyncs: for a file whose reader checks it (a crash may leave it torn,
    never half-renamed over a good one). Whatever `write` or the rename raises goes to the caller, the temporary
    file removed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_folder(path.parent)


def write_atomic_text(path: Path, text: str, *, durable: bool = True) -> None:
    """`text` as UTF-8 at `path`, written as `write_atomic_bytes` writes."""
    data = text.encode("utf-8")
    write_atomic_bytes(path, lambda f: f.write(data), durable=durable)


def sha256_stream(stream: IO[bytes]) -> str:
    """Hex SHA-256 of what is left to read in `stream`, read in CHUNK_BYTES chunks."""
    digest = hashlib.sha256()
    while chunk := stream.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


class HashingWriter:
    """A binary file that hashes what is written through it, in the order written: the SHA-256 of a file written
    front to back (torch.save's zip writer writes so), without reading it back. No seek or tell: a writer that
    needs them fails here rather than leaving a digest of bytes out of order."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of the file at `path` (what `sha256sum` prints)."""
    with open(path, "rb") as file:
        return sha256_stream(file)
