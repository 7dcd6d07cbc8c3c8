"""How the CPU threads wait (hasten/threads.py): the command has them sleep at once unless the user said otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hasten.threads import PASSIVE, WAIT_KEYS, set_wait, wait_settings, waiting

ROOT = Path(__file__).resolve().parents[1]


def test_threads_sleep_when_the_environment_says_nothing():
    assert wait_settings({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_settings({"OMP_WAIT_POLICY": "  ", "PATH": "/bin"}) == {"OMP_WAIT_POLICY": "PASSIVE"}  # blank: unset


@pytest.mark.parametrize("key", WAIT_KEYS)
def test_a_users_own_wait_is_left_as_it_is(key):
    environ = {key: "7"}
    assert wait_settings(environ) == {}
    assert set_wait(environ) == {} and environ == {key: "7"}


def test_set_wait_adds_the_setting_and_reports_it():
    environ = {"PATH": "/bin"}
    assert set_wait(environ) == PASSIVE
    assert environ == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert waiting(environ) == PASSIVE
    assert waiting({"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": ""}) == {"GOMP_SPINCOUNT": "300000"}


def test_the_command_sets_it_before_torch_and_leaves_the_users_own(tiny_overrides, tmp_path):
    """`hasten train` as a user runs it (its own process): the wait set before torch loads, recorded in summary.json,
    said at start; a user's GOMP_SPINCOUNT kept and recorded instead."""
    base = {k: v for k, v in os.environ.items() if k not in WAIT_KEYS} | {"PYTHONPATH": str(ROOT)}
    check = textwrap.dedent("""
        import sys
        import hasten.cli as cli
        import hasten.threads as threads

        set_wait = threads.set_wait

        def first(environ=None):  # the command's call, seen: was torch loaded before it?
            print("torch loaded before:", "torch" in sys.modules)
            return set_wait(environ)

        threads.set_wait = first
        sys.argv = ["hasten", *sys.argv[1:]]
        cli.run()
    """)
    recorded = {}
    for name, env in (("own", base), ("users", base | {"GOMP_SPINCOUNT": "300000"})):
        run_dir = tmp_path / name
        overrides = [o for o in tiny_overrides if not o.startswith("run.dir=")] + [f"run.dir={run_dir}"]
        done = subprocess.run([sys.executable, "-c", check, "train", *overrides, "train.epochs=1"], env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "torch loaded before: False" in done.stdout
        recorded[name] = json.loads((run_dir / "summary.json").read_text())["threads_wait"], done.stdout + done.stderr
    assert recorded["own"][0] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "CPU threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE)" in recorded["own"][1]
    assert recorded["users"][0] == {"GOMP_SPINCOUNT": "300000"}
    assert "OMP_WAIT_POLICY=PASSIVE" not in recorded["users"][1]


def test_the_probe_caches_timings_under_each_wait_apart(monkeypatch):
    """A step timed with threads that spin first is not reused for a run whose threads sleep (and back)."""
    import torch

    from hasten.machine import current
    from hasten.tune.probe_cache import machine_identity

    for key in WAIT_KEYS:
        monkeypatch.delenv(key, raising=False)
    spinning = machine_identity(torch.device("cpu"), current())
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    sleeping = machine_identity(torch.device("cpu"), current())
    assert spinning["threads_wait"] == {} and sleeping["threads_wait"] == PASSIVE
    assert spinning != sleeping
