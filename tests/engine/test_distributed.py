"""Data-parallel training in 2 processes (gloo on 127.0.0.1, started through torchrun's launcher): parity with
one process, evaluation over the whole test set, rank-0-only writes, failures that end the job, elastic restart,
an agreed stop on a signal and exact 2-process resume.

Each 2-process run goes through tests/dist_worker.py, which launches itself with hasten.engine.distributed.launch
(as `hasten train --devices 2` does) and injects faults where a test asks; `--devices 2` itself is run once.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hasten
from hasten.cli import main
from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.runfolder.log import RunLog

WORKER = Path(__file__).parents[1] / "dist_worker.py"
TIMEOUT = 180  # seconds: a hung job fails the test instead of the suite

# no batch norm: per-rank batch statistics would differ from one process's (the parity is exact only without)
SEQUENTIAL = "model.layers=[{conv: {out: 8, kernel: 3, padding: 1}}, relu, {maxpool: 2}, flatten, {dense: classes}]"
BASE = [  # over the default recipe (fashion-fast): fp32, a small sequential model, synthetic data
    "precision=fp32",
    "train.channels_last=false",  # fixed: the ranks' probe could choose otherwise than one process's
    "train.tta_translate=0",  # the tests evaluate by hand with a Plan of flips only
    "data.name=synthetic",
    "data.synthetic_size=404",  # a quarter of it is the test set: 101, odd, so the ranks' test splits differ
    "data.subset=192",
    "data.augment.flip=false",
    "data.augment.translate=0",
    "model.name=sequential",
    SEQUENTIAL,
    "train.epochs=2",
    "train.eval_batch_size=32",
    "tricks.ema=0",  # the live weights are evaluated (fashion-fast has an EMA)
    "train.min_steps_per_epoch=0",  # the batch as given, so 2 x B/2 and 1 x B take the same steps
    "optim.name=sgd",
    "optim.lr=0.05",
    "optim.base_batch=32",
    "run.progress=false",
    "run.save_every_steps=1",
    "run.keep=100",
    "train.threads=1",
]
# what exact resume must survive: dropout, mixup, label smoothing, fp16 loss scaling
TRICKY = [
    "model.layers=[{conv: {out: 8, kernel: 3, padding: 1}}, relu, {maxpool: 2}, flatten, {dropout: 0.3}, "
    "{dense: classes}]",
    "tricks.mixup=0.4",
    "tricks.label_smoothing=0.1",
    "precision=fp16",
    "train.batch_size=16",
]


def run_workers(
    args: list[str], env: dict[str, str] | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess:
    """The 2-process job; a job still running after `timeout` seconds (a hang) fails the test."""
    return subprocess.run(
        [sys.executable, str(WORKER), *args],
        env=os.environ | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def step_weights(run: Path) -> dict[int, dict[str, torch.Tensor]]:
    return {int(p.stem.split("-")[1]): load_checkpoint(p)["model"] for p in checkpoints_in(run / "checkpoints")}


def metrics(run: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if "second" not in k} for row in csv.DictReader((run / "metrics.csv").open())]


def test_two_processes_match_one_step_for_step_and_only_rank_0_writes(tmp_path):
    one, two, audit = tmp_path / "one", tmp_path / "two", tmp_path / "audit"
    audit.mkdir()
    hasten.train(None, [*BASE, "train.batch_size=32", f"run.dir={one}"])
    result = run_workers(["train", *BASE, "train.batch_size=16", f"run.dir={two}"], {"HASTEN_TEST_AUDIT": str(audit)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global batch 32 (16 x 1 accumulated x 2 process(es)); peak LR 0.05" in result.stderr

    # B/2 in each of 2 processes = B in one: the same weights after every optimizer step
    a, b = step_weights(one), step_weights(two)
    assert sorted(a) == sorted(b) == list(range(1, 13))  # 192 images / 32 per step x 2 epochs
    for step in a:
        for key in a[step]:
            torch.testing.assert_close(b[step][key], a[step][key], rtol=1e-5, atol=1e-6, msg=f"step {step} {key}")
    for row_a, row_b in zip(metrics(one), metrics(two), strict=True):
        assert row_a["step"] == row_b["step"]
        assert float(row_a["train_loss"]) == pytest.approx(float(row_b["train_loss"]), rel=1e-5)
        assert float(row_a["test_accuracy"]) == pytest.approx(float(row_b["test_accuracy"]), abs=1 / 101 + 1e-9)

    # the accuracy the 2 processes reported is the one-process accuracy of their final weights on all 101 images
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 32
    parts = build(load_recipe(None, [*BASE, "train.batch_size=32", f"run.dir={tmp_path / 'eval'}"]))
    parts.model.load_state_dict(b[12])
    assert len(parts.test_loader.indices(0)) == 101
    plan = Plan(2, 10, tta_flip=False)  # as fashion-fast evaluates synthetic gratings (mirror-sensitive: no flip TTA)
    trainer = trainer_for(parts, plan, RunLog(tmp_path, enabled=False))
    loss, accuracy = trainer.evaluate()
    assert summary["test_accuracy"] == accuracy
    assert summary["test_loss"] == pytest.approx(loss, rel=1e-6)

    # only rank 0 wrote into the run folder; rank 1 wrote nothing anywhere in it
    def inside(rank: int) -> list[str]:
        paths = (audit / f"rank-{rank}.txt").read_text().split()
        return [p for p in paths if Path(p).resolve().is_relative_to(two.resolve())]

    assert any(p.endswith("summary.json") for p in inside(0)) and any(".pt" in p for p in inside(0))
    assert inside(1) == []


def test_a_failing_rank_ends_the_job_non_zero_naming_it(tmp_path):
    # torchrun must stop rank 0 (which waits in a collective) instead of letting it hang: within 90 s
    result = run_workers(
        ["train", *BASE, "train.batch_size=16", f"run.dir={tmp_path / 'run'}"], {"HASTEN_TEST_FAULT": "raise:1:3"}, 90
    )
    assert result.returncode != 0
    assert "injected failure on rank 1 at step 3" in result.stderr
    assert "worker rank 1 failed with exit code 1" in result.stderr


def test_devices_2_from_the_cli_and_a_recipe_error_in_the_workers(tmp_path):
    run = tmp_path / "run"
    args = ["train", "--devices", "2", *BASE, "train.batch_size=16", f"run.dir={run}"]
    done = subprocess.run([sys.executable, "-m", "hasten", *args], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count('"test_accuracy"') == 1  # rank 0 alone prints the results
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2

    bad = [a.replace("model.name=sequential", "model.name=resnet") for a in args if not a.startswith("model.layers")]
    failed = subprocess.run(
        [sys.executable, "-m", "hasten", *bad, "train.sync_batchnorm=true", f"run.dir={tmp_path / 'bn'}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert failed.returncode == 2
    # both ranks fail alike; whichever exits first, torchrun stops the other, which may not get to say it
    assert re.search(r"rank [01]: error: train.sync_batchnorm: torch's SyncBatchNorm runs on GPUs only", failed.stderr)


AUX_NET = """
from torch import nn


class AuxNet(nn.Module):
    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                  nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.aux = nn.Linear(32, num_classes)

    def forward(self, x):
        features = self.body(x)
        return (self.fc(features), self.aux(features)) if self.training else self.fc(features)
"""


def test_a_users_model_whose_loss_leaves_parameters_out_trains_in_two_processes(tmp_path):
    # (logits, aux_logits) in training: the auxiliary head gets no gradient, which DDP refuses at the second step
    # unless told to look for unused parameters (a traceback from torch, before hasten passed find_unused)
    (tmp_path / "auxnet.py").write_text(AUX_NET)
    base = [a for a in BASE if not a.startswith(("model.", "run.save_every_steps", "run.keep"))]
    args = ["train", "--devices", "2", *base, "model.name=import", "model.target=auxnet:AuxNet",
            "train.batch_size=16", f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "hasten", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 2
    assert any("(aux.weight, aux.bias)" in text for text in summary["warnings"])  # named, not a failure


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The reference: 2 processes with dropout, mixup, label smoothing and fp16, never stopped."""
    run = tmp_path_factory.mktemp("reference") / "run"
    result = run_workers(["train", *BASE, *TRICKY, f"run.dir={run}"])
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def assert_same_run(run: Path, reference: Path) -> None:
    """Bitwise the same weights at every step both kept, and the same metrics.csv, timings aside."""
    mine, theirs = step_weights(run), step_weights(reference)
    assert max(mine) == max(theirs) == 12
    for step in mine:
        assert all(torch.equal(mine[step][k], theirs[step][k]) for k in theirs[step]), f"step {step} differs"
    assert metrics(run) == metrics(reference)


def test_elastic_restart_finishes_like_an_uninterrupted_run(tmp_path, uninterrupted):
    run = tmp_path / "run"
    fault = {"HASTEN_TEST_FAULT": "raise:1:5", "HASTEN_TEST_RESTARTS": "1"}  # step 5: mid-epoch (6 per epoch)
    result = run_workers(["train", *BASE, *TRICKY, f"run.dir={run}"], fault)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "injected failure on rank 1 at step 5" in result.stderr  # it did fail once, and was restarted
    assert "resuming from" in result.stderr
    assert_same_run(run, uninterrupted)


def test_a_signal_to_one_rank_stops_all_and_resume_is_exact(tmp_path, uninterrupted, capsys):
    run = tmp_path / "run"
    args = ["train", *BASE, *TRICKY, f"run.dir={run}"]
    stopped = run_workers(args, {"HASTEN_TEST_FAULT": "sigterm:1:3"}, 90)  # after rank 1's 3rd step; no hang
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    saved = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    # both ranks agreed at the next step boundary: step 4, mid-epoch (6 steps per epoch)
    assert saved["trainer"]["step"] == 4 and saved["trainer"]["batch"] == 4
    assert len(saved["ranks"]) == 2 and not torch.equal(
        saved["ranks"][0]["rng"]["torch"], saved["ranks"][1]["rng"]["torch"]
    )

    resumed = run_workers([*args, "resume=auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run, uninterrupted)

    # that mid-epoch checkpoint cannot be resumed by a different number of processes: its shards would change
    middle = run / "checkpoints" / "step-5.pt"
    code = main(["train", *BASE, *TRICKY, f"run.dir={tmp_path / 'one'}", f"resume={middle}"])
    assert code == 2
    assert (
        "written mid-epoch by 2 process(es) and this run has 1: resume it with --devices 2" in capsys.readouterr().err
    )
    assert not (tmp_path / "one" / "checkpoints").exists() and not (tmp_path / "one" / "recipe.yaml").exists()
