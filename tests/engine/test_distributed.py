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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hasten
from hasten.cli import main
from hasten.engine.distributed import PEER_LOST_EXIT, describe_failures, job_exit_code, recorded_failure
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fault closes its sockets through /proc")
def test_the_failing_rank_is_named_though_the_peer_it_left_ends_first(tmp_path):
    # rank 1 fails, closes its connections on the way out and then takes a minute to end (torch's teardown on a
    # busy machine): rank 0 loses its peer and ends first, torchrun stops rank 1; its record names the cause
    result = run_workers(
        ["train", *BASE, "train.batch_size=16", f"run.dir={tmp_path / 'run'}"],
        {"HASTEN_TEST_FAULT": "raise-slow:1:3"},
        50,
    )
    reported = [line for line in result.stderr.splitlines() if line.startswith("hasten:")]
    expected = "hasten: worker rank 1 failed with exit code 1; rank 0 was stopped with it"
    assert reported == [expected], result.stderr[-3000:]
    assert result.returncode == 1


ABORT, KILL, TERM = -int(signal.SIGABRT), -int(signal.SIGKILL), -int(signal.SIGTERM)
LOST = PEER_LOST_EXIT
RANK1_KILLED = "worker rank 1 was killed by signal 9 (SIGKILL); rank 0 was stopped with it"
ABORTED = "worker rank {} was killed by signal 6 (SIGABRT)"


@pytest.mark.parametrize(
    ("codes", "recorded", "line", "exit_code"),
    [
        # torchrun saw rank 0 die first and stopped rank 1, which had recorded its own failure
        ({0: ABORT, 1: TERM}, {1: (10.0, 1)}, "worker rank 1 failed with exit code 1; rank 0 was stopped with it", 1),
        ({0: LOST, 1: TERM}, {1: (10.0, 2)}, "worker rank 1 failed with exit code 2; rank 0 was stopped with it", 2),
        # no record (killed outright): gloo's abort of the rank left behind is its consequence
        ({0: ABORT, 1: KILL}, {}, RANK1_KILLED, 137),
        ({0: LOST, 1: KILL}, {}, RANK1_KILLED, 137),
        ({0: TERM, 1: 1}, {}, "worker rank 1 failed with exit code 1; rank 0 was stopped with it", 1),
        # an abort with nothing else to explain it is the cause
        ({0: ABORT, 1: TERM}, {}, f"{ABORTED.format(0)}; rank 1 was stopped with it", 134),
        ({0: ABORT, 1: ABORT}, {}, f"{ABORTED.format(0)}; {ABORTED.format(1)}", 134),
        # both failed of their own: the earlier record first, and its code is the job's
        ({0: 2, 1: TERM, 2: TERM}, {0: (12.5, 2), 1: (12.0, 3)},
         "worker rank 1 failed with exit code 3; worker rank 0 failed with exit code 2; rank 2 was stopped with it", 3),
    ],
)  # fmt: skip
def test_the_launcher_names_the_ranks_that_failed_of_their_own(codes, recorded, line, exit_code):
    assert describe_failures(codes, recorded) == line
    assert job_exit_code(codes, recorded) == exit_code


def test_a_worker_records_its_own_failure_where_torchrun_reads_it(tmp_path, monkeypatch, capsys):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["train", "fashion-fast", "optim.lr=banana", f"run.dir={tmp_path / 'run'}"]) == 2
    assert "rank 1: error: " in capsys.readouterr().err
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=TERM, error_file=str(error_file))  # torchrun's reading
    when, code = recorded_failure(failure)
    assert code == 2 and "optim.lr" in failure.message["message"]
    assert abs(when - time.time()) < 600

    error_file.unlink()  # a rank that only lost its peer, or was interrupted, records nothing
    for what, exit_code in ((RuntimeError("gloo: Connection closed by peer [127.0.0.1]:1234"), PEER_LOST_EXIT),
                            (KeyboardInterrupt(), 130)):  # fmt: skip

        def fail(what=what):
            raise what

        monkeypatch.setattr("hasten.machine.current", fail)
        assert main(["train", "fashion-fast", f"run.dir={tmp_path / 'run'}"]) == exit_code
        assert not error_file.exists()
    monkeypatch.undo()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing to tell apart
    assert main(["train", "fashion-fast", "optim.lr=banana", f"run.dir={tmp_path / 'run'}"]) == 2
    assert not error_file.exists()
    assert recorded_failure(ProcessFailure(local_rank=0, pid=1, exitcode=ABORT, error_file=str(error_file))) is None


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


PROBE_RANKS = """
import os, sys
import torch
import torch.distributed as dist
from torch import nn

from hasten.tune import autotune
from hasten.tune.choices import Candidate


def main(rank, init, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    batch = (torch.randn(64, 2, 8, 8), torch.randint(0, 3, (64,)))
    # rank 0 is given a long run (every round), rank 1 a run of one image (it stops after two timed rounds): each
    # times as many steps as its own clock allows, and the ranks meet once, to sum what they timed
    images = 10**9 if rank == 0 else 1
    options = [Candidate("fp32", False), Candidate("fp32", True)]
    choice = autotune.probe(model, (batch[0][:32], batch[1][:32]), 3, options, run_images=images).choice
    seconds, _ = autotune.time_batches(model, batch, 3, options[0], [16, 64], run_images=images)
    with open(os.path.join(out, f"rank-{rank}.txt"), "w") as f:
        f.write(f"{choice} {sorted(seconds)}")
    dist.barrier()  # both done before either tears its group down
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
"""


def test_the_ranks_probe_on_their_own_clocks_and_meet_once(tmp_path):
    """Each rank's start-up probe times as many steps as its own clock allows (rounds cut by the run's length,
    candidates left out after a first round); a step that agreed across ranks (an all-reduce a step) tied their
    step counts together, and ranks that timed different numbers of steps ended the job in a collective mismatch."""
    script = tmp_path / "probe_ranks.py"
    script.write_text(PROBE_RANKS)
    done = subprocess.run([sys.executable, str(script), f"file://{tmp_path / 'rendezvous'}", str(tmp_path)],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    said = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    assert said[0] == said[1] and said[0].endswith(" [16, 64]")  # the same choice on both
