"""Run folders have one owner: a lock while a run writes, no fresh run over another run's files, and resumes
that continue the same run (the recipe keys that give a run its meaning must match the checkpoint's).

- `RunLock`: `run.dir/.hasten.lock` holds the writer's pid and host, created exclusively (O_EXCL), so two runs
  cannot share a folder; a lock whose pid is gone on this host is stale (the run was killed) and is taken over.
- `claim_fresh`: a new run into a folder holding another run's results refuses (exit 2), or with
  `run.overwrite=true` moves them into `replaced-<UTC time>/` beside them; nothing is ever deleted.
- `recipe_changes`: the keys of the recipe that differ from a checkpoint's, apart from those that only change
  how the run is executed (threads, device, logging, ...); extending `train.epochs` is allowed.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from hasten.errors import HastenError, RecipeError
from hasten.progress import say

LOCK_NAME = ".hasten.lock"
# what a run leaves in its folder (hasten/runlog.py, checkpoints, weights, plots): another run's results
RUN_FILES = ("recipe.yaml", "metrics.csv", "summary.json", "model.safetensors", "checkpoints", "tensorboard")

# recipe keys (and sections) that change how a run is executed, never what it computes: free to change on resume
EXECUTION_KEYS = (
    "name",
    "device",
    "resume",
    "resume_allow_changes",
    "run",
    "sweep",
    "transfer",
    "train.threads",
    "train.compile",
    "train.eval_batch_size",
    "train.checkpoint_activations",
    "train.channels_last",
    "train.on_nan",
    "data.root",
    "data.download",
    "data.workers",
)


class RunFolderError(HastenError):
    """The run folder belongs to another run (in use, or holding its results); exit code 2."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


class RunLock:
    """`with RunLock(folder):` the folder is this process's until the block ends (or the process dies)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_NAME
        self.held = False

    def __enter__(self) -> RunLock:
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunFolderError(f"run.dir: cannot create {self.path.parent}: {error.strerror or error}") from None
        for _ in range(3):  # a stale lock is removed, then taken like a free one
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._clear_if_stale()
                continue
            except OSError as error:
                raise RunFolderError(
                    f"run.dir: cannot write to {self.path.parent}: {error.strerror or error}"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(mine, f)
            self.held = True
            return self
        raise RunFolderError(f"run.dir: could not take the lock {self.path}")

    def _clear_if_stale(self) -> None:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            pid, host = int(holder["pid"]), str(holder["host"])
        except FileNotFoundError:
            return  # released meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            holder, pid, host = {}, -1, "?"
        if host == socket.gethostname() and (pid < 0 or not _alive(pid)):
            print(f"run.dir: removing the stale lock {self.path} (pid {pid} is gone)", file=sys.stderr)
            self.path.unlink(missing_ok=True)
            return
        raise RunFolderError(
            f"run.dir {self.path.parent} is in use by another run (pid {pid} on {host}, since "
            f"{holder.get('started', '?')}): wait for it to finish or give this run another run.dir; if that run "
            f"is gone (it ran on another machine), delete {self.path}"
        )

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_files(folder: str | Path) -> list[Path]:
    """Results of an earlier run in `folder` (empty folders do not count)."""
    folder = Path(folder)
    found = []
    for name in RUN_FILES:
        path = folder / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            found.append(path)
    return found


def claim_fresh(folder: str | Path, overwrite: bool, resuming: bool = False) -> Path | None:
    """Make `folder` ready for a new run: refuse when it holds another run's results, or with `overwrite` move
    them into a dated subfolder (returned). Call with the lock held."""
    folder = Path(folder)
    found = run_files(folder)
    if not found:
        return None
    names = ", ".join(p.name for p in found)
    if not overwrite:
        how = "it has no checkpoint to resume=auto from" if resuming else "continue that run with resume=auto"
        raise RunFolderError(
            f"run.dir {folder} holds another run's files ({names}): {how}; give this run a new run.dir, or pass "
            "run.overwrite=true to move them into a dated subfolder (nothing is deleted)"
        )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = folder / f"replaced-{stamp}"
    suffix = 1
    while aside.exists():
        aside, suffix = folder / f"replaced-{stamp}-{suffix}", suffix + 1
    try:
        aside.mkdir()
        for path in found:
            shutil.move(str(path), str(aside / path.name))
    except OSError as error:
        raise RunFolderError(f"run.overwrite: cannot move the old files into {aside}: {error}") from None
    say(f"run.overwrite: the earlier run's files ({names}) moved into {aside}")
    return aside


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _covered(key: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def recipe_changes(saved: dict[str, Any], current: dict[str, Any], allowed: list[str] = ()) -> list[str]:
    """'key: saved -> current' for each key that changes the run's meaning, not in `allowed` (keys or sections).
    Keys only one side knows (a recipe from another hasten version) are not compared."""
    old, new = _flatten(saved), _flatten(current)
    changes = []
    for key in sorted(old.keys() & new.keys()):
        a, b = old[key], new[key]
        if a == b or _covered(key, EXECUTION_KEYS) or _covered(key, list(allowed)):
            continue
        if key == "train.epochs" and isinstance(a, int) and isinstance(b, int) and b > a:
            continue  # training longer continues the same run
        changes.append(f"{key}: {a!r} -> {b!r}")
    return changes


def check_resume_recipe(saved: Any, current: dict[str, Any], allowed: list[str], source: str) -> None:
    """RecipeError listing the meaning-changing differences between a checkpoint's recipe and this run's."""
    if not isinstance(saved, dict) or not saved:
        return  # a checkpoint from elsewhere: nothing to compare
    changes = recipe_changes(saved, current, allowed)
    if changes:
        keys = ",".join(c.split(":")[0] for c in changes)
        raise RecipeError(
            f"resume: this recipe differs from the one {source} was trained with, in key(s) that change the run:\n"
            + "\n".join(f"  - {c}" for c in changes)
            + f"\nresume with the checkpoint's values, allow them with resume.allow_changes=[{keys}], "
            "or start a new run (another run.dir)"
        )
