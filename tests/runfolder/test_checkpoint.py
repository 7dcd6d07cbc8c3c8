"""Checkpoint files: atomic, digest-checked, safe to load, exported to safetensors exactly."""

from __future__ import annotations

import pickle
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hasten.errors import CheckpointError
from hasten.files import sha256_file
from hasten.models.pretrained import save_weights
from hasten.runfolder import checkpoint
from hasten.runfolder.checkpoint import (
    checkpoints_in,
    latest_usable,
    load_checkpoint,
    prune,
    read_weights,
    remove_stale_temporaries,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def state(step: int) -> dict:
    return {"model": {"w": torch.full((3, 2), float(step)), "b": torch.arange(2.0)}, "step": step, "recipe": {"a": [1]}}


def test_round_trip_and_digest_sidecar(tmp_path):
    path = save_checkpoint(state(3), tmp_path / "step-3.pt")
    assert (tmp_path / "step-3.pt.sha256").read_text().strip()
    loaded = load_checkpoint(path, require_digest=True)
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.full((3, 2), 3.0))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_missing_truncated_and_flipped_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")
    path = save_checkpoint(state(1), tmp_path / "step-1.pt")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="step-1.pt is corrupt"):
        load_checkpoint(path)
    truncated = tmp_path / "plain.pt"
    torch.save(state(2), truncated)
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="plain.pt is unreadable"):
        load_checkpoint(truncated)


def test_missing_sidecar_means_incomplete_when_resuming(tmp_path):
    path = tmp_path / "step-5.pt"
    torch.save(state(5), path)
    assert load_checkpoint(path)["step"] == 5  # a plain file from elsewhere loads
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(path, require_digest=True)


class Payload:
    """A pickle whose loading would create a marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "x": Payload(str(marker))}, path)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="refusing to load .*evil.pt"):
        load_checkpoint(path)
    assert not marker.exists()
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(Payload(str(marker))))
    with pytest.raises(CheckpointError):
        load_checkpoint(raw)
    assert not marker.exists()


def test_latest_usable_skips_broken_ones_with_a_note(tmp_path, capsys):
    for step in (1, 2, 3):
        save_checkpoint(state(step), tmp_path / f"step-{step}.pt")
    (tmp_path / "step-3.pt.sha256").unlink()  # as if killed between the file and its sidecar
    path, loaded = latest_usable(tmp_path)
    assert "warning: skipping" in (err := capsys.readouterr().err) and "step-3.pt" in err
    assert "UserWarning" not in err
    assert path.name == "step-2.pt" and loaded["step"] == 2
    assert latest_usable(tmp_path / "empty") is None


def test_prune_keeps_the_newest_and_protected(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(state(step), tmp_path / f"step-{step}.pt")
    prune(tmp_path, keep=2, protect=(tmp_path / "step-1.pt",))
    assert [p.name for p in checkpoints_in(tmp_path)] == ["step-4.pt", "step-3.pt", "step-1.pt"]
    assert not (tmp_path / "step-2.pt.sha256").exists()


def test_the_digest_hashed_while_writing_is_the_files(tmp_path):
    # many tensors of several dtypes and sizes, some over torch's alignment: the zip writer writes front to back
    big = {f"t{i}": torch.randn(1000 + 37 * i).to(dtype) for i, dtype in enumerate([torch.float32, torch.bfloat16] * 8)}
    path = save_checkpoint({"model": big, "step": 1}, tmp_path / "step-1.pt")
    assert (tmp_path / "step-1.pt.sha256").read_text().strip() == sha256_file(path)
    assert torch.equal(load_checkpoint(path, require_digest=True)["model"]["t5"], big["t5"])


def test_a_checkpoint_rewritten_after_it_was_saved_is_hashed_again_before_pruning(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        save_checkpoint(state(step), tmp_path / f"step-{step}.pt")
    hashed = []
    monkeypatch.setattr(checkpoint, "sha256_file", lambda path: hashed.append(path.name) or sha256_file(path))
    mine = tmp_path / "step-1.pt"
    mine.write_bytes(b"the user's own bytes, written over a checkpoint\n")  # the same path, another file
    prune(tmp_path, keep=1)
    assert mine.read_bytes().startswith(b"the user's own bytes")  # its sidecar no longer matches: kept
    assert not (tmp_path / "step-2.pt").exists()  # unchanged since this process saved it: pruned unread
    assert hashed == ["step-1.pt"]


def test_killed_mid_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "step-1.pt"
    save_checkpoint(state(1), path)
    # a fresh process (not a fork: OpenMP does not survive fork) starts a big save into the same name
    script = (
        "import sys, torch; from hasten.runfolder.checkpoint import save_checkpoint; "
        "w = torch.zeros(96, 1024, 1024); print('ready', flush=True); "
        "save_checkpoint({'model': {'w': w}, 'step': 2}, sys.argv[1])"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir()), "the child never started writing"
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert load_checkpoint(path, require_digest=True)["step"] == 1
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1.pt", "step-1.pt.sha256"]


def test_rng_state_round_trip_through_a_safe_checkpoint(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save_checkpoint({"rng": rng_state()}, tmp_path / "step-1.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_checkpoint(tmp_path / "step-1.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_safetensors_export_round_trips_exactly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    save_checkpoint({"model": model.state_dict()}, tmp_path / "step-1.pt")
    for source in (save_weights(model, tmp_path), tmp_path / "step-1.pt"):  # run.save_weights' file, the checkpoint
        weights = read_weights(source)
        assert weights.keys() == model.state_dict().keys()
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        (tmp_path / "bad.safetensors").write_bytes(b"garbage")
        read_weights(tmp_path / "bad.safetensors")


def test_a_full_disk_at_the_run_lock_is_a_clear_error_and_leaves_no_lock(tmp_path, monkeypatch):
    import errno

    import hasten.runfolder.folder as folder_module
    from hasten.runfolder.folder import LOCK_NAME, RunFolderError, RunLock

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(folder_module.os, "write", no_space)
    with pytest.raises(RunFolderError, match="cannot write the lock .*No space left on device; free some space"):
        with RunLock(tmp_path / "run"):
            pass
    assert not (tmp_path / "run" / LOCK_NAME).exists()
