"""Files written whole or not at all, and their SHA-256 (hasten/files.py)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from hasten.files import CHUNK_BYTES, fsync_folder, sha256_file, sha256_stream, write_atomic_bytes, write_atomic_text


@pytest.mark.parametrize("durable", [True, False])
def test_an_atomic_write_replaces_the_file_whole_from_beside_it(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old contents, longer than the new ones")
    seen = []

    def write(f) -> None:
        f.write(b"new ")
        seen.append((Path(f.name), path.read_bytes()))  # mid-write: the file at `path` is still the old one
        f.write(b"bytes")

    write_atomic_bytes(path, write, durable=durable)
    assert path.read_bytes() == b"new bytes"  # replaced whole: nothing of the longer old file is left
    [(temporary, meanwhile)] = seen
    assert temporary.parent == tmp_path and temporary != path  # beside it: the rename stays on one filesystem
    assert meanwhile == b"old contents, longer than the new ones"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"good")

    def half_then_fail(f) -> None:
        f.write(b"half of a new fi")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic_bytes(path, half_then_fail, durable=durable)
    assert path.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    with pytest.raises(OSError, match="No space left"):
        write_atomic_bytes(tmp_path / "new.bin", half_then_fail, durable=durable)
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]  # nothing new: neither the file nor a temporary


def test_a_failed_rename_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"good")

    def refused(source: object, target: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PermissionError):
        write_atomic_bytes(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"good" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_atomic_text_is_utf8_with_its_newlines_as_given(tmp_path: Path) -> None:
    path = tmp_path / "note.md"
    write_atomic_text(path, "naïve 東京\nline two\r\n", durable=False)
    assert path.read_bytes() == "naïve 東京\nline two\r\n".encode()


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES, 2 * CHUNK_BYTES + 7])
def test_a_files_sha256_is_hashlibs_of_its_bytes(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_a_streams_sha256_is_of_what_is_left_to_read() -> None:
    data = os.urandom(CHUNK_BYTES + 100)
    stream = io.BytesIO(data)
    stream.read(10)
    assert sha256_stream(stream) == hashlib.sha256(data[10:]).hexdigest()


def test_fsync_of_a_folder_that_cannot_be_opened_is_no_error(tmp_path: Path) -> None:
    fsync_folder(tmp_path / "absent")
    fsync_folder(tmp_path)
