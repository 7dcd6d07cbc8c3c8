"""Run folders have one owner: a lock while a run writes, no fresh run over another run's files, and resumes
that continue the same run (the recipe keys that give a run its meaning must match the checkpoint's).

- `RunLock`: `run.dir/.hasten.lock` holds the writer's pid and host, and the writer holds an exclusive `fcntl`
  lock on it, which the kernel drops when the process dies however it dies. Taking the lock is atomic: whoever
  gets the fcntl lock on the file that is at the path owns the folder, so a lock file left by a killed run is
  taken over by exactly one of the runs that find it, and a file whose pid is alive on this host (a writer that
  holds no fcntl lock, such as an older hasten) still refuses.
- `claim_fresh`: a new run into a folder holding another run's results refuses (exit 2), or with
  `run.overwrite=true` moves them into `replaced-<UTC time>/` beside them; nothing is ever deleted.
- `check_output`: a file a command writes (an export, an evaluation) is never one of a run folder's own files,
  nor an existing file unless the user says to replace it.
- `recipe_changes`: the keys of the recipe that differ from a checkpoint's, apart from those that only change
  how the run is executed (threads, device, logging, ...); extending `train.epochs` is allowed.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import shutil
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hasten.errors import HastenError, RecipeError
from hasten.progress import say
from hasten.recipe.schema import unsafe_folder
from hasten.text import listed

LOCK_NAME = ".hasten.lock"
# left in the --out folder of bench, sweep and transfer: the results there are a hasten command's, for a later one
# to replace (owned_output); a folder without it that holds anything is the user's
RESULTS_MARK = ".hasten-results"
# what a run leaves in its folder (hasten/runfolder/log.py, checkpoints, weights, plots): another run's results
RUN_FILES = (
    "recipe.yaml",
    "metrics.csv",
    "summary.json",
    "model.safetensors",
    "checkpoints",
    "tensorboard",
    "samples",  # hasten gan's sample grids
)
MAX_PID = 2**22  # Linux's pid_max limit: a lock naming a larger (or non-positive) pid names no process

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
    "data.in_memory",
    "data.cache",
    "optim.fused",
    "model.parameters",  # recorded, never read back: it follows from the keys that size the model
)
# what a run records of its data and model where its recipe left them unset: a checkpoint from before they were
# recorded holds null, which is no change
RECORDED_KEYS = ("data.classes", "data.size", "data.rgb")


class RunFolderError(HastenError):
    """The run folder belongs to another run (in use, or holding its results); exit code 2."""


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process on this host; a value no pid can have (0, negative, huge) is not."""
    if not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    except (OverflowError, OSError):
        return False
    return True


def _holder(text: str) -> tuple[dict[str, Any], int, str]:
    """What a lock file says: (its JSON, the pid, the host); pid -1 and host '?' when it says nothing usable."""
    try:
        holder = json.loads(text)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return {}, -1, "?"
    return (holder if isinstance(holder, dict) else {}), pid, host


FULL = (errno.ENOSPC, errno.EDQUOT)  # a disk or quota with no room left


class RunLock:
    """`with RunLock(folder):` the folder is this process's until the block ends (or the process dies)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_NAME
        self.held = False
        self._fd: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> RunLock:
        mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}).encode()
        # the folders made for the lock, deepest first: removed again on the way out if nothing was written there
        self._made = []
        for folder in (self.path.parent, *self.path.parent.parents):
            if folder.exists():
                break
            self._made.append(folder)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunFolderError(f"run.dir: cannot create {self.path.parent}: {error.strerror or error}") from None
        for _ in range(20):  # a lock file replaced under us (released and taken again meanwhile): try once more
            try:
                fd = self._create(self.path)
            except FileExistsError:
                if self._take_over():
                    return self
                continue
            except OSError as error:
                raise RunFolderError(
                    f"run.dir: cannot write to {self.path.parent}: {error.strerror or error}"
                ) from None
            if not self._lock(fd) or not self._still_at_path(fd):  # someone opened it before we locked it
                os.close(fd)
                continue
            try:
                os.write(fd, mine)
            except OSError as error:  # a full disk, a quota: the lock is not taken, and nothing is left behind
                os.close(fd)
                self.path.unlink(missing_ok=True)
                raise RunFolderError(
                    f"run.dir: cannot write the lock {self.path}: {error.strerror or error}"
                    + ("; free some space there, or give another run.dir" if error.errno in FULL else "")
                ) from None
            self._fd, self.held = fd, True
            return self
        raise RunFolderError(f"run.dir: could not take the lock {self.path}")

    @staticmethod
    def _create(path: Path) -> int:
        """A new file at `path` (never one that exists, never through a symbolic link)."""
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)

    @staticmethod
    def _lock(fd: int) -> bool:
        """An exclusive fcntl lock on `fd`, without waiting; False when another process holds it."""
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def _take_over(self) -> bool:
        """The lock file exists: refuse when its writer holds it or is alive; when it is stale, replace it by a
        new file of ours (renamed over it while we hold the old one's lock, so exactly one newcomer wins, and
        nothing is ever written into a file we did not create). False: it changed meanwhile, try again."""
        try:
            old = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # released meanwhile
        except OSError as error:  # a symbolic link (ELOOP), a folder, no permission
            raise RunFolderError(
                f"run.dir: {self.path} is not a lock file hasten can use ({error.strerror or error}); remove it"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(old).st_mode):
                raise RunFolderError(f"run.dir: {self.path} is not a regular file; remove it")
            if not self._lock(old):
                self._refuse(self._read_fd(old))
            if not self._still_at_path(old):
                return False
            text = self._read_fd(old)
            _, pid, host = _holder(text)
            if text.strip() and host == socket.gethostname() and pid != os.getpid() and _alive(pid):
                self._refuse(text)  # a live writer that takes no fcntl lock (an older hasten): it owns the folder
            if text.strip() and host not in (socket.gethostname(), "?"):
                self._refuse(text)  # written on another machine (a shared disk): its pid cannot be checked here
            fresh = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}.tmp")
            fresh.unlink(missing_ok=True)
            fd = self._create(fresh)
            if not self._lock(fd):  # nobody else knows this name: cannot happen, but never hold what is not ours
                os.close(fd)
                return False
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}).encode())
            os.replace(fresh, self.path)
            if text.strip():  # (an empty one: its writer died between creating and writing it)
                print(f"run.dir: took over the stale lock {self.path} (pid {pid} is gone)", file=sys.stderr)
            self._fd, self.held = fd, True
            return True
        finally:
            os.close(old)

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    @staticmethod
    def _read_fd(fd: int) -> str:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace")

    def _refuse(self, text: str) -> None:
        holder, pid, host = _holder(text)
        gone = host != socket.gethostname() and host != "?"
        raise RunFolderError(
            f"run.dir {self.path.parent} is in use by another run (pid {pid} on {host}, since "
            f"{holder.get('started', '?')}): wait for it to finish or give this run another run.dir"
            + (f"; if that run is gone (it ran on another machine), delete {self.path}" if gone else "")
        )

    def __exit__(self, *exc: object) -> None:
        if self.held and self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked: a newcomer that opened it sees it unlinked
            os.close(self._fd)
            self._fd, self.held = None, False
            for folder in self._made:  # a command refused before it wrote anything leaves no empty folder behind
                try:
                    folder.rmdir()
                except OSError:
                    break


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


def refuse_taken(folder: str | Path, resuming: bool = False) -> None:
    """A RunFolderError when `folder` holds another run's files (what a fresh run without run.overwrite may not
    mix with); a run checks it before anything slow, and again under the lock (`claim_fresh`)."""
    found = run_files(Path(folder))
    if not found:
        return
    names = ", ".join(p.name for p in found)
    how = "it has no checkpoint to resume=auto from" if resuming else "continue that run with resume=auto"
    raise RunFolderError(
        f"run.dir {folder} holds another run's files ({names}): {how}; give this run a new run.dir, or pass "
        "run.overwrite=true to move them into a dated subfolder (nothing is deleted)"
    )


# what a run writes before its first checkpoint: `resume=auto` on a folder holding only these (a run killed before it
# saved one) starts afresh, the files moved aside as run.overwrite moves them, never deleted
UNFINISHED_START = frozenset({"recipe.yaml", "metrics.csv", "tensorboard", "samples"})


def claim_fresh(folder: str | Path, overwrite: bool, resuming: bool = False) -> Path | None:
    """Make `folder` ready for a new run: refuse when it holds another run's results, or with `overwrite` move
    them into a dated subfolder (returned); with `resuming` (resume=auto that found no checkpoint), the files of a
    start that never saved one are moved aside the same way. Call with the lock held."""
    folder = Path(folder)
    found = run_files(folder)
    if not found:
        return None
    names = ", ".join(p.name for p in found)
    unfinished = resuming and {p.name for p in found} <= UNFINISHED_START
    if unfinished and not overwrite:  # a run killed before its first checkpoint (SIGKILL, the OOM killer)
        say(f"resume=auto: {folder} holds only the start of a run that saved no checkpoint ({names}): starting afresh")
    elif not overwrite:
        refuse_taken(folder, resuming)
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
    key = "run.overwrite" if overwrite else "resume=auto"
    say(f"{key}: the earlier run's files ({names}) moved into {aside}")
    return aside


def forget_unfinished_start(folder: str | Path) -> bool:
    """After a fresh run (one that found no other run's files in `folder`) ended in an error before it saved any
    checkpoint: remove what it wrote there (recipe.yaml, metrics.csv, its TensorBoard events, an empty
    checkpoints/), so that the folder is as it was and the same command runs again without run.overwrite. Returns
    whether anything was removed; a folder with a checkpoint is kept whole (a run that saved one is resumable)."""
    folder = Path(folder)
    checkpoints = folder / "checkpoints"
    if checkpoints.is_symlink() or (checkpoints.is_dir() and any(checkpoints.iterdir())):
        return False
    removed = remove_run_records(folder)
    if checkpoints.is_dir():
        checkpoints.rmdir()
    return removed


def remove_run_records(folder: str | Path) -> bool:
    """Remove the records a run writes beside its checkpoints (recipe.yaml, metrics.csv, summary.json, its
    TensorBoard events; never through a link); whether anything was removed."""
    folder, removed = Path(folder), False
    for name in ("recipe.yaml", "metrics.csv", "summary.json"):
        path = folder / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed = True
    board = folder / "tensorboard"
    if board.is_dir() and not board.is_symlink():
        shutil.rmtree(board, ignore_errors=True)
        removed = True
    return removed


RUN_MARKERS = ("recipe.yaml", "summary.json", "metrics.csv", "checkpoints", LOCK_NAME)  # a run folder holds one


def refuse_links(folder: str | Path, names: tuple[str, ...] = (*RUN_FILES, "evaluation")) -> None:
    """A RunFolderError when one of a run folder's own entries (`names`: recipe.yaml, metrics.csv, checkpoints,
    ...), or a file inside its checkpoints, is a symbolic link: hasten writes only the run's own files, never
    through a link into a place outside it (a foreign folder's `metrics.csv -> elsewhere` would be rewritten by a
    resume, `checkpoints -> elsewhere` pruned). The run folder itself may be a link (runs -> /data/runs)."""
    folder = Path(folder)
    found = [folder / name for name in names if (folder / name).is_symlink()]
    checkpoints = folder / "checkpoints"
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        found += [path for path in sorted(checkpoints.iterdir()) if path.is_symlink()]
    if found:
        shown = ", ".join(f"{path} -> {os.readlink(path)}" for path in found[:3]) + (", ..." if len(found) > 3 else "")
        raise RunFolderError(
            f"run.dir {folder}: {shown} is a symbolic link; hasten writes a run's files only inside its folder, "
            "never through a link: remove the link or give another run.dir"
        )


def is_run_folder(folder: Path) -> bool:
    return any((folder / name).exists() for name in RUN_MARKERS)


def check_output(path: str | Path, overwrite: bool, what: str, flag: str = "--overwrite") -> Path:
    """`path`, a file a command is about to write, unless it is one of a run folder's own files (recipe.yaml,
    summary.json, metrics.csv, model.safetensors, anything under checkpoints/ or tensorboard/, the lock, ...), or
    an existing file and not `overwrite`: then a RunFolderError naming it (exit 2). Symbolic links are followed."""
    path = Path(path)
    resolved = path.expanduser().resolve()
    for folder in resolved.parents:
        if is_run_folder(folder):
            first = resolved.relative_to(folder).parts[0]
            if first in RUN_FILES or first == LOCK_NAME or first.startswith("replaced-"):
                raise RunFolderError(
                    f"{what} {path}: that is the run folder {folder}'s own {first}; hasten never writes over a run's "
                    "files: give another path"
                )
            break
    if path.is_dir():
        example = path / f"model{path.suffix}"  # export's dir.safetensors/ -> dir.safetensors/model.safetensors
        raise RunFolderError(f"{what} {path} is a folder; give the file to write, e.g. {example}")
    if path.exists() and not overwrite:
        raise RunFolderError(f"{what} {path} exists; pass {flag} to replace it, or give another name")
    return path


def claim_output_folder(folder: str | Path, overwrite: bool, command: str) -> None:
    """For a command that writes its results into `folder` (bench, sweep, transfer): `folder` must not hold a
    training or GAN run's files (refused, or with `overwrite` moved aside as claim_fresh does). Its own earlier
    results (results.json, report.md, its runs/) are its to replace. Call with RunLock(folder) held."""
    found = run_files(folder)
    if found and not overwrite:
        raise RunFolderError(
            f"{command}: {folder} holds a run's files ({', '.join(p.name for p in found)}), which its results would "
            "mix with: give another --out, or pass run.overwrite=true to move them into a dated subfolder"
        )
    if found:
        claim_fresh(folder, True)


@contextlib.contextmanager
def owned_output(folder: str | Path, overwrite: bool, command: str) -> Iterator[Path]:
    """`with owned_output(out, overwrite, "bench"):` the results folder of an experiment command, locked as a run
    folder is (RunLock) and never a training or GAN run's folder (claim_output_folder)."""
    folder = Path(folder)
    reason = unsafe_folder(folder)
    if reason:
        raise RunFolderError(f"{command}: --out {folder} is {reason}; give a folder of its own")
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"{command}: --out {folder} is a file; give a folder for the results")
    with RunLock(folder):
        claim_output_folder(folder, overwrite, command)
        mark = folder / RESULTS_MARK
        theirs = [] if mark.exists() else sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
        if theirs and not overwrite:
            raise RunFolderError(
                f"{command}: --out {folder} holds files no hasten command wrote there ({listed(theirs, 5)}), which "
                "its results could replace: give a new or empty folder, or pass run.overwrite=true to write into it "
                "anyway"
            )
        fresh = not mark.exists()
        mark.write_text(f"results of hasten {command}: a later command may replace them\n", encoding="utf-8")
        try:
            yield folder
        except BaseException:
            if fresh and {p.name for p in folder.iterdir()} <= {LOCK_NAME, RESULTS_MARK}:  # refused, nothing written
                mark.unlink(missing_ok=True)  # so the folder the lock made is removed with it
            raise


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
        if a is None and key in RECORDED_KEYS:
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
