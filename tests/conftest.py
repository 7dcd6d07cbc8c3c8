"""Shared fixtures: small data, a quiet recipe, and a deterministic single-threaded torch."""

from __future__ import annotations

import math
import os
import tempfile

import pytest
import torch

from tests.standins import SignatureCheckingMonkeyPatch
from tests.tiny import tiny_recipe

# tiny models: one thread is faster than two, and does not fight the other tests' processes for the cores
torch.set_num_threads(1)

# hasten's cache (datasets, weights, start-up probe results) is never the user's: a fresh folder for the session,
# and one per test below, so no test sees another's cached probe result
os.environ["HASTEN_CACHE"] = tempfile.mkdtemp(prefix="hasten-cache-")


@pytest.fixture
def monkeypatch():
    """pytest's monkeypatch, whose stand-ins for hasten's functions must take their signatures (tests/standins.py)."""
    patch = SignatureCheckingMonkeyPatch()
    yield patch
    patch.undo()


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _timings_kept(request, monkeypatch):
    """The probe keeps every timing it takes, as it did before it checked that timings repeat: tests compare two
    runs of one recipe bit for bit, and the second must read the first's choice from the cache, where a tiny net's
    millisecond steps on a shared machine need not repeat within steadiness.REPEAT. Tests marked `steadiness` (the
    check itself) keep the real thresholds."""
    if request.node.get_closest_marker("steadiness") is None:
        from hasten.tune import steadiness

        monkeypatch.setattr(steadiness, "REPEAT", math.inf)
        monkeypatch.setattr(steadiness, "BUSY_SHARE", math.inf)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def tiny_overrides(tmp_path) -> list[str]:
    """Overrides that make any recipe a seconds-long run on the synthetic set, writing into tmp_path (tests/tiny.py)."""
    return tiny_recipe(tmp_path / "run")
