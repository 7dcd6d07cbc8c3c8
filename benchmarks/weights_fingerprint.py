"""SHA-256 of a short run's final weights (model and EMA copy), to check that a refactor changes no arithmetic:
run it before and after, on the same machine and torch, and compare the digests (bitwise equality).

    PYTHONPATH=. python benchmarks/weights_fingerprint.py OUT_DIR [key=value ...]

Base: fashion-fast on the synthetic set (256 images), 2 epochs, batch 32, width 8, fp32, seed 3, one thread.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

from hasten.recipe.schema import load_recipe
from hasten.run.build import train
from hasten.runfolder.checkpoint import load_checkpoint

BASE = [
    "data.name=synthetic", "data.synthetic_size=256", "data.test_subset=128", "train.epochs=2", "train.batch_size=32",
    "train.threads=1", "model.width=8", "precision=fp32", "run.progress=false", "run.tensorboard=false", "seed=3",
]  # fmt: skip


def fingerprint(state: dict) -> str:
    digest = hashlib.sha256()
    for part in (state["model"], state["hooks"].get("ema", {})):
        for key, value in sorted(part.items()):
            if isinstance(value, torch.Tensor):
                digest.update(key.encode())
                digest.update(value.cpu().numpy().tobytes())
    return digest.hexdigest()


def main(out: str, overrides: list[str]) -> None:
    summary = train(load_recipe("fashion-fast", [*BASE, f"run.dir={out}", *overrides]))
    newest = max(Path(out, "checkpoints").glob("step-*.pt"), key=lambda p: int(p.stem.removeprefix("step-")))
    print(overrides, summary["test_accuracy"], summary["train_loss"], fingerprint(load_checkpoint(newest)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
