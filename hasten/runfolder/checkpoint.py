"""Checkpoints that never lose work: atomic writes, integrity digests, safe loading only.

A checkpoint is one `torch.save` file plus a `.sha256` sidecar written after it. The file is written to a
temporary name, flushed, fsynced and renamed, so a crash mid-write leaves the previous checkpoint intact;
the sidecar is what marks a checkpoint complete, and its digest catches truncation and flipped bytes that
the zip container would not. Loading is `torch.load(weights_only=True)` only: the unpickler then refuses
anything but tensors and plain containers, so a checkpoint from elsewhere cannot run code. There is no
fallback to unsafe loading.

A loaded file is checked before anything uses it: no tensor may claim more elements than its storage holds (a
stride-0 tensor of a few bytes can stand for gigabytes, which any copy or dtype conversion would allocate), and
a training checkpoint's sections must have the types the trainer writes (`training_checkpoint`, a pydantic
schema), so a hand-edited file is an error naming the field, not a traceback later in the run.
"""

from __future__ import annotations

import pickle
import random
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from safetensors.torch import load_file as load_safetensors

from hasten.errors import CheckpointError, schema_problems
from hasten.files import HashingWriter, sha256_file, write_atomic_bytes

DIGEST_SUFFIX = ".sha256"
NAME = re.compile(r"^step-(\d+)\.pt$")


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a nested state: about what its checkpoint file takes on disk."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _megabytes(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def disk_full_message(path: Path, needed_bytes: int) -> str:
    """What to tell the user when writing `path` ran out of space: how much it needs, how much is free."""
    try:
        free = f"{_megabytes(shutil.disk_usage(path.parent).free)} free now"
    except OSError:
        free = "free space unknown"
    return f"needs about {_megabytes(needed_bytes)} free in {path.parent} ({free})"


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` atomically, then its digest sidecar; returns the path. On failure (a full disk
    included: torch's zip writer raises RuntimeError, not OSError) the earlier checkpoints stay as they were and
    a CheckpointError says how much space the checkpoint needs."""
    path = Path(path)
    sidecar = path.with_name(path.name + DIGEST_SUFFIX)
    written: list[str] = []

    def write(file: IO[bytes]) -> None:  # hashed as written: a checkpoint is not read back to be hashed
        hashing = HashingWriter(file)
        torch.save(state, hashing)
        written.append(hashing.hexdigest())

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_bytes(path, write)
        digest = written[-1]
        write_atomic_bytes(sidecar, lambda f: f.write(f"{digest}\n".encode()))
        _SAVED[str(path.resolve())] = (_identity(path), digest)
    except (OSError, RuntimeError) as error:
        if path.is_file() and not sidecar.is_file():
            path.unlink(missing_ok=True)  # written but never marked complete: it would only be skipped later
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
        space = disk_full_message(path, _tensor_bytes(state) + (1 << 20))
        raise CheckpointError(
            f"cannot write checkpoint {path}: {reason}; it {space}; the earlier checkpoints are kept"
        ) from None
    return path


def _looks_like_torch_file(path: Path) -> bool:
    """A zip archive (torch.save since 1.6) or a legacy torch.save pickle (starts with a pickle protocol byte)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80" or zipfile.is_zipfile(path)


def load_checkpoint(path: str | Path, *, require_digest: bool = False) -> dict[str, Any]:
    """A checkpoint's contents, loaded safely onto the CPU; CheckpointError naming the file when it cannot be.

    Fails closed: whatever a malformed file makes the reader raise becomes a CheckpointError naming it.
    With `require_digest` (resuming a hasten run) a missing or mismatching `.sha256` sidecar is an error;
    files from elsewhere (plain state dicts) have none and are checked only by the safe unpickler.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.name.endswith(DIGEST_SUFFIX):
        raise CheckpointError(
            f"{path} is a checkpoint's digest sidecar, not a checkpoint: give {path.name[: -len(DIGEST_SUFFIX)]}"
        )
    sidecar = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        if sidecar.is_file():
            try:
                expected = sidecar.read_bytes().decode("ascii").strip()
            except UnicodeDecodeError:
                raise CheckpointError(f"checkpoint {path}: its digest {sidecar.name} is not text") from None
            if sha256_file(path) != expected:
                raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not match {sidecar.name}")
        elif require_digest:
            raise CheckpointError(f"checkpoint {path} is incomplete: {sidecar.name} is missing (interrupted save?)")
        if not _looks_like_torch_file(path):
            raise CheckpointError(f"{path} is not a PyTorch checkpoint (neither a torch.save zip archive nor a pickle)")
        _check_archive_sizes(path)
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).splitlines()[-1] if str(error) else ""
        if "weights only load failed" not in str(error).lower():  # a damaged pickle, not a refused object
            reason = f"checkpoint {path} is unreadable (corrupt or not a checkpoint): {first_line}"
            raise CheckpointError(reason) from None
        raise CheckpointError(
            f"refusing to load {path}: it holds objects outside what a weights-only load allows "
            f"(hasten never loads checkpoints unsafely). {first_line}".strip()
        ) from None
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - fail closed: a malformed file makes the reader raise anything
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or not a checkpoint): {reason}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a mapping")
    check_tensor_sizes(state, str(path))
    return state


def _check_archive_sizes(path: Path) -> None:
    """A torch.save zip stores its records uncompressed: one that unpacks to more than it holds (a zip bomb: a few
    MB of deflated zeros standing for gigabytes of tensor) is refused from its directory, before anything is
    unpacked."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, ValueError, NotImplementedError):
        return  # the loader below names what is wrong with it
    unpacked = sum(record.file_size for record in records)
    if unpacked > 2 * path.stat().st_size + (1 << 20):
        raise CheckpointError(
            f"checkpoint {path}: its records unpack to {unpacked:,} bytes from a {path.stat().st_size:,}-byte file "
            "(torch.save does not compress): refusing it"
        )


def check_tensor_sizes(value: Any, source: str, where: str = "") -> None:
    """CheckpointError naming the entry when a tensor in `value` (nested dicts, lists, tuples) claims more elements
    than its storage holds: an overlapping view (stride 0) that a copy or conversion would blow up to its full size.
    Called on every loaded file before any tensor in it is converted, compared or copied."""
    try:
        _check_sizes(value, source, where)
    except RecursionError:
        raise CheckpointError(f"checkpoint {source} is nested too deeply to be one hasten writes") from None


def _check_sizes(value: Any, source: str, where: str) -> None:
    if isinstance(value, torch.Tensor):
        claimed = value.numel() * value.element_size()
        held = value.untyped_storage().nbytes() if value.layout == torch.strided else claimed
        if claimed > held:
            raise CheckpointError(
                f"checkpoint {source}: tensor {where or '(top level)'} of shape {tuple(value.shape)} claims "
                f"{claimed:,} bytes over a storage of {held:,} (an overlapping view, e.g. stride 0); refusing it"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_sizes(item, source, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_sizes(item, source, f"{where}[{index}]")


class _Schema(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")


class RankRecord(_Schema):
    """One rank's own state in a training checkpoint (hasten.run.state.rank_state)."""

    rng: dict[str, Any]
    hooks: dict[str, dict[str, Any]] = {}
    epoch_sums: dict[str, float] = {}


class TrainingCheckpoint(_Schema):
    """The sections of a training checkpoint (hasten.run.trainer.Trainer.state_dict, format 2), with their types; the
    trainer's position (`trainer`) is validated against its State dataclass where it is loaded."""

    recipe: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] = {}
    scheduler: dict[str, Any] = {}
    precision: dict[str, Any] | None = None
    hooks: dict[str, dict[str, Any]] | None = None
    trainer: dict[str, Any] = {}
    ranks: list[RankRecord] | None = None

    @field_validator("hooks")
    @classmethod
    def _ema_count(cls, hooks: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        ema = (hooks or {}).get("ema")
        if ema is not None and "n_averaged" in ema:
            count = ema["n_averaged"]
            if isinstance(count, torch.Tensor):
                if count.numel() != 1 or count.is_floating_point() or count.is_complex():
                    raise ValueError(
                        f"hooks.ema.n_averaged: a count (one integer), got a tensor of {tuple(count.shape)}"
                    )
            elif not isinstance(count, int) or isinstance(count, bool):
                raise ValueError(f"hooks.ema.n_averaged: a count (one integer), got {type(count).__name__}")
            if int(count) < 0:
                raise ValueError(f"hooks.ema.n_averaged: a count, got {int(count)}")
        return hooks


def training_checkpoint(state: dict[str, Any], source: str) -> TrainingCheckpoint:
    """`state` checked against TrainingCheckpoint; CheckpointError naming `source` and every field that does not fit."""
    try:
        return TrainingCheckpoint.model_validate(state)
    except ValidationError as error:
        raise CheckpointError(
            f"{source} is not a training checkpoint as hasten writes one: {schema_problems(error)}"
        ) from None


def checkpoints_in(folder: str | Path) -> list[Path]:
    """hasten's checkpoints in `folder`, newest (highest step) first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def latest_usable(folder: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete, loadable checkpoint in `folder`; broken ones are skipped with a warning naming them."""
    for path in checkpoints_in(folder):
        try:
            return path, load_checkpoint(path, require_digest=True)
        except CheckpointError as error:
            print(f"warning: skipping {error}", file=sys.stderr)  # a note for the user, not a Python warning
    return None


def prune(folder: str | Path, keep: int, protect: tuple[Path, ...] = ()) -> None:
    """Delete all but the newest `keep` checkpoints (and their sidecars), never those in `protect`, and only what
    hasten wrote: a regular file whose digest sidecar matches it. A file of the user's own that is merely named
    like a checkpoint (`step-1.pt`, no sidecar, or a link) is left where it is."""
    for path in checkpoints_in(folder)[keep:]:
        if path not in protect and written_here(path):
            _SAVED.pop(str(path.resolve()), None)
            path.unlink(missing_ok=True)
            path.with_name(path.name + DIGEST_SUFFIX).unlink(missing_ok=True)


def written_here(path: Path) -> bool:
    """Whether `path` is a checkpoint hasten saved: a regular file (not a link) whose `.sha256` sidecar, also a
    regular file, holds its digest. A file this process saved and that is unchanged since (the same inode, size
    and modification time) is not hashed again: its digest is the one it was written with."""
    sidecar = path.with_name(path.name + DIGEST_SUFFIX)
    if path.is_symlink() or sidecar.is_symlink() or not (path.is_file() and sidecar.is_file()):
        return False
    try:
        recorded = sidecar.read_bytes().decode("ascii").strip()
        identity, digest = _SAVED.get(str(path.resolve()), (None, None))
        return recorded == (digest if identity == _identity(path) else sha256_file(path))
    except (OSError, UnicodeDecodeError):
        return False


# the checkpoints this process saved: resolved path -> (their identity when written, their digest), so that
# pruning an older one does not read it through again to hash it (a 6 MiB checkpoint: about 5 ms an epoch)
_SAVED: dict[str, tuple[tuple[int, int, int], str]] = {}


def _identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten: its inode, size and modification time (ns)."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def remove_stale_temporaries(folder: str | Path) -> None:
    """Delete temporary files that a killed save left behind (call before a run starts saving)."""
    folder = Path(folder)
    if folder.is_dir():
        for path in folder.glob(".*.tmp"):
            path.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states in a form a weights-only load accepts (no numpy objects)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def model_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's weights from a hasten checkpoint or a plain state dict."""
    weights = state.get("model", state)
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise CheckpointError("no model weights found: expected a hasten checkpoint or a state dict of tensors")
    return weights


def load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Load `weights` into `model` exactly; a CheckpointError lists every missing, unexpected or reshaped key."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    reshaped = [
        f"{k}: {tuple(weights[k].shape)} in the checkpoint vs {tuple(v.shape)} in the model"
        for k, v in own.items()
        if k in weights and weights[k].shape != v.shape
    ]
    problems = [f"{kind}: {', '.join(keys)}" for kind, keys in
                (("missing", missing), ("unexpected", unexpected), ("shapes differ", reshaped)) if keys]  # fmt: skip
    if problems:
        raise CheckpointError(f"{source} is from another model:\n  " + "\n  ".join(problems))
    model.load_state_dict(weights)


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Model weights from a safetensors file, a hasten checkpoint or a plain PyTorch state dict."""
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise CheckpointError(f"weights file not found: {path}")
        try:
            return load_safetensors(str(path))
        except Exception as error:  # safetensors raises its own error types for bad headers
            raise CheckpointError(f"{path} is not a readable safetensors file: {error}") from None
    try:
        return model_weights(load_checkpoint(path))
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}") if str(path) not in str(error) else error from None
