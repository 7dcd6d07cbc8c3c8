"""`hasten gan` under the run-folder contract of `hasten train` (docs/reliability.md, "Stops"): SIGINT or SIGTERM at
any point of a run, sent to a real `hasten gan` process, ends in a checkpoint at a step boundary (exit 128 + the
signal, "stopped: ...; resume with: hasten gan ... resume=auto") or, during the start-up, in a folder left as it was;
`resume=auto` then finishes the run, with the result of a run never stopped. A stop once the last epoch is done lets
the run finish (exit 0, summary written).

The signal is sent from inside the child at a chosen point (a stand-in around one of the run's functions calls
os.kill on its own process: where it lands is exact) or from this process once the child has checkpointed."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.cli import main
from hasten.experiments.gan import train_gan
from hasten.recipe.gan import load_gan_recipe
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.runfolder.folder import LOCK_NAME, run_files
from tests.resuming import metrics
from tests.tiny import TINY_GAN_OVERRIDES

# 64 images in batches of 8: 8 steps an epoch, 16 in the run
GAN_ARGS = [*TINY_GAN_OVERRIDES, "train.batch_size=8", "train.epochs=2", "device=cpu"]

# `hasten gan ARGS` in a child that sends itself SIGNAL at POINT (a stand-in around one of the run's functions)
SIGNALLING_CHILD = """
import importlib, os, signal, sys
point, signum, args = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3:]
where = {  # point: (what is stood in for, at which call, before or after the real one)
    "reading the data": ("hasten.experiments.gan:load_dataset", 1, "before"),  # start-up, before the lock
    "claiming the folder": ("hasten.experiments.gan:claim_fresh", 1, "after"),  # start-up, locked and claimed
    # start-up: the quality classifier's training, under its own handlers (its loop's first lines)
    "training the quality classifier": ("hasten.runfolder.log:RunLog.start_metrics", 1, "before"),
    "writing the run's files": ("hasten.experiments.gan:remove_stale_temporaries", 1, "before"),  # no step yet
    "mid-epoch": ("hasten.experiments.gan:gan_step", 11, "before"),  # the third step of the second epoch
    "between epochs": ("hasten.experiments.gan:save_grid", 1, "before"),  # the end of the first epoch
    "after the last epoch": ("hasten.experiments.gan:save_grid", 2, "before"),  # the end of the run
}
target, at, when = where[point]
module, _, path = target.partition(":")
owner = importlib.import_module(module)
*outer, name = path.split(".")
for part in outer:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), []
def stand_in(*a, **k):
    calls.append(1)
    if len(calls) == at and when == "before":
        os.kill(os.getpid(), signum)
    result = real(*a, **k)
    if len(calls) == at and when == "after":
        os.kill(os.getpid(), signum)
    return result
setattr(owner, name, stand_in)
from hasten.cli import main
sys.exit(main(args))
"""


def gan_args(run: Path) -> list[str]:
    return ["gan", *GAN_ARGS, f"run.dir={run}"]


def result(run: Path) -> dict[str, Any]:
    """What must not depend on whether the run was stopped: the summary's losses, D's outputs, scales and step
    counts, metrics.csv without timings, and both networks' final weights."""
    summary = json.loads((run / "summary.json").read_text())
    kept = ("epochs", "steps", "loss_d", "loss_g", "d_real", "d_fake", "loss_scale_d", "loss_scale_g")
    final = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    weights = {f"{net}.{k}": v for net in ("generator", "discriminator") for k, v in final[net].items()}
    return {"summary": {k: summary[k] for k in kept}, "metrics": metrics(run), "weights": weights}


def same_result(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["summary"] == b["summary"]
        and a["metrics"] == b["metrics"]
        and a["weights"].keys() == b["weights"].keys()
        and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    )


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> dict[str, Any]:
    """The result of the run, uninterrupted."""
    run = tmp_path_factory.mktemp("never-stopped") / "run"
    threads = torch.get_num_threads()
    try:
        train_gan(load_gan_recipe("dcgan-fashion", [*GAN_ARGS, f"run.dir={run}"]))
    finally:
        torch.set_num_threads(threads)
    return result(run)


def position(run: Path) -> tuple[int, int, int]:
    """(epoch, batch, step) of the newest checkpoint."""
    state = load_checkpoint(checkpoints_in(run / "checkpoints")[0], require_digest=True)["state"]
    return state["epoch"], state["batch"], state["step"]


STARTUP = "during start-up, before the run wrote anything"


STOPS = [  # (point, signal, how the stop is told, (epoch, batch, step) of the checkpoint left, None: none)
    ("reading the data", signal.SIGTERM, STARTUP, None),
    ("reading the data", signal.SIGINT, STARTUP, None),
    ("claiming the folder", signal.SIGTERM, STARTUP, None),
    ("writing the run's files", signal.SIGTERM, "at a step boundary", (0, 0, 0)),  # step 0: before the first step
    ("mid-epoch", signal.SIGTERM, "at a step boundary", (1, 3, 11)),  # the step under way is finished first
    ("between epochs", signal.SIGINT, "at a step boundary", (1, 0, 8)),  # the epoch's own checkpoint, no step more
]


@pytest.mark.parametrize(("point", "sig", "stopped", "left"), STOPS, ids=[f"{p}, {s.name}" for p, s, *_ in STOPS])
def test_a_stop_leaves_a_checkpoint_or_the_folder_as_it_was_and_resume_auto_finishes_the_run(
    tmp_path, capsys, never_stopped, point, sig, stopped, left
):
    run = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", SIGNALLING_CHILD, point, sig.name, *gan_args(run)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 128 + sig, child.stderr
    err = " ".join(child.stderr.split())  # (the line is wrapped to the terminal's width)
    assert f"stopped: stopped by {sig.name} {stopped}" in err and "error" not in err and "Traceback" not in err
    assert f"resume with: hasten gan {GAN_ARGS[0]} " in err and err.endswith(f"run.dir={run} resume=auto")
    assert not (run / LOCK_NAME).exists()
    if left is None:  # nothing of the run's: a fresh start may use the folder
        assert not run.exists() or not run_files(run)
    else:
        assert f"checkpoint {run / 'checkpoints'}" in err and position(run) == left
    capsys.readouterr()
    assert main([*gan_args(run), "resume=auto"]) == 0
    err = capsys.readouterr().err
    if left is None:
        assert f"resume=auto: no checkpoint in {run / 'checkpoints'} yet; starting afresh" in " ".join(err.split())
    else:
        assert "resuming from" in err
    assert same_result(result(run), never_stopped)


def test_sigterm_while_the_quality_classifier_trains_is_a_stop_during_start_up(tmp_path, capsys):
    """The classifier's training (hasten/experiments/frechet.py, hasten train's loop in hasten's cache) catches the
    signal itself and stops at its step boundary: the GAN run says it stopped during its start-up, its folder as it
    was, and resume=auto starts it afresh."""
    quality = [
        "quality.enabled=true", "data.synthetic_size=256", "quality.samples=64", "quality.classifier_epochs=1",
        "quality.classifier_overrides=[model.width=4, train.batch_size=64, train.threads=1, data.augment.translate=0]",
    ]  # fmt: skip
    run = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", SIGNALLING_CHILD, "training the quality classifier", "SIGTERM",
         *gan_args(run), *quality],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 143, child.stderr
    err = " ".join(child.stderr.split())
    assert f"stopped: stopped by SIGTERM {STARTUP} (while training the quality classifier);" in err
    assert err.endswith(shlex.join([f"run.dir={run}", *quality, "resume=auto"]))
    assert not run_files(run) and not (run / LOCK_NAME).exists()
    capsys.readouterr()
    assert main([*gan_args(run), *quality, "resume=auto"]) == 0
    assert "starting afresh" in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["frechet_distance"] > 0


def test_sigterm_after_the_last_epoch_lets_the_run_finish(tmp_path, never_stopped):
    run = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", SIGNALLING_CHILD, "after the last epoch", "SIGTERM", *gan_args(run)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert "stopped" not in child.stderr
    assert same_result(result(run), never_stopped)


def test_sigint_from_outside_mid_training_checkpoints_exits_130_and_resume_auto_finishes_as_if_never_stopped(
    tmp_path, capsys
):
    """As `hasten train`'s test_sigint_checkpoints_and_exits_130: the signal comes from another process, once the
    run has written its first checkpoint (the end of its first of 6 epochs of 64 steps)."""
    longer = ["data.synthetic_size=512", "train.epochs=6"]
    run, straight = tmp_path / "run", tmp_path / "straight"
    cmd = [sys.executable, "-m", "hasten", *gan_args(run), *longer]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not checkpoints_in(run / "checkpoints") and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    err = " ".join(err.split())
    assert "stopped: stopped by SIGINT at a step boundary; checkpoint" in err and "error:" not in err
    assert err.endswith("train.epochs=6 resume=auto")  # the same command, resumed
    epoch, _, step = position(run)
    assert epoch < 6 and 64 <= step < 6 * 64
    assert main([*gan_args(run), *longer, "resume=auto"]) == 0
    assert main([*gan_args(straight), *longer]) == 0
    assert same_result(result(run), result(straight))
