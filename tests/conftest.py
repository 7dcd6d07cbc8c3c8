"""Shared fixtures: small data, a quiet recipe, and a deterministic single-threaded torch."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

# tiny models: one thread is faster than two, and does not fight the other tests' processes for the cores
torch.set_num_threads(1)

# hasten's cache (datasets, weights, start-up probe results) is never the user's: a fresh folder for the session,
# and one per test below, so no test sees another's cached probe result
os.environ["HASTEN_CACHE"] = tempfile.mkdtemp(prefix="hasten-cache-")


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def tiny_overrides(tmp_path) -> list[str]:
    """Overrides that make any recipe a seconds-long run on the synthetic set, writing into tmp_path."""
    return [
        "data.name=synthetic",
        "data.synthetic_size=384",
        "data.augment.flip=false",
        "data.augment.translate=0",
        "model.width=8",
        # fixed, not the recipe's `auto`: a start-up probe per run would cost time, and near-ties may flip between
        # runs that a test compares bit for bit (tests/tune/test_autotune.py tests `auto` itself)
        "precision=bf16",
        "train.channels_last=true",
        "tricks.ema=0",  # fashion-fast's EMA (decay 0.99) barely leaves the initial weights in a 48-step run
        "train.batch_size=16",
        "train.min_steps_per_epoch=0",  # tests that set a batch get that batch (tests/run/test_robust.py: the rule)
        "train.eval_batch_size=128",
        "train.epochs=2",
        "run.progress=false",
        f"run.dir={tmp_path / 'run'}",
    ]
