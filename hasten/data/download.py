"""Download of one file, checked against a pinned SHA-256 and written atomically.

The bytes stream into a temporary file beside the destination while they are hashed; the file is
fsynced and renamed onto the destination only when the hash matches (hasten/files.py). Any failure (hash mismatch,
connection cut, short read, timeout) removes the temporary file, so the destination is either the
verified file or whatever good file was there before: never a partial one.

Every download is bounded: at most `max_bytes` (a server that announces more, or never stops sending, is cut
off there) and at most `deadline` seconds in all (a server that trickles a byte at a time cannot hold the run
for ever), besides the per-operation socket timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hasten.errors import DataError
from hasten.files import CHUNK_BYTES, write_atomic_bytes
from hasten.version import __version__

MAX_DOWNLOAD_BYTES = 4 << 30  # no file hasten fetches is near this (CIFAR-100: 169 MB); a larger one is refused
DOWNLOAD_DEADLINE_SECONDS = 3600.0  # one file's whole transfer
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


@contextlib.contextmanager
def _progress_bar(label: str, total: int | None, enabled: bool) -> Iterator:
    """A callable advance(n_bytes): a rich progress bar when `enabled`, else a no-op."""
    if not enabled:
        yield lambda n_bytes: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    # stderr: stdout may be piped into another tool (`hasten data info ... | jq`)
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n_bytes: bar.advance(task, n_bytes)


def download(
    url: str,
    dest: Path,
    sha256: str,
    *,
    timeout: float = 60,
    progress: bool = False,
    max_bytes: int | None = None,
    deadline: float | None = None,
) -> Path:
    """Fetch `url` to `dest` if its SHA-256 is `sha256`; returns `dest`, raises DataError on any failure.

    `timeout` is in seconds per socket operation (connect or read); `deadline` (default
    DOWNLOAD_DEADLINE_SECONDS) for the whole transfer; `max_bytes` (default MAX_DOWNLOAD_BYTES) the most it takes.
    """
    max_bytes = MAX_DOWNLOAD_BYTES if max_bytes is None else max_bytes
    deadline = DOWNLOAD_DEADLINE_SECONDS if deadline is None else deadline
    started = time.monotonic()
    dest = Path(dest)
    expected = (sha256 or "").lower()
    if not _SHA256_PATTERN.fullmatch(expected):
        raise DataError(f"no valid pinned SHA-256 for {url} (got {sha256!r}); refusing to download unverified data")
    began: list[bool] = []  # an OSError before the transfer began is the folder's; after it, the write's or rename's

    def receive(partial: IO[bytes]) -> None:
        began.append(True)
        _receive(url, partial, expected, dest, timeout, progress, max_bytes, deadline, started)

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_bytes(dest, receive)  # renamed onto `dest` only if `receive` returns: the hash matched
    except OSError as exc:
        if not began:
            raise DataError(f"cannot write into {dest.parent} to download {url}: {exc.strerror or exc}") from exc
        raise DataError(f"cannot write the download of {url} onto {dest}: {exc.strerror or exc}") from exc
    return dest


def _receive(
    url: str,
    partial: IO[bytes],
    expected: str,
    dest: Path,
    timeout: float,
    progress: bool,
    max_bytes: int,
    deadline: float,
    started: float,
) -> None:
    """Stream `url` into `partial`, hashing as it goes; a DataError when the transfer fails, passes `max_bytes` or
    `deadline` seconds after `started` (time.monotonic), ends short of what the server announced, or does not hash
    to `expected`."""
    digest = hashlib.sha256()
    received = 0
    request = urllib.request.Request(url, headers={"User-Agent": f"hasten/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=min(timeout, deadline)) as response:
            length_header = response.headers.get("Content-Length")
            announced = int(length_header) if length_header and length_header.isdigit() else None
            if announced is not None and announced > max_bytes:
                raise DataError(
                    f"download of {url} refused: the server announces {announced:,} bytes, more than the "
                    f"{max_bytes:,} a download may take"
                )
            with _progress_bar(dest.name, announced, progress) as advance:
                # read1: what has arrived (one read of the socket), so the deadline is checked as bytes trickle
                while chunk := response.read1(CHUNK_BYTES):
                    digest.update(chunk)
                    partial.write(chunk)
                    received += len(chunk)
                    advance(len(chunk))
                    if received > max_bytes:
                        raise DataError(
                            f"download of {url} stopped at {received:,} bytes: more than the {max_bytes:,} a "
                            "download may take (a server that does not stop sending?)"
                        )
                    if time.monotonic() - started > deadline:
                        raise DataError(
                            f"download of {url} stopped after {deadline:g} s with {received:,} bytes: it took "
                            "longer than a download may (a server that sends too slowly?)"
                        )
    # URLError covers HTTP errors and refused connections; OSError covers resets and timeouts
    except (http.client.HTTPException, urllib.error.URLError, OSError, ValueError) as exc:
        raise DataError(f"download of {url} failed after {received} bytes: {exc}") from exc
    # http.client ends a body cut short without an error: compare with what the server announced
    if announced is not None and received != announced:
        raise DataError(f"download of {url} failed: connection ended after {received} of {announced} bytes")
    got = digest.hexdigest()
    if got != expected:
        raise DataError(
            f"download of {url} does not match its pinned SHA-256: expected {expected}, got {got} "
            f"({received} bytes); {dest} was left as it was"
        )
