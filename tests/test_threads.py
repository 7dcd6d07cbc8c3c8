"""How the CPU threads wait (hasten/threads.py): the command has them sleep at once unless the user said otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hasten import threads
from hasten.threads import BUSY_CORES, PASSIVE, WAIT_KEYS, Decision, others_busy, set_wait, wait_settings, waiting

ROOT = Path(__file__).resolve().parents[1]


def test_threads_sleep_when_other_processes_keep_half_a_core_busy():
    assert wait_settings({}, others_cpus=1.0) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_settings({}, others_cpus=BUSY_CORES) == PASSIVE
    assert wait_settings({"OMP_WAIT_POLICY": "  ", "PATH": "/bin"}, 2.0) == PASSIVE  # blank: unset
    assert wait_settings({}, others_cpus=0.1) == {}  # an idle machine: OpenMP's spin saves a wake-up a barrier
    assert wait_settings({}, others_cpus=None) == {}  # not measured: nothing changed


@pytest.mark.parametrize("key", WAIT_KEYS)
def test_a_users_own_wait_is_left_as_it_is(key, monkeypatch):
    monkeypatch.setattr(threads, "DECIDED", None)  # put back after the test: the process's own decision
    monkeypatch.setattr(
        threads, "others_busy", lambda seconds=0.1, meter=None: pytest.fail("looked although the user had said")
    )
    environ = {key: "7"}
    assert wait_settings(environ, 2.0) == {}
    assert set_wait(environ).settings == {} and environ == {key: "7"}


def test_set_wait_looks_only_when_asked_and_says_what_it_saw(monkeypatch):
    monkeypatch.setattr(threads, "DECIDED", None)
    monkeypatch.setattr(threads, "others_busy", lambda seconds=0.1, meter=None: (1.2, 2))
    environ = {"PATH": "/bin"}
    decided = set_wait(environ)
    assert decided == Decision(PASSIVE, 1.2, 2) and environ == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert "other processes kept 1.2 of 2 CPUs busy at start" in decided.describe()
    assert waiting(environ) == PASSIVE
    monkeypatch.setattr(threads, "others_busy", lambda seconds=0.1, meter=None: (0.05, 2))
    environ = {}
    assert set_wait(environ) == Decision({}, 0.05, 2) and environ == {} and threads.DECIDED.describe() is None
    assert threads.record() == {"environment": waiting(), "others_cpus": 0.05, "cpus": 2}
    monkeypatch.setattr(
        threads, "others_busy", lambda seconds=0.1, meter=None: pytest.fail("looked for a command that does not train")
    )
    assert set_wait({}, look=False) == Decision({})
    assert waiting({"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": ""}) == {"GOMP_SPINCOUNT": "300000"}


def test_others_busy_reads_the_machine_while_this_process_sleeps():
    seen = others_busy(0.05)
    if seen is None:
        pytest.skip("this system's CPU time cannot be read (no /proc/stat)")
    others, cpus = seen
    assert cpus >= 1 and 0.0 <= others <= cpus + 0.5


def test_the_command_decides_before_torch_beside_a_busy_process_and_leaves_the_users_own(tiny_overrides, tmp_path):
    """`hasten train` as a user runs it (its own process) beside a process that keeps a core busy: it looks before
    torch loads, its threads sleep when they wait, and the run says so and records it; a user's GOMP_SPINCOUNT is
    kept and recorded instead, and nothing is said."""
    base = {k: v for k, v in os.environ.items() if k not in WAIT_KEYS} | {"PYTHONPATH": str(ROOT)}
    check = textwrap.dedent("""
        import sys
        import hasten.cli as cli
        import hasten.threads as threads

        set_wait = threads.set_wait

        def first(environ=None, look=True):  # the command's call, seen: was torch loaded before it?
            print("torch loaded before:", "torch" in sys.modules, "looked:", look)
            return set_wait(environ, look)

        threads.set_wait = first
        sys.argv = ["hasten", *sys.argv[1:]]
        cli.run()
    """)
    recorded = {}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # spinning before the command looks
        for name, env in (("own", base), ("users", base | {"GOMP_SPINCOUNT": "300000"})):
            run_dir = tmp_path / name
            overrides = [o for o in tiny_overrides if not o.startswith("run.dir=")] + [f"run.dir={run_dir}"]
            done = subprocess.run([sys.executable, "-c", check, "train", *overrides, "train.epochs=1"], env=env,
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
            assert "torch loaded before: False looked: True" in done.stdout
            summary = json.loads((run_dir / "summary.json").read_text())
            recorded[name] = summary["threads_wait"], done.stdout + done.stderr
    finally:
        busy.kill()
        busy.wait()
    own, said = recorded["own"]
    assert own["environment"] == {"OMP_WAIT_POLICY": "PASSIVE"} and own["others_cpus"] >= BUSY_CORES
    assert "CPU threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE): other processes kept" in said
    users, said = recorded["users"]
    assert users == {"environment": {"GOMP_SPINCOUNT": "300000"}, "others_cpus": None, "cpus": None}
    assert "OMP_WAIT_POLICY=PASSIVE" not in said


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
