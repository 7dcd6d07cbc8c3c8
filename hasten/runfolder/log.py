"""What a run leaves behind in `run.dir`: recipe.yaml, metrics.csv, TensorBoard events, summary.json.

Only the process that owns the run (rank 0) writes; the others get a RunLog with `enabled=False`.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hasten.errors import HastenError
from hasten.files import write_atomic_text
from hasten.machine import current as current_machine
from hasten.runfolder.checkpoint import disk_full_message
from hasten.version import __version__


def git_commit() -> str | None:
    """The commit of the hasten checkout, when it runs from one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    """Versions and machine, saved with every run and benchmark so numbers can be traced."""
    return {
        "hasten_version": __version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "decided_for": current_machine().describe(),  # the facts hasten's machine rules read (hasten/machine.py)
    }


def finite_json(value: Any) -> Any:
    """`value` with every inf/NaN float replaced by None (JSON has no such numbers; Python would write NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


@contextlib.contextmanager
def writing(path: Path, size: int) -> Iterator[None]:
    """Turn a failed write of `path` (about `size` bytes) into a HastenError naming it; a full disk says how much
    space is needed."""
    try:
        yield
    except OSError as error:
        space = f"; it {disk_full_message(path, size)}" if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise HastenError(f"run.dir: cannot write {path}: {error.strerror or error}{space}") from None


def write_atomic(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all (hasten/files.py; not fsynced: a crash may lose the last write, never
    leave half of it); a failure is a HastenError naming the file, a full disk with the space it needs."""
    with writing(path, len(text.encode())):
        write_atomic_text(path, text, durable=False)


class RunLog:
    def __init__(self, run_dir: str | Path, *, enabled: bool = True, tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.enabled = enabled
        self.writer = None
        self._tensorboard = tensorboard  # the writer is made on first use: a run that fails early leaves no events
        self._fields: list[str] | None = None
        if not enabled:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            raise HastenError(f"run.dir: cannot write to {self.dir}: {error.strerror or error}") from None

    def _board(self) -> Any:
        """The TensorBoard writer, made on first use (None when off)."""
        if self.writer is None and self._tensorboard and self.enabled:
            from torch.utils.tensorboard import SummaryWriter  # imported here: slow, and only rank 0 needs it

            self.writer = SummaryWriter(str(self.dir / "tensorboard"))
        return self.writer

    def open_board(self) -> None:
        """Make the TensorBoard writer now (its import takes about a second), before training is timed."""
        self._board()

    def write_recipe(self, recipe_yaml: str) -> None:
        if self.enabled:
            env = environment()
            header = f"# hasten {env['hasten_version']}, git {env['git_commit']}, torch {env['torch_version']}\n"
            write_atomic(self.dir / "recipe.yaml", header + recipe_yaml)

    def start_metrics(self, fields: list[str]) -> None:
        """Start metrics.csv afresh with these columns."""
        self._fields = fields
        if self.enabled:
            with writing(self.dir / "metrics.csv", 4096), open(self.dir / "metrics.csv", "w", newline="") as f:
                csv.writer(f).writerow(fields)

    def existing_metrics(self) -> list[dict[str, str]]:
        """The rows of run.dir/metrics.csv (none when absent); a HastenError naming it when it cannot be read."""
        path = self.dir / "metrics.csv"
        if not path.exists():
            return []
        try:
            with open(path, newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise HastenError(
                f"{path}: cannot read it to continue the run ({reason}): move it away to resume without it"
            ) from None

    def resume_metrics(self, fields: list[str], upto_epoch: int) -> None:
        """Continue metrics.csv after a resume: keep the rows up to `upto_epoch`, drop later ones (redone)."""
        self._fields = fields
        if not self.enabled:
            return
        path = self.dir / "metrics.csv"
        rows = self.existing_metrics()
        kept = [r for r in rows if (r.get("epoch") or "").isdigit() and int(r["epoch"]) <= upto_epoch]
        with writing(path, 4096 + 200 * len(kept)), open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)

    def epoch(self, row: dict[str, Any], step: int) -> None:
        """One row of metrics.csv, and the same numbers as TensorBoard scalars at `step`."""
        if not self.enabled:
            return
        assert self._fields is not None, "start_metrics first"
        with writing(self.dir / "metrics.csv", 4096), open(self.dir / "metrics.csv", "a", newline="") as f:
            csv.writer(f).writerow([row.get(k, "") for k in self._fields])
        if (writer := self._board()) is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "epoch":
                    writer.add_scalar(key, value, step)
            with writing(self.dir / "tensorboard", 1 << 20):
                writer.flush()

    def scalar(self, key: str, value: float, step: int) -> None:
        if (writer := self._board()) is not None:
            writer.add_scalar(key, value, step)

    def summary(self, summary: dict[str, Any]) -> None:
        """summary.json: strict JSON, so a non-finite number (a diverged loss) is written as null."""
        if self.enabled:
            write_atomic(self.dir / "summary.json", json.dumps(finite_json(summary), indent=2, allow_nan=False) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """A run's metrics.csv as a list of rows of numbers (empty cells dropped); [] when there is none."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [
            {key: float(value) for key, value in row.items() if value not in ("", None)} for row in csv.DictReader(f)
        ]
