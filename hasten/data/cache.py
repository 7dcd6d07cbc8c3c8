"""hasten's cache folder (datasets, pretrained weights, start-up probe results and arrays decoded once: everything in
it can be made again; a file in it that fails its checks is ignored and rewritten, never trusted), and the atomic
write that it, checkpoints and exports use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def cache_folder(name: str) -> Path:
    """`$HASTEN_CACHE/<name>` when set, else `$XDG_CACHE_HOME/hasten/<name>`, or `~/.cache/hasten/<name>` (XDG
    says to ignore a relative value): hasten's cache of datasets, weights and start-up probe results."""
    own = os.environ.get("HASTEN_CACHE", "")
    if own:
        return Path(own).expanduser() / name
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "hasten" / name


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not every platform can open a directory
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_bytes(path: Path, write: Any, *, durable: bool = True) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, and rename it over `path`. `durable=False`
    leaves out the fsyncs: for a cache file that its reader checks (a crash may leave it torn, never half-renamed
    over a good one)."""
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
        _fsync_dir(path.parent)
