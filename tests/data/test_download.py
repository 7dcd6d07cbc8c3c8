"""Checked, atomic downloads from a local HTTP server, and the order in which a dataset's folder is resolved."""

from __future__ import annotations

import gzip
import hashlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy
import pytest

from hasten.data.download import download
from hasten.data.idx import read_idx_pair
from hasten.data.sources import DatasetSpec, FileSpec, fetch, info, resolve
from hasten.errors import DataError
from hasten.files import sha256_file


class FileHandler(BaseHTTPRequestHandler):
    """Serves `server.files` by name; for names in `server.cut`, announces the full size, sends half, hangs up."""

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        body = self.server.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if name in self.server.cut:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadingHTTPServer]:
    for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.delenv("HASTEN_MIRROR", raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FileHandler)
    httpd.files, httpd.cut = {}, set()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def base_url(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in tmp_path, no $HASTEN_DATA, $XDG_CACHE_HOME or $HASTEN_CACHE: nothing outside tmp_path is looked at."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HASTEN_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HASTEN_MIRROR", raising=False)
    monkeypatch.delenv("HASTEN_CACHE", raising=False)  # (the test session sets one)
    return tmp_path


def test_good_file_lands(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    body = bytes(range(256)) * 5000
    server.files["data.bin"] = body
    dest = tmp_path / "dl" / "data.bin"
    assert download(f"{base_url(server)}/data.bin", dest, sha256(body)) == dest
    assert dest.read_bytes() == body
    assert sha256_file(dest) == sha256(body)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data.bin"]


def test_hash_mismatch_leaves_good_file(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    good, evil = b"good bytes" * 100, b"tampered bytes" * 100
    dest = tmp_path / "data.bin"
    dest.write_bytes(good)
    server.files["data.bin"] = evil
    url = f"{base_url(server)}/data.bin"
    with pytest.raises(DataError) as error:
        download(url, dest, sha256(good))
    message = str(error.value)
    assert url in message and sha256(good) in message and sha256(evil) in message
    assert dest.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_connection_cut_leaves_nothing(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    body = b"x" * 300_000
    server.files["big.bin"] = body
    server.cut.add("big.bin")
    folder = tmp_path / "dl"
    url = f"{base_url(server)}/big.bin"
    with pytest.raises(DataError) as error:
        download(url, folder / "big.bin", sha256(body))
    assert url in str(error.value)
    assert list(folder.iterdir()) == []


def test_http_error_names_url(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    url = f"{base_url(server)}/absent.bin"
    with pytest.raises(DataError, match="404") as error:
        download(url, tmp_path / "absent.bin", "0" * 64)
    assert url in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_refuses_without_pinned_hash(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no valid pinned SHA-256"):
        download("http://127.0.0.1:9/x", tmp_path / "x", None)
    assert list(tmp_path.iterdir()) == []


def tiny_idx_files() -> dict[str, bytes]:
    """A whole fake IDX dataset: 12 train and 4 test images of 3x3, gzipped."""
    rng = numpy.random.default_rng(0)

    def idx(array: numpy.ndarray) -> bytes:
        header = bytes([0, 0, 0x08, array.ndim]) + numpy.asarray(array.shape, dtype=">u4").tobytes()
        return gzip.compress(header + array.tobytes())

    return {
        "train-images-idx3-ubyte.gz": idx(rng.integers(0, 256, (12, 3, 3), dtype=numpy.uint8)),
        "train-labels-idx1-ubyte.gz": idx(numpy.arange(12, dtype=numpy.uint8) % 10),
        "t10k-images-idx3-ubyte.gz": idx(rng.integers(0, 256, (4, 3, 3), dtype=numpy.uint8)),
        "t10k-labels-idx1-ubyte.gz": idx(numpy.arange(4, dtype=numpy.uint8)),
    }


ROLES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def tiny_specs(files: dict[str, bytes], url: str, system: tuple[str, ...] = ()) -> dict[str, DatasetSpec]:
    file_specs = {role: FileSpec(name, sha256(files[name]), (f"{url}/{name}",)) for role, name in ROLES.items()}
    return {"tiny": DatasetSpec("tiny", file_specs, system_folders=system, train_size=12, test_size=4)}


def fill(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (folder / name).write_bytes(body)
    return folder


def test_resolve_downloads_whole_dataset(server: ThreadingHTTPServer, isolated_env: Path) -> None:
    files = tiny_idx_files()
    server.files.update(files)
    specs = tiny_specs(files, base_url(server))
    folder = resolve("tiny", specs=specs, progress=False)
    assert folder == isolated_env / "home" / ".cache" / "hasten" / "tiny"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    images, labels = read_idx_pair(folder / ROLES["train_images"], folder / ROLES["train_labels"])
    assert images.shape == (12, 1, 3, 3) and labels.tolist() == [i % 10 for i in range(12)]
    # found in the cache now: no second download
    server.files.clear()
    assert resolve("tiny", specs=specs, progress=False) == folder
    report = info("tiny", specs=specs)
    assert report["folder"] == str(folder) and {f["check"] for f in report["files"]} == {"verified"}


def test_mirror_replaces_official_addresses(
    server: ThreadingHTTPServer, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tiny_idx_files()
    server.files.update(files)
    specs = tiny_specs(files, "http://127.0.0.1:9/unreachable")  # port 9: discard, nothing listens
    monkeypatch.setenv("HASTEN_MIRROR", base_url(server) + "/")
    folder = resolve("tiny", specs=specs, progress=False)
    assert {p.name for p in folder.iterdir()} == set(files)


def test_fetch_into_root_downloads_there(server: ThreadingHTTPServer, isolated_env: Path) -> None:
    files = tiny_idx_files()
    server.files.update(files)
    root = isolated_env / "mine"
    assert fetch("tiny", root, specs=tiny_specs(files, base_url(server)), progress=False) == root
    assert {p.name for p in root.iterdir()} == set(files)


def test_resolution_order(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = tiny_idx_files()
    system = fill(isolated_env / "usr-share" / "tiny", files)
    specs = tiny_specs(files, "http://127.0.0.1:9", system=(str(system),))
    explicit = fill(isolated_env / "explicit", files)
    data_home = isolated_env / "hasten-data"
    named = fill(data_home / "tiny", files)
    cache = fill(isolated_env / "xdg" / "hasten" / "tiny", files)
    monkeypatch.setenv("HASTEN_DATA", str(data_home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated_env / "xdg"))

    assert resolve("tiny", explicit, download=False, specs=specs) == explicit
    assert resolve("tiny", download=False, specs=specs) == named
    for path in named.iterdir():
        path.unlink()
    fill(data_home, files)  # files straight in $HASTEN_DATA count too
    assert resolve("tiny", download=False, specs=specs) == data_home
    monkeypatch.delenv("HASTEN_DATA")
    assert resolve("tiny", download=False, specs=specs) == cache
    monkeypatch.delenv("XDG_CACHE_HOME")  # back to ~/.cache, where nothing is
    assert resolve("tiny", download=False, specs=specs) == system
    home_cache = fill(isolated_env / "home" / ".cache" / "hasten" / "tiny", files)
    assert resolve("tiny", download=False, specs=specs) == home_cache


def test_incomplete_folder_does_not_count(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = tiny_idx_files()
    partial = dict(list(files.items())[:3])
    data_home = fill(isolated_env / "hasten-data", partial)
    system = fill(isolated_env / "system", files)
    monkeypatch.setenv("HASTEN_DATA", str(data_home))
    specs = tiny_specs(files, "http://127.0.0.1:9", system=(str(system),))
    assert resolve("tiny", download=False, specs=specs) == system


def test_explicit_root_lacking_files_is_an_error(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = tiny_idx_files()
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated_env / "xdg"))
    fill(isolated_env / "xdg" / "hasten" / "tiny", files)  # the cache has it, but the user named a folder
    root = fill(isolated_env / "explicit", {ROLES["train_images"]: files[ROLES["train_images"]]})
    with pytest.raises(DataError) as error:
        resolve("tiny", root, specs=tiny_specs(files, "http://127.0.0.1:9"))
    message = str(error.value)
    assert str(root) in message and ROLES["test_labels"] in message
    assert ROLES["train_images"] not in message.split("\n")[1]  # present there, so not listed as missing


def test_nothing_found_lists_every_place(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = tiny_idx_files()
    monkeypatch.setenv("HASTEN_DATA", str(isolated_env / "hasten-data"))
    system = isolated_env / "system" / "tiny"
    specs = tiny_specs(files, "http://127.0.0.1:9/official", system=(str(system),))
    with pytest.raises(DataError) as error:
        resolve("tiny", download=False, specs=specs)
    message = str(error.value)
    for place in (
        isolated_env / "hasten-data" / "tiny",
        isolated_env / "hasten-data",
        isolated_env / "home" / ".cache" / "hasten" / "tiny",
        system,
    ):
        assert f"{place}:" in message
    assert "hasten data fetch tiny" in message and "http://127.0.0.1:9/official/" in message
    assert "download=False" in message


def test_failed_download_is_reported_with_places(server: ThreadingHTTPServer, isolated_env: Path) -> None:
    files = tiny_idx_files()
    server.files.update(files)
    server.files[ROLES["test_labels"]] = b"not what was pinned"
    specs = tiny_specs(files, base_url(server))
    with pytest.raises(DataError) as error:
        resolve("tiny", specs=specs, progress=False)
    message = str(error.value)
    assert f"{base_url(server)}/{ROLES['test_labels']}" in message and "SHA-256" in message
    assert str(isolated_env / "home" / ".cache" / "hasten" / "tiny") in message
    cache = isolated_env / "home" / ".cache" / "hasten" / "tiny"
    assert not (cache / ROLES["test_labels"]).exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_unpinned_file_is_never_downloaded(server: ThreadingHTTPServer, isolated_env: Path) -> None:
    files = tiny_idx_files()
    server.files.update(files)
    specs = tiny_specs(files, base_url(server))
    spec = specs["tiny"]
    unpinned = dict(spec.files, test_labels=FileSpec(ROLES["test_labels"], None, spec.files["test_labels"].urls))
    specs = {"tiny": DatasetSpec("tiny", unpinned)}
    with pytest.raises(DataError, match=f"no pinned SHA-256 for {ROLES['test_labels']}; put the file"):
        resolve("tiny", specs=specs, progress=False)
    assert not (isolated_env / "home" / ".cache" / "hasten" / "tiny").exists()
