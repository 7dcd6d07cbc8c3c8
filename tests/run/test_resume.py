"""Exact resume, stop on signals, non-finite losses and bad checkpoints, through the trainer and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hasten
from hasten.cli import main
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint, save_checkpoint
from tests.resuming import final_weights, metrics, resume_into

TRICKY = ["data.augment.flip=true", "data.augment.translate=2", "tricks.label_smoothing=0.1", "tricks.mixup=0.4"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_resume_mid_epoch_is_exact(tiny_overrides, tmp_path, precision):
    common = [*tiny_overrides, *TRICKY, f"precision={precision}", "run.save_every_steps=7", "run.keep=100"]
    whole = tmp_path / "whole"
    hasten.train(None, [*common, f"run.dir={whole}"])
    middle = whole / "checkpoints" / "step-35.pt"  # epoch 2 of 2, mid-epoch (24 steps per epoch)
    assert load_checkpoint(middle)["trainer"]["batch"] not in (0, 24)
    resumed = resume_into(tmp_path / "resumed", None, common, middle, metrics_from=whole)
    assert metrics(resumed) == metrics(whole)
    a, b = final_weights(whole), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if precision == "fp16":  # the loss scaler's state came back too (not reset to its initial scale)
        assert load_checkpoint(middle)["precision"], "the fp16 checkpoint holds the scaler's state"


def test_keeps_the_newest_and_the_best(tiny_overrides, tmp_path):
    hasten.train(None, [*tiny_overrides, "train.epochs=3", "run.keep=1", f"run.dir={tmp_path / 'r'}"])
    names = [p.name for p in checkpoints_in(tmp_path / "r" / "checkpoints")]
    assert names[0] == "step-72.pt" and len(names) <= 2
    assert all((tmp_path / "r" / "checkpoints" / f"{n}.sha256").is_file() for n in names)


def test_sigterm_checkpoints_exits_143_and_resume_auto_finishes(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    args = [a for a in tiny_overrides if not a.startswith(("run.dir", "train.epochs"))]
    cmd = [sys.executable, "-m", "hasten", "train", *args, "train.epochs=200", f"run.dir={run}", "train.threads=1"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not checkpoints_in(run / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143, err
    assert "SIGTERM" in err
    newest = checkpoints_in(run / "checkpoints")[0]
    state = load_checkpoint(newest, require_digest=True)
    assert 0 < state["trainer"]["step"] < 200 * 24
    # fewer epochs than the checkpoint's run: a change of the run's meaning, allowed here by name
    assert main(["train", *args, "train.epochs=3", f"run.dir={run}", "resume=auto"]) == 2
    allow = "resume.allow_changes=[train.epochs]"
    code = main(["train", *args, "train.epochs=3", f"run.dir={run}", "resume=auto", allow])
    epochs_done = state["trainer"]["epoch"]
    if epochs_done >= 3:
        assert code == 2  # nothing left to do: said so
    else:
        assert code == 0
        assert json.loads((run / "summary.json").read_text())["epochs"] == 3


def test_on_nan_raise_names_the_step_and_skip_counts(tiny_overrides, tmp_path, capsys):
    diverge = [*tiny_overrides, "precision=fp32", "optim.lr=1e30", "optim.base_batch=null", "schedule.name=constant"]
    code = main(["train", *diverge, f"run.dir={tmp_path / 'a'}"])
    assert code == 1
    assert "at step" in capsys.readouterr().err
    summary = hasten.train(None, [*diverge, "train.on_nan=skip", f"run.dir={tmp_path / 'b'}"])
    assert summary["nonfinite_steps"] > 0


def test_bad_checkpoints_are_clear_errors_and_overwrite_nothing(tiny_overrides, tmp_path, capsys):
    run = tmp_path / "run"
    hasten.train(None, [*tiny_overrides, "train.epochs=1", f"run.dir={run}"])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "tensorboard" not in p.parts}

    assert main(["train", *tiny_overrides, f"run.dir={run}", f"resume={tmp_path / 'missing.pt'}"]) == 2
    assert "not found" in capsys.readouterr().err

    other = [*tiny_overrides, "model.width=4", f"run.dir={run}", f"resume={checkpoints_in(run / 'checkpoints')[0]}"]
    assert main(["train", *other]) == 2
    err = capsys.readouterr().err
    assert "model.width: 8 -> 4" in err and "resume.allow_changes=[model.width]" in err
    assert main(["train", *other, "resume.allow_changes=[model]"]) == 2  # allowed, but the weights do not fit
    err = capsys.readouterr().err
    assert "another model" in err and "shapes differ" in err and "stem.0.weight" in err

    flipped = tmp_path / "flipped.pt"
    data = bytearray(checkpoints_in(run / "checkpoints")[0].read_bytes())
    data[len(data) // 3] ^= 0x55
    flipped.write_bytes(bytes(data))
    (tmp_path / "flipped.pt.sha256").write_text(
        (checkpoints_in(run / "checkpoints")[0].with_suffix(".pt.sha256")).read_text()
    )
    assert main(["train", *tiny_overrides, f"run.dir={run}", f"resume={flipped}"]) == 2
    assert "corrupt" in capsys.readouterr().err

    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "tensorboard" not in p.parts}
    assert after == before


def test_export_cli_writes_safetensors(tiny_overrides, tmp_path):
    hasten.train(None, [*tiny_overrides, "train.epochs=1", f"run.dir={tmp_path / 'r'}"])
    newest = checkpoints_in(tmp_path / "r" / "checkpoints")[0]
    assert main(["export", str(newest), str(tmp_path / "m.safetensors")]) == 0
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "m.safetensors"))
    model = load_checkpoint(newest)["model"]
    assert exported.keys() == model.keys() and all(torch.equal(exported[k], model[k]) for k in model)


def test_checkpoint_from_elsewhere_without_trainer_state_is_refused(tiny_overrides, tmp_path, capsys):
    plain = save_checkpoint({"model": {"w": torch.zeros(1)}}, tmp_path / "plain.pt")
    assert main(["train", *tiny_overrides, f"resume={plain}"]) == 2
    assert "not a hasten training checkpoint" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run" / "metrics.csv")


# in a child process: every attempt to write, create, rename or remove under FOLDER fails as on a read-only
# file system (chmod alone does not stop root, who runs many CI jobs), then `hasten ARGS`
READ_ONLY_CHILD = """
import errno, os, sys
folder = os.path.realpath(sys.argv[1])
def hook(event, args):
    writing = event == "open" and (
        (isinstance(args[1], str) and any(c in args[1] for c in "wax+"))
        or (args[1] is None and (args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    )
    changing = event in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir", "os.chmod")
    if (writing or changing) and isinstance(args[0], (str, bytes, os.PathLike)):
        if os.path.realpath(os.fsdecode(args[0])).startswith(folder):
            raise PermissionError(errno.EROFS, "Read-only file system", os.fsdecode(args[0]))
sys.addaudithook(hook)
from hasten.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_resume_into_a_read_only_run_folder_is_a_clear_error(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    hasten.train(None, [*tiny_overrides, "train.epochs=1", f"run.dir={run}"])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for path in [run, *run.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        args = ["train", *tiny_overrides, f"run.dir={run}", "resume=auto", "train.threads=1"]
        child = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(run), *args], capture_output=True, text=True)
    finally:
        for path in [run, *run.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert child.returncode == 2, child.stderr
    assert f"run.dir: cannot write to {run}" in child.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def _start_training(args: list[str], run: Path) -> subprocess.Popen:
    """`hasten train ARGS` in a child, checkpointing every step, returned once its loop has taken a step (so its
    signal handlers are in place)."""
    cmd = [
        sys.executable,
        "-m",
        "hasten",
        "train",
        *args,
        f"run.dir={run}",
        "train.threads=1",
        "run.save_every_steps=1",
    ]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not checkpoints_in(run / "checkpoints") and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.02)
    return child


def test_sigint_checkpoints_and_exits_130(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    args = [a for a in tiny_overrides if not a.startswith(("run.dir", "train.epochs"))] + ["train.epochs=200"]
    child = _start_training(args, run)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    err = err.replace("\n", " ")
    assert "stopped: stopped by SIGINT at a step boundary; checkpoint" in err and "error:" not in err
    assert f"resume with: hasten train {args[0]} " in err and err.rstrip().endswith("resume=auto")  # the same command
    assert load_checkpoint(checkpoints_in(run / "checkpoints")[0], require_digest=True)["trainer"]["step"] > 0


def test_a_second_sigint_aborts_at_once(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    # steps of ~1 s on a Xeon with AMX and ~4 s on an AVX2-only CPU, in fp32 (bf16 has no fast kernels on the
    # latter: its steps took ~25 s), so the second SIGINT always lands mid-step
    slow = ["model.width=48", "train.batch_size=256", "data.synthetic_size=1024", "train.epochs=50", "precision=fp32"]
    args = [a for a in tiny_overrides
            if not a.startswith(("run.dir", "train.epochs", "model.width", "train.batch", "precision"))]  # fmt: skip
    child = _start_training([*args, *slow], run)
    child.send_signal(signal.SIGINT)  # asks for a stop at the end of the current (slow) step
    time.sleep(0.1)
    child.send_signal(signal.SIGINT)  # aborts without waiting for it
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "interrupted" in err and "stopped by SIGINT" not in err


def test_a_checkpoint_from_before_the_run_recorded_its_facts_resumes(tiny_overrides, tmp_path, capsys):
    """A run records what its recipe left unset (class names, image size and channels, parameter count; how it ran:
    in memory, the fused kernel). A checkpoint written before that holds null or `auto` there: no change, it resumes;
    a key that changes the run (the width) is still refused."""
    run = tmp_path / "run"
    hasten.train(None, [*tiny_overrides, f"run.dir={run}", "train.epochs=1", "run.tensorboard=false"])
    newest = checkpoints_in(run / "checkpoints")[-1]
    state = load_checkpoint(newest)
    old = json.loads(json.dumps(state["recipe"]))
    old["data"].update(classes=None, size=None, rgb=None, in_memory="auto")
    old["model"]["parameters"], old["optim"]["fused"] = None, "auto"
    for path in checkpoints_in(run / "checkpoints"):
        save_checkpoint(dict(load_checkpoint(path), recipe=old), path)
    resumed = [*tiny_overrides, f"run.dir={run}", "train.epochs=2", "run.tensorboard=false", "resume=auto"]
    assert main(["train", *resumed, "model.width=4"]) == 2
    assert "model.width" in capsys.readouterr().err
    assert main(["train", *resumed]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
