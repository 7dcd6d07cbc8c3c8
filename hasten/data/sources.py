"""Where each dataset's files come from, and how a dataset name resolves to a folder that holds them.

Resolution follows DESIGN.md ("Data"): an explicit root; `$HASTEN_DATA/<name>` and `$HASTEN_DATA`; the
cache `$HASTEN_CACHE/<name>` or `$XDG_CACHE_HOME/hasten/<name>` (default `~/.cache/hasten/<name>`); system
copies such as Debian's `/usr/share/datasets/<name>`; then a download into the cache, checked against pinned
SHA-256 values. A folder counts only when it holds every file of the dataset under its official name (or that
name without `.gz`, as the readers detect gzip by content; for CIFAR, the extracted batch folder also counts).

Downloads are checked against the official files' SHA-256 (`registry.PINNED_SHA256` says where each comes from).
Setting `$HASTEN_MIRROR` (or passing `mirror=`) downloads every file from `<mirror>/<official file name>`
instead of the official addresses: for a local mirror, an offline site, or tests.
"""

from __future__ import annotations

import gzip
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hasten.data.cache import cache_folder
from hasten.data.download import download
from hasten.data.idx import GZIP_MAGIC
from hasten.data.registry import DATASETS, SPECS, DatasetSpec, FileSpec, get_spec
from hasten.errors import DataError
from hasten.files import sha256_file, sha256_stream

# the registry's names are re-exported: callers find datasets and their specs in one place
__all__ = [
    "DATASETS",
    "SPECS",
    "DatasetSpec",
    "FileSpec",
    "cache_folder",
    "check_file",
    "download_into",
    "fetch",
    "file_urls",
    "get_spec",
    "how_to_get",
    "info",
    "resolve",
]


def file_urls(file: FileSpec, mirror: str | None = None) -> tuple[str, ...]:
    """Where to download `file`: `<mirror>/<filename>` when a mirror is given or $HASTEN_MIRROR is set."""
    mirror = mirror or os.environ.get("HASTEN_MIRROR")
    return (f"{mirror.rstrip('/')}/{file.filename}",) if mirror else file.urls


def _describe(folder: Path, missing: list[str]) -> str:
    return f"{folder}: " + ("no such folder" if not folder.is_dir() else f"missing {', '.join(missing)}")


def how_to_get(spec: DatasetSpec, mirror: str | None = None) -> str:
    """Every way to get `spec`'s files, for error messages."""
    names = ", ".join(f.filename for f in spec.files.values())
    if spec.cifar_layout is not None:
        names += f" (or the extracted {spec.cifar_layout.folder}/)"
    # the folder part of each file's first address, once: the file names are listed below
    urls = " ".join(dict.fromkeys(file_urls(f, mirror)[0].rsplit("/", 1)[0] + "/" for f in spec.files.values()))
    lines = [
        f"How to get {spec.name}:",
        f"  - run `hasten data fetch {spec.name}`: downloads into {cache_folder(spec.name)} from {urls}",
        f"  - or put {names} in a folder and pass data.root=FOLDER, or set HASTEN_DATA=FOLDER",
    ]
    if spec.install_hint:
        lines.append(f"  - or {spec.install_hint}")
    return "\n".join(lines)


def download_into(spec: DatasetSpec, folder: Path, *, mirror: str | None = None, progress: bool = False) -> Path:
    """Download every file of `spec` that `folder` lacks (or holds with the wrong hash); returns `folder`."""
    unpinned = [f.filename for f in spec.files.values() if not f.sha256]
    if unpinned:
        raise DataError(f"no pinned SHA-256 for {', '.join(unpinned)}; put the file(s) in {folder} by hand")
    for file in spec.files.values():
        dest = folder / file.filename
        if dest.is_file() and sha256_file(dest) == file.sha256:
            continue
        failures = []
        for url in file_urls(file, mirror):
            try:
                download(url, dest, file.sha256, progress=progress)
                break
            except DataError as exc:
                failures.append(str(exc))
        else:
            raise DataError(f"could not download {file.filename}:\n    " + "\n    ".join(failures))
    return folder


def resolve(
    name: str,
    root: str | Path | None = None,
    download: bool = True,
    *,
    specs: Mapping[str, DatasetSpec] | None = None,
    mirror: str | None = None,
    progress: bool | None = None,
) -> Path:
    """The folder holding all of dataset `name`'s files, found or downloaded as the module docstring says.

    An explicit `root` is the only place looked at (`root` itself, or `root/<name>`): a user who names a
    folder wants that folder. `specs` replaces the registry (tests), `mirror` the download addresses;
    `progress` shows a download bar (default: when stderr is a terminal).
    """
    spec = get_spec(name, specs)
    if not spec.files:
        raise DataError(f"{name} has no files to fetch ({spec.install_hint})")
    if root is not None:
        root = Path(root).expanduser()
        if not root.exists():
            raise DataError(f"data.root={root}: no such folder (data.name={name} reads its files from there)\n"
                            + how_to_get(spec, mirror))  # fmt: skip
        if (root / "train").is_dir() and any(p.is_dir() for p in (root / "train").iterdir()):
            raise DataError(
                f"data.root={root} holds an image folder (train/<class>/...), not {name}'s files: add "
                "data.name=imagefolder to train on it"
            )
        tried = []
        for folder in (root, root / name):
            missing = spec.missing_in(folder)
            if not missing:
                return folder
            tried.append(_describe(folder, missing))
        raise DataError(f"data.root does not hold {name}:\n  " + "\n  ".join(tried) + "\n" + how_to_get(spec, mirror))

    places: list[Path] = []
    tried = []
    hasten_data = os.environ.get("HASTEN_DATA")
    if hasten_data:
        places += [Path(hasten_data).expanduser() / name, Path(hasten_data).expanduser()]
    else:
        tried.append("$HASTEN_DATA: not set")
    cache = cache_folder(name)
    places += [cache, *(Path(s) for s in spec.system_folders)]
    for folder in places:
        missing = spec.missing_in(folder)
        if not missing:
            return folder
        tried.append(_describe(folder, missing))
    if download:
        try:
            show = sys.stderr.isatty() if progress is None else progress
            return download_into(spec, cache, mirror=mirror, progress=show)
        except DataError as exc:
            tried.append(f"download into {cache}: {exc}")
    else:
        tried.append("download: not allowed here (download=False)")
    raise DataError(f"dataset {name} not found; tried:\n  " + "\n  ".join(tried) + "\n" + how_to_get(spec, mirror))


def fetch(
    name: str,
    root: str | Path | None = None,
    *,
    specs: Mapping[str, DatasetSpec] | None = None,
    mirror: str | None = None,
    progress: bool = True,
) -> Path:
    """Make dataset `name` available and return its folder; with `root`, download into `root` what it lacks."""
    spec = get_spec(name, specs)
    if root is None or not spec.files:
        return resolve(name, download=True, specs=specs, mirror=mirror, progress=progress)
    root = Path(root).expanduser()
    return root if not spec.missing_in(root) else download_into(spec, root, mirror=mirror, progress=progress)


def _content_sha256(path: Path) -> str:
    """SHA-256 of the file's payload: gunzipped when it is gzip, else the bytes as they are."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    with gzip.open(path, "rb") if gzipped else open(path, "rb") as file:
        return sha256_stream(file)


def check_file(file: FileSpec, path: Path) -> str:
    """'verified', 'verified content' (a recompressed or unpacked copy), 'MISMATCH' or 'not verifiable ...'."""
    if file.sha256 and sha256_file(path) == file.sha256:
        return "verified"
    if not file.content_sha256 and (not file.sha256 or path.name != file.filename):
        return "not verifiable (no pinned hash)" if not file.sha256 else "not verifiable (unpacked copy)"
    try:
        if file.content_sha256 and _content_sha256(path) == file.content_sha256:
            return "verified content"
    except (OSError, EOFError) as exc:
        return f"MISMATCH (unreadable: {exc})"
    return "MISMATCH"


def info(name: str, root: str | Path | None = None, *, specs: Mapping[str, DatasetSpec] | None = None) -> dict:
    """What `hasten data info NAME` shows: where the dataset is, its files and their hash checks, its shape."""
    spec = get_spec(name, specs)
    folder = None
    if spec.files:
        try:
            folder = resolve(name, root, download=False, specs=specs)
        except DataError:
            folder = None
    files = []
    for role, file in spec.files.items():
        path = spec.path_of(folder, file) if folder is not None else None
        files.append(
            {
                "role": role,
                "filename": file.filename,
                "path": str(path) if path else None,
                "size_bytes": path.stat().st_size if path else None,
                "sha256": file.sha256,
                "check": check_file(file, path) if path else ("extracted copy" if folder else "missing"),
            }
        )
    return {
        "name": spec.name,
        "folder": str(folder) if folder else None,
        "files": files,
        "train_size": spec.train_size,
        "test_size": spec.test_size,
        "image_shape": list(spec.image_shape),
        "num_classes": spec.num_classes,
        "classes": list(spec.classes),
        "how_to_get": how_to_get(spec) if spec.files else spec.install_hint,
    }
