"""What the exact-resume tests share: a run resumed from one of its mid-run checkpoints into a fresh folder, and
the parts of two runs that must be equal (metrics.csv without timings, the final checkpoint)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

import hasten
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint


def resume_into(folder: Path, recipe: str | None, overrides: list[str], middle: Path, metrics_from: Path) -> Path:
    """Train `recipe` with `overrides` into `folder`, resumed from checkpoint `middle`; the folder starts with
    `metrics_from`'s metrics.csv, as the stopped run's own folder would hold it. Returns `folder`."""
    folder.mkdir()
    (folder / "metrics.csv").write_text((metrics_from / "metrics.csv").read_text())
    hasten.train(recipe, [*overrides, f"run.dir={folder}", f"resume={middle}"])
    return folder


def metrics(folder: Path) -> list[dict[str, str]]:
    """metrics.csv's rows without the timing columns (which differ between any two runs)."""
    rows = csv.DictReader((folder / "metrics.csv").open())
    return [{k: v for k, v in row.items() if "second" not in k} for row in rows]


def final_checkpoint(folder: Path) -> dict[str, Any]:
    return load_checkpoint(checkpoints_in(folder / "checkpoints")[0])


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    return final_checkpoint(folder)["model"]
