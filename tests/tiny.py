"""The tiny recipes the tests share: overrides that make any recipe a seconds-long run on the synthetic set.

Tests take `tiny_overrides` (tests/conftest.py), this recipe writing into their tmp_path; code that needs it outside
a test function (a module-scoped fixture, the fault table's rows) calls `tiny_recipe` or extends `TINY_OVERRIDES`.
A test adds only what it is about: later overrides win."""

from __future__ import annotations

from pathlib import Path

TINY_OVERRIDES = [
    "data.name=synthetic",
    "data.synthetic_size=384",
    "data.augment.flip=false",
    "data.augment.translate=0",
    "model.width=8",
    # fixed, not the recipe's `auto`: a start-up probe per run would cost time, and near-ties may flip between
    # runs that a test compares bit for bit (tests/tune/test_autotune.py tests `auto` itself). fp32, which every
    # CPU runs at full speed: a CPU without bf16 instructions emulates bf16 at a quarter of fp32's speed or less,
    # which made the tiny runs 2-7x slower there; tests about bf16 ask for it themselves
    "precision=fp32",
    "train.channels_last=true",
    "tricks.ema=0",  # fashion-fast's EMA (decay 0.99) barely leaves the initial weights in a 48-step run
    "train.batch_size=16",
    "train.min_steps_per_epoch=0",  # tests that set a batch get that batch (tests/run/test_robust.py: the rule)
    "train.eval_batch_size=128",
    "train.epochs=2",
    "run.progress=false",
]

# `hasten gan` (dcgan-fashion) at the same scale: 64 synthetic images, one epoch, no quality measurement
TINY_GAN_OVERRIDES = [
    "data.name=synthetic",
    "data.synthetic_size=64",
    "model.latent=8",
    "model.width=4",
    "train.batch_size=16",
    "train.epochs=1",
    "train.threads=1",
    "quality.enabled=false",
    "run.progress=false",
    "run.tensorboard=false",
]


def tiny_recipe(run_dir: Path | str, *extra: str) -> list[str]:
    """The tiny recipe writing into `run_dir`, then `extra`."""
    return [*TINY_OVERRIDES, f"run.dir={run_dir}", *extra]
