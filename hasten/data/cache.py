"""hasten's cache folder (datasets, pretrained weights, start-up probe results and arrays decoded once: everything in
it can be made again; a file in it that fails its checks is ignored and rewritten, never trusted). Its files are
written whole or not at all (hasten/files.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(name: str) -> Path:
    """`$HASTEN_CACHE/<name>` when set, else `$XDG_CACHE_HOME/hasten/<name>`, or `~/.cache/hasten/<name>` (XDG
    says to ignore a relative value): hasten's cache of datasets, weights and start-up probe results."""
    own = os.environ.get("HASTEN_CACHE", "")
    if own:
        return Path(own).expanduser() / name
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "hasten" / name
