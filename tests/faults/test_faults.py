"""The fault table: each row is one hostile-user scenario, run through `hasten` in-process, with what must happen:
exit 2 with a message naming the key or file and nothing written, or a run that keeps every file it had. Rows
are grouped: run folders, resume, input errors, then trust (a file from elsewhere names code to run), overwrite
(commands that write), resources (sizes, processes, downloads), tracebacks (inputs that once ended in one) and
messages (what the error says). Then a fuzz test of the checkpoint loader over a few hundred malformed files."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

import hasten
import hasten.files
import hasten.machine
import hasten.run.build
import hasten.runfolder.checkpoint
from hasten.cli import main
from hasten.errors import CheckpointError
from hasten.recipe.schema import MAX_YAML_NODES, load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint, read_weights, save_checkpoint
from hasten.runfolder.folder import LOCK_NAME, RESULTS_MARK
from hasten.runfolder.log import RunLog
from tests.tiny import TINY_GAN_OVERRIDES, TINY_OVERRIDES

TINY = [  # the shared tiny recipe (tests/tiny.py), smaller still: 48 training images, one residual block
    *TINY_OVERRIDES,
    "data.synthetic_size=64",
    "model.width=4",
    "model.blocks=[1]",
    # fixed, not the default recipe's `auto`: what the probe picks differs between CPUs (fp32 on an AVX2-only
    # machine, bf16 with AVX512-BF16 or AMX), and rows below name the precision the run was trained in
    "precision=bf16",
    "train.channels_last=false",
    "train.eval_batch_size=64",
    "train.threads=1",
    "run.tensorboard=false",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-epoch run (4 steps an epoch), copied by the rows that need one."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", *TINY, f"run.dir={folder}"]) == 0
    return folder


@dataclass
class Ctx:
    tmp: Path
    finished: Path
    capsys: pytest.CaptureFixture
    monkeypatch: pytest.MonkeyPatch

    def hasten(self, *args: str) -> tuple[int, str]:
        """Exit code and stderr of `hasten ARGS`, run in this process."""
        self.capsys.readouterr()
        code = main(list(args))
        return code, self.capsys.readouterr().err

    def train(self, run: Path, *args: str) -> tuple[int, str]:
        return self.hasten("train", *TINY, f"run.dir={run}", *args)

    def copy_of_finished(self) -> Path:
        run = self.tmp / "copy"
        shutil.copytree(self.finished, run)
        return run

    def file(self, name: str, data: bytes) -> Path:
        path = self.tmp / name
        path.write_bytes(data)
        return path


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def digests(folder: Path) -> dict[Path, str]:
    """SHA-256 of every file under `folder`: what a row asserts did not change."""
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def expect_refusal(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# ----- run folders: one owner -----


def fresh_run_into_another_runs_folder(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = snapshot(run)
    code, err = c.train(run, "seed=1")
    expect_refusal(code, err, "another run's files", "resume=auto", "run.dir", "run.overwrite=true")
    assert snapshot(run) == before


def overwrite_moves_the_old_run_aside(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = snapshot(run)
    code, err = c.train(run, "seed=1", "train.epochs=1", "run.overwrite=true")
    assert code == 0, err
    (aside,) = run.glob("replaced-*")
    for path, data in before.items():  # every old file kept, byte for byte, under the dated folder
        assert (aside / path.relative_to(run)).read_bytes() == data
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1


def two_runs_on_one_folder_at_once(c: Ctx) -> None:
    run = c.tmp / "busy"
    run.mkdir()
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "started": "then"}  # a live process
    (run / LOCK_NAME).write_text(json.dumps(holder))
    code, err = c.train(run)
    expect_refusal(code, err, "in use by another run", f"pid {os.getppid()}")
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]


def stale_lock_of_a_killed_run_is_taken_over(c: Ctx) -> None:
    run = c.tmp / "stale"
    run.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (run / LOCK_NAME).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname()}))
    code, err = c.train(run, "train.epochs=1")
    assert code == 0, err
    assert "stale lock" in err and not (run / LOCK_NAME).exists()


def default_run_dir_includes_other_data(c: Ctx) -> None:
    assert hasten.run.resolve.run_dir(load_recipe("fashion-fast")) == Path("runs/fashion-fast")
    assert hasten.run.resolve.run_dir(load_recipe("fashion-fast", ["data.name=digits"])) == Path(
        "runs/fashion-fast-digits"
    )
    assert hasten.run.resolve.run_dir(load_recipe("fashion-fast", ["data.name=digits", "run.dir=x"])) == Path("x")


def name_cannot_leave_runs(c: Ctx) -> None:
    for command, recipe in (("train", TINY), ("gan", TINY_GAN_OVERRIDES)):  # hasten gan keeps the same rule
        for name in ("../../x", "a/b", ".."):
            code, err = c.hasten(command, *recipe, f"name={name}")
            expect_refusal(code, err, "name:", "runs/<name>")
        # a recipe file's name is the run's: one with control characters is refused, shown escaped
        odd = c.file("esc\x1b[2J.yaml", b"seed: 0\n")
        c.monkeypatch.chdir(c.tmp)
        code, err = c.hasten(command, str(odd), *recipe)
        expect_refusal(code, err, "name: 'esc\\x1b[2J' must be a plain folder name, without control characters")
        shown_as_text(err)
        assert not (c.tmp / "runs").exists()


# ----- resume continues the same run -----


def resume_with_a_changed_recipe(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = snapshot(run)
    code, err = c.train(run, "resume=auto", "optim.lr=0.5", "train.batch_size=8", "train.epochs=3")
    expect_refusal(code, err, "optim.lr", "train.batch_size", "resume.allow_changes=[optim.lr,train.batch_size]")
    assert "train.epochs" not in err  # extending the run is allowed
    assert snapshot(run) == before


def resume_with_allowed_changes(c: Ctx) -> None:
    run = c.copy_of_finished()
    resumed = checkpoints_in(run / "checkpoints")[0]
    code, err = c.train(run, "resume=auto", "optim.lr=0.5", "train.epochs=4", "resume.allow_changes=[optim.lr]")
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["epochs"] == 4
    assert resumed.is_file(), "the checkpoint the changed run began from is kept, not pruned"


def resume_auto_after_a_stop_past_the_last_checkpoint_writes_the_summary(c: Ctx) -> None:
    run = c.copy_of_finished()
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()  # killed after the last checkpoint, before the summary
    code, err = c.train(run, "resume=auto")
    assert code == 0, err
    again = json.loads((run / "summary.json").read_text())
    assert again["test_accuracy"] == summary["test_accuracy"] and again["epochs"] == 2


def sigterm_during_the_final_evaluation_still_ends_with_a_summary(c: Ctx) -> None:
    evaluate = Trainer.evaluate

    def signalled(self: Trainer, live: bool = False) -> tuple[float, float]:
        if self.state.epoch == self.plan.epochs:  # the final evaluation
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self, live)

    c.monkeypatch.setattr(Trainer, "evaluate", signalled)
    code, err = c.train(c.tmp / "run")
    assert code == 0, err
    assert json.loads((c.tmp / "run" / "summary.json").read_text())["epochs"] == 2


def sigterm_after_the_summary_exits_0(c: Ctx) -> None:
    def then_signal(model: torch.nn.Module, folder: Path) -> None:  # after fit() wrote summary.json
        os.kill(os.getpid(), signal.SIGTERM)

    c.monkeypatch.setattr(hasten.run.build, "save_weights", then_signal)
    code, err = c.train(c.tmp / "run", "run.save_weights=true")
    assert code == 0, err
    assert (c.tmp / "run" / "summary.json").is_file()


def resume_with_another_precision(c: Ctx) -> None:
    run = c.copy_of_finished()  # trained in bf16 (TINY fixes it)
    code, err = c.train(run, "resume=auto", "precision=fp16-master", "train.epochs=3")
    expect_refusal(code, err, "precision: 'bf16' -> 'fp16-master'")
    allowed = "resume.allow_changes=[precision]"
    code, err = c.train(run, "resume=auto", "precision=fp16-master", "train.epochs=3", allowed)
    expect_refusal(code, err, "trained with precision=bf16", "resume with precision=bf16")


def failed_resume_writes_nothing(c: Ctx) -> None:
    bad = c.file("bad.pt", b"not a checkpoint")
    run = c.tmp / "new"
    code, err = c.hasten("train", *TINY, "run.tensorboard=true", f"run.dir={run}", f"resume={bad}")
    expect_refusal(code, err, "bad.pt")
    assert not run.exists() or not any(run.iterdir())  # no TensorBoard events, no lock left


def temporaries_of_a_killed_save_go_on_resume(c: Ctx) -> None:
    run = c.copy_of_finished()
    tmp = run / "checkpoints" / ".step-9.pt.12345.tmp"
    tmp.write_bytes(b"half a checkpoint")
    code, err = c.train(run, "resume=auto", "train.epochs=3")
    assert code == 0, err
    assert not tmp.exists()


def skipped_checkpoint_is_a_plain_note(c: Ctx) -> None:
    run = c.copy_of_finished()
    newest = checkpoints_in(run / "checkpoints")[0]
    newest.with_name(newest.name + ".sha256").unlink()
    code, err = c.train(run, "resume=auto", "train.epochs=3")
    assert code == 0, err
    assert f"warning: skipping checkpoint {newest}" in err and "UserWarning" not in err


def unreadable_metrics_csv_on_resume(c: Ctx) -> None:
    for kind in ("latin-1", "folder"):
        run = c.copy_of_finished()
        metrics = run / "metrics.csv"
        metrics.unlink()
        if kind == "folder":
            metrics.mkdir()
        else:
            metrics.write_bytes("epoch,step\n1,caf\xe9\n".encode("latin-1"))
        before = snapshot(run)
        code, err = c.train(run, "resume=auto", "train.epochs=3")
        expect_refusal(code, err, "metrics.csv")
        assert snapshot(run) == before
        shutil.rmtree(run)


# ----- input errors: exit 2 naming the key or file -----


def binary_recipe_file(c: Ctx) -> None:
    code, err = c.hasten("train", str(c.file("r.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")))
    expect_refusal(code, err, "r.yaml", "binary")


def non_utf8_recipe_file(c: Ctx) -> None:
    code, err = c.hasten("train", str(c.file("r.yaml", "name: caf\xe9\n".encode("latin-1"))))
    expect_refusal(code, err, "r.yaml", "UTF-8")


def yaml_alias_bomb(c: Ctx) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("sweep:\n  vary: *i")
    code, err = c.hasten("train", str(c.file("bomb.yaml", "\n".join(lines).encode())))
    expect_refusal(code, err, "bomb.yaml", f"{MAX_YAML_NODES:,}")
    assert len(err) < 2000


def recursive_and_deep_yaml(c: Ctx) -> None:
    code, err = c.hasten("train", str(c.file("loop.yaml", b"sweep: &s {vary: [*s]}\n")))
    expect_refusal(code, err, "loop.yaml", "recursive")
    code, err = c.hasten("train", str(c.file("deep.yaml", b"a: " + b"[" * 50_000 + b"]" * 50_000 + b"\n")))
    expect_refusal(code, err, "deep.yaml")


def out_of_range_seeds(c: Ctx) -> None:
    for seed in ("99999999999999999999", "-1"):
        code, err = c.hasten("train", *TINY, f"seed={seed}", f"run.dir={c.tmp / 'never'}")
        expect_refusal(code, err, "seed")
    assert not (c.tmp / "never").exists()


def unusable_devices(c: Ctx) -> None:
    code, err = c.hasten("train", *TINY, "device=cuda:abc")
    expect_refusal(code, err, "device: 'cuda:abc'")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:99"):
            code, err = c.hasten("train", *TINY, f"device={device}", f"run.dir={c.tmp / 'never'}")
            expect_refusal(code, err, f"device: {device} asked for", "no CUDA", "available here: auto, cpu")
        c.monkeypatch.setenv("HASTEN_MACHINE", "cuda")  # a profile's GPU is described, not made
        code, err = c.hasten("train", *TINY, "device=cuda", f"run.dir={c.tmp / 'never'}")
        expect_refusal(code, err, "no CUDA device", "HASTEN_MACHINE=cuda describes one", "available here: auto, cpu")
        c.monkeypatch.delenv("HASTEN_MACHINE")
        hasten.machine.current()  # gathered (and cached) while torch still says there is no GPU
        c.monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with two GPUs, as far as
        c.monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the device check can tell
    count = torch.cuda.device_count()
    code, err = c.hasten("train", *TINY, f"device=cuda:{count}", f"run.dir={c.tmp / 'never'}")
    expect_refusal(code, err, f"device: cuda:{count}: this machine has {count} CUDA device(s)",
                   "available here: auto, cpu, cuda, cuda:0")  # fmt: skip
    assert not (c.tmp / "never" / "recipe.yaml").exists()


def unreadable_data_folder(c: Ctx) -> None:
    def denied(*args: object, **kwargs: object) -> None:  # tests run as root here: chmod 000 would not stop them
        raise PermissionError(errno.EACCES, "Permission denied", "/data/fashion/train-images-idx3-ubyte.gz")

    c.monkeypatch.setattr(hasten.run.build, "load_dataset", denied)
    code, err = c.train(c.tmp / "never")
    expect_refusal(code, err, "cannot read /data/fashion/train-images-idx3-ubyte.gz", "Permission denied")
    assert not (c.tmp / "never").exists()


def data_command_on_an_unreadable_folder(c: Ctx) -> None:
    import hasten.data

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/data/fashion")

    c.monkeypatch.setattr(hasten.data, "info", denied)
    code, err = c.hasten("data", "info", "fashion-mnist")
    expect_refusal(code, err, "/data/fashion: Permission denied")


def text_file_named_png_in_val(c: Ctx) -> None:
    root = c.tmp / "folder"
    for split, cls in (("train", "a"), ("train", "b"), ("val", "a"), ("val", "b")):
        (root / split / cls).mkdir(parents=True)
        Image.new("L", (8, 8), 128).save(root / split / cls / "0.png")
    (root / "val" / "b" / "notes.png").write_text("not an image")
    code, err = c.hasten(
        "train", *TINY, "data.name=imagefolder", f"data.root={root}", "data.workers=0", f"run.dir={c.tmp / 'r'}"
    )
    expect_refusal(code, err, "notes.png", "cannot decode")
    assert not (c.tmp / "r" / "metrics.csv").exists()


def export_of_a_text_file(c: Ctx) -> None:
    code, err = c.hasten("export", str(c.file("x.pt", b"hello\n")), str(c.tmp / "x.safetensors"))
    expect_refusal(code, err, "x.pt", "not a PyTorch zip file")  # hasten export reads sources through inference.py


def resume_from_a_digest_sidecar(c: Ctx) -> None:
    sidecar = next((c.finished / "checkpoints").glob("*.sha256"))
    code, err = c.train(c.tmp / "r", f"resume={sidecar}")
    expect_refusal(code, err, sidecar.name, "digest sidecar")


def resume_from_files_that_are_not_checkpoints(c: Ctx) -> None:
    import gzip

    for name, data in (("r.yaml", b"a: 1\n"), ("p.png", b"\x89PNG\r\n\x1a\n"), ("d.gz", gzip.compress(b"x"))):
        code, err = c.train(c.tmp / "r", f"resume={c.file(name, data)}")
        expect_refusal(code, err, name, "not a PyTorch checkpoint")
        assert "weights-only" not in err  # not described as if it were malicious


def non_utf8_sidecar(c: Ctx) -> None:
    run = c.copy_of_finished()
    newest = checkpoints_in(run / "checkpoints")[0]
    newest.with_name(newest.name + ".sha256").write_bytes(b"\xff\xfe\x00garbage")
    code, err = c.train(run, f"resume={newest}", "train.epochs=3")
    expect_refusal(code, err, newest.name, "not text")


def unreadable_checkpoint_with_a_sidecar(c: Ctx) -> None:
    newest = checkpoints_in(c.finished / "checkpoints")[0]

    def denied(path: Path) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    c.monkeypatch.setattr(hasten.runfolder.checkpoint, "sha256_file", denied)
    code, err = c.train(c.tmp / "r", f"resume={newest}", "train.epochs=3")
    expect_refusal(code, err, newest.name, "Permission denied")


def full_disk_while_checkpointing(c: Ctx) -> None:
    save, calls = torch.save, []

    def zip_writer_fails(obj: object, f: object) -> None:  # torch's zip writer raises RuntimeError, not OSError
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")
        save(obj, f)

    c.monkeypatch.setattr(hasten.runfolder.checkpoint.torch, "save", zip_writer_fails)
    run = c.tmp / "run"
    code, err = c.train(run, "run.save_every_steps=1")
    expect_refusal(code, err, "cannot write checkpoint", "needs about", "MiB free in", "earlier checkpoints are kept")
    kept = checkpoints_in(run / "checkpoints")
    assert [p.name for p in kept] == ["step-2.pt", "step-1.pt"]
    assert load_checkpoint(kept[0], require_digest=True)["trainer"]["step"] == 2
    assert not list((run / "checkpoints").glob(".*.tmp"))


def full_disk_while_logging(c: Ctx) -> None:
    import builtins

    def no_space(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:  # summary.json's write
        if Path(str(file)).name.startswith(".summary.json.") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return builtins.open(file, mode, *args, **kwargs)

    c.monkeypatch.setattr(hasten.files, "open", no_space, raising=False)  # what hasten.files' atomic write opens
    run = c.tmp / "run"
    code, err = c.train(run)
    expect_refusal(code, err, "summary.json", "No space left on device", "needs about")
    assert load_checkpoint(checkpoints_in(run / "checkpoints")[0], require_digest=True)["trainer"]["epoch"] == 2


def export_into_a_read_only_folder(c: Ctx) -> None:
    import errno

    import hasten.use.export

    def read_only(*args: object, **kwargs: object) -> None:  # what the write meets there (root ignores chmod)
        raise OSError(errno.EROFS, "Read-only file system")

    c.monkeypatch.setattr(hasten.use.export, "write_atomic_bytes", read_only)
    newest = checkpoints_in(c.finished / "checkpoints")[0]
    for out in ("w.safetensors", "w.onnx"):
        code, err = c.hasten("export", str(newest), str(c.tmp / "ro" / out))
        expect_refusal(code, err, "cannot write", out, "Read-only file system")


def bare_hasten(c: Ctx) -> None:
    code, err = c.hasten()
    expect_refusal(code, err, "give a COMMAND", "train")
    assert "rest" not in err


FAULTS: list[Callable[[Ctx], None]] = [
    fresh_run_into_another_runs_folder,
    overwrite_moves_the_old_run_aside,
    two_runs_on_one_folder_at_once,
    stale_lock_of_a_killed_run_is_taken_over,
    default_run_dir_includes_other_data,
    name_cannot_leave_runs,
    resume_with_a_changed_recipe,
    resume_with_allowed_changes,
    resume_auto_after_a_stop_past_the_last_checkpoint_writes_the_summary,
    sigterm_during_the_final_evaluation_still_ends_with_a_summary,
    sigterm_after_the_summary_exits_0,
    resume_with_another_precision,
    failed_resume_writes_nothing,
    temporaries_of_a_killed_save_go_on_resume,
    skipped_checkpoint_is_a_plain_note,
    unreadable_metrics_csv_on_resume,
    binary_recipe_file,
    non_utf8_recipe_file,
    yaml_alias_bomb,
    recursive_and_deep_yaml,
    out_of_range_seeds,
    unusable_devices,
    unreadable_data_folder,
    data_command_on_an_unreadable_folder,
    text_file_named_png_in_val,
    export_of_a_text_file,
    resume_from_a_digest_sidecar,
    resume_from_files_that_are_not_checkpoints,
    non_utf8_sidecar,
    unreadable_checkpoint_with_a_sidecar,
    full_disk_while_checkpointing,
    full_disk_while_logging,
    export_into_a_read_only_folder,
    bare_hasten,
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__ for f in FAULTS])
def test_fault(fault, finished, tmp_path, capsys, monkeypatch):
    fault(Ctx(tmp_path, finished, capsys, monkeypatch))


# ----- trust: a run folder, checkpoint or export is data; nothing it names is imported -----

PAYLOAD = """
import pathlib
MARKER = pathlib.Path({marker!r})
MARKER.write_text("imported")


def make(num_classes=10, in_channels=1, image_size=None, **kwargs):
    MARKER.write_text("called")
    from hasten.models import ResNet

    return ResNet(in_channels, num_classes, width=4, blocks=[1])


def data(**kwargs):
    MARKER.write_text("called")
    raise SystemExit("the payload ran")
"""


@pytest.fixture
def payload(tmp_path, monkeypatch) -> Path:
    """`evilmod.py` in a folder on sys.path and the current folder: importing it or calling make/data writes
    the marker file returned (which must not exist)."""
    folder = tmp_path / "pkg"
    folder.mkdir()
    marker = tmp_path / "marker"
    (folder / "evilmod.py").write_text(PAYLOAD.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    sys.modules.pop("evilmod", None)
    yield marker
    sys.modules.pop("evilmod", None)


def naming_the_payload(c: Ctx, model: bool = True, data: bool = False) -> Path:
    """A copy of the finished run whose checkpoints' recipe names evilmod (model.target, data.target); with
    data, summary.json says other data, so the run's facts must come from its data.target."""
    run = c.copy_of_finished()
    for path in checkpoints_in(run / "checkpoints"):
        state = load_checkpoint(path)
        recipe = state["recipe"]
        if model:
            recipe["model"] |= {"name": "import", "target": "evilmod:make", "args": {}}
        if data:
            recipe["data"] |= {"name": "import", "target": "evilmod:data", "args": {}}
        save_checkpoint(state, path)
    if data:
        summary = json.loads((run / "summary.json").read_text())
        summary["dataset"]["name"] = "someone-else"
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def picture(c: Ctx) -> Path:
    path = c.tmp / "shoe.png"
    Image.new("L", (8, 8), 200).save(path)
    return path


def expect_untrusted(code: int, err: str, marker: Path, target: str = "evilmod:make") -> None:
    expect_refusal(code, err, target, "--trust-code")
    assert not marker.exists(), "the payload ran"


def trust_every_command_refuses_a_model_target(c: Ctx, marker: Path) -> None:
    run = naming_the_payload(c)
    before = digests(run)
    for command in (
        ["evaluate", str(run)],
        ["evaluate", str(run / "checkpoints" / "step-8.pt"), "--out", str(c.tmp / "ev")],
        ["predict", str(run), str(picture(c))],
        ["export", str(run), str(c.tmp / "out.safetensors")],
        ["export", str(run), str(c.tmp / "out.onnx")],
    ):
        code, err = c.hasten(*command)
        expect_untrusted(code, err, marker)
    assert not (c.tmp / "out.safetensors").exists() and not (c.tmp / "out.onnx").exists()
    assert not (c.tmp / "ev").exists() and not (run / "evaluation").exists()
    assert digests(run) == before


def trust_python_load_refuses_unless_trusted(c: Ctx, marker: Path) -> None:
    from hasten.recipe.trust import UntrustedCode

    run = naming_the_payload(c)
    with pytest.raises(UntrustedCode, match=r"evilmod:make.*trust_code=True"):
        hasten.load(run)
    assert not marker.exists()

    def mine(num_classes: int, in_channels: int) -> torch.nn.Module:  # the user's own model: no import at all
        from hasten.models import ResNet

        return ResNet(in_channels, num_classes, width=4, blocks=[1])

    assert hasten.load(run, model=mine).predict([picture(c)])[0].label
    assert not marker.exists()
    assert hasten.load(run, trust_code=True).predict([picture(c)])[0].label
    assert marker.read_text() == "called"


def trust_flag_and_naming_the_target_let_it_run(c: Ctx, marker: Path) -> None:
    run = naming_the_payload(c)
    code, err = c.hasten("predict", str(run), str(picture(c)), "--trust-code")
    assert code == 0, err
    assert marker.exists()
    marker.unlink()
    code, err = c.hasten("evaluate", str(run), "model.target=evilmod:make", "--out", str(c.tmp / "ev"))
    assert code == 0, err
    assert marker.exists() and (c.tmp / "ev" / "evaluation.json").is_file()
    code, err = c.hasten("evaluate", str(run), "model.target=othermod:make")
    expect_refusal(code, err, "model.target=othermod:make", "same target")
    marker.unlink()
    # predict and export take the model's import path as the user names it (the refusal says how)
    code, err = c.hasten("predict", str(run), str(picture(c)))
    expect_refusal(code, err, "hasten predict SOURCE IMAGE --model evilmod:make", "hasten export SOURCE OUT --model")
    assert not marker.exists()
    code, err = c.hasten("predict", str(run), str(picture(c)), "--model", "evilmod:make", "--csv")
    assert code == 0 and marker.read_text() == "called", err
    marker.unlink()
    code, err = c.hasten("export", str(run), str(c.tmp / "named.safetensors"), "--model", "evilmod:make")
    assert code == 0 and marker.exists() and (c.tmp / "named.safetensors").is_file(), err
    marker.unlink()
    assert hasten.load(run, model="evilmod:make").predict([picture(c)])[0].label and marker.exists()


def trust_a_data_target_is_not_imported_either(c: Ctx, marker: Path) -> None:
    run = naming_the_payload(c, model=False, data=True)
    before = digests(run)
    for command in (["evaluate", str(run)], ["predict", str(run), str(picture(c))],
                    ["export", str(run), str(c.tmp / "out.safetensors")]):  # fmt: skip
        code, err = c.hasten(*command)
        expect_untrusted(code, err, marker, "data.target=evilmod:data")
    assert digests(run) == before


def trust_predict_and_export_read_the_summary_not_the_data_target(c: Ctx, marker: Path) -> None:
    """A run trained on data by data.target (its summary: the own data's preprocessing) predicts and exports from
    what summary.json records: nothing imported; evaluating on its own data still needs the data, refused."""
    run = naming_the_payload(c, model=False, data=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["dataset"]["name"] = "own"
    (run / "summary.json").write_text(json.dumps(summary))
    for command in (["predict", str(run), str(picture(c))], ["export", str(run), str(c.tmp / "out.safetensors")]):
        code, err = c.hasten(*command)
        assert code == 0, err
        assert not marker.exists(), "the payload ran"
    code, err = c.hasten("evaluate", str(run))
    expect_untrusted(code, err, marker, "data.target=evilmod:data")


def trust_resume_never_runs_the_checkpoint_s_target(c: Ctx, marker: Path) -> None:
    run = naming_the_payload(c)
    before = digests(run)
    code, err = c.train(run, "resume=auto", "train.epochs=3")
    expect_refusal(code, err, "model.name: 'import' -> 'resnet'")  # the checkpoint's recipe is compared, not run
    assert not marker.exists() and digests(run) == before
    code, err = c.train(c.tmp / "other", f"resume={checkpoints_in(run / 'checkpoints')[0]}", "train.epochs=3",
                        "resume.allow_changes=[model]")  # fmt: skip
    assert code == 0, err  # the user's own recipe builds the model; the weights fit it
    assert not marker.exists()


def trust_an_export_that_names_a_target(c: Ctx, marker: Path) -> None:
    from safetensors.torch import load_file, save_file

    export = c.tmp / "model.safetensors"
    code, err = c.hasten("export", str(c.finished), str(export))
    assert code == 0, err
    from safetensors import safe_open

    with safe_open(str(export), framework="pt") as f:
        meta = f.metadata()
    recipe = json.loads(meta["hasten_recipe"])
    recipe["model"] |= {"name": "import", "target": "evilmod:make", "args": {}}
    meta["hasten_recipe"] = json.dumps(recipe)
    save_file(load_file(str(export)), str(export), metadata=meta)
    image = picture(c)
    before = digests(c.tmp)
    for command in (["predict", str(export), str(image)], ["export", str(export), str(c.tmp / "again.onnx")]):
        code, err = c.hasten(*command)
        expect_untrusted(code, err, marker)
    with pytest.raises(hasten.recipe.trust.UntrustedCode):
        hasten.load(export)
    assert not marker.exists() and digests(c.tmp) == before


def trust_a_gan_classifier_file(c: Ctx, marker: Path) -> None:
    run = naming_the_payload(c)
    classifier = checkpoints_in(run / "checkpoints")[0]
    code, err = c.hasten("gan", "data.name=synthetic", "data.synthetic_size=64", "model.latent=8", "model.width=4",
                         "train.batch_size=16", "train.threads=1", "run.progress=false", "run.tensorboard=false",
                         f"quality.classifier={classifier}", f"run.dir={c.tmp / 'gan'}")  # fmt: skip
    expect_untrusted(code, err, marker)


TRUST: list[Callable[[Ctx, Path], None]] = [
    trust_every_command_refuses_a_model_target,
    trust_python_load_refuses_unless_trusted,
    trust_flag_and_naming_the_target_let_it_run,
    trust_a_data_target_is_not_imported_either,
    trust_predict_and_export_read_the_summary_not_the_data_target,
    trust_resume_never_runs_the_checkpoint_s_target,
    trust_an_export_that_names_a_target,
    trust_a_gan_classifier_file,
]


@pytest.mark.parametrize("row", TRUST, ids=[f.__name__ for f in TRUST])
def test_trust(row, finished, tmp_path, capsys, monkeypatch, payload):
    row(Ctx(tmp_path, finished, capsys, monkeypatch), payload)


# ----- overwrite: every command that writes keeps what the user had -----


def gan_into_a_finished_runs_folder(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = digests(run)
    code, err = c.hasten("gan", *TINY_GAN_OVERRIDES, f"run.dir={run}")
    expect_refusal(code, err, "another run's files", "summary.json", "run.overwrite=true")
    assert digests(run) == before
    code, err = c.hasten("gan", *TINY_GAN_OVERRIDES, f"run.dir={run}", "run.overwrite=true")
    assert code == 0, err
    (aside,) = run.glob("replaced-*")
    assert {p.relative_to(aside): h for p, h in digests(aside).items()} == {
        p.relative_to(run): h for p, h in before.items()
    }


def gan_beside_a_running_train(c: Ctx) -> None:
    run = c.copy_of_finished()
    (run / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "started": "now"}))
    before = digests(run)
    code, err = c.hasten("gan", *TINY_GAN_OVERRIDES, f"run.dir={run}", "run.overwrite=true")
    expect_refusal(code, err, "in use by another run", f"pid {os.getppid()}")
    assert digests(run) == before


def export_onto_a_runs_own_files(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = digests(run)
    newest = checkpoints_in(run / "checkpoints")[0]
    for out, fmt, needle in (
        (newest, ["--format", "safetensors"], "must end in .safetensors"),
        (run / "checkpoints" / "w.safetensors", [], "own checkpoints"),
        (run / "model.safetensors", ["--overwrite"], "own model.safetensors"),
        (run / "tensorboard" / "w.onnx", [], "own tensorboard"),
        (run / "summary.json", [], "must end in"),
    ):
        code, err = c.hasten("export", str(run), str(out), *fmt)
        expect_refusal(code, err, str(out.name), needle)
    assert digests(run) == before


def export_over_an_existing_file(c: Ctx) -> None:
    mine = c.file("mine.safetensors", b"the user's own file")
    code, err = c.hasten("export", str(c.finished), str(mine))
    expect_refusal(code, err, "mine.safetensors", "exists", "--overwrite")
    assert mine.read_bytes() == b"the user's own file"
    code, err = c.hasten("export", str(c.finished), str(mine), "--overwrite")
    assert code == 0, err
    assert read_weights(mine)


def evaluate_into_a_runs_own_files(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = digests(run)
    code, err = c.hasten("evaluate", str(run), "--out", str(run / "checkpoints"))
    expect_refusal(code, err, "checkpoints")
    theirs = c.tmp / "theirs"
    theirs.mkdir()
    (theirs / "confusion.csv").write_text("the user's own table")
    code, err = c.hasten("evaluate", str(run), "--out", str(theirs))
    expect_refusal(code, err, "confusion.csv", "no evaluation wrote")
    assert (theirs / "confusion.csv").read_text() == "the user's own table" and digests(run) == before


def experiments_into_a_folder_of_the_users(c: Ctx) -> None:
    """bench and sweep replaced a user's report.md, sweep.md or results.json in --out without a word; a folder with
    anything in it that no hasten command wrote is refused (run.overwrite=true writes into it), and a results folder
    a command wrote is the next one's to replace. An --out that is a file is named as --out."""
    mine = c.tmp / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    for command in (["sweep", *TINY, "--vary", "model.width=2,4", "--in-process", "--out", str(mine)],
                    ["bench", *TINY, "--repeats", "1", "--no-naive", "--in-process", "--out", str(mine)]):  # fmt: skip
        code, err = c.hasten(*command)
        expect_refusal(code, err, f"{command[0]}: --out {mine} holds files no hasten command wrote there (report.md)")
    assert (mine / "report.md").read_text() == "my notes" and not (mine / RESULTS_MARK).exists()
    afile = c.tmp / "afile.txt"
    afile.write_text("x")
    code, err = c.hasten("bench", *TINY, "--repeats", "1", "--no-naive", "--out", str(afile))
    expect_refusal(code, err, f"bench: --out {afile} is a file")
    ours = c.tmp / "ours"
    bench = ["bench", *TINY, "--repeats", "1", "--no-naive", "--no-warmup", "--in-process", "--out", str(ours)]
    assert c.hasten(*bench)[0] == 0 and (ours / RESULTS_MARK).is_file()
    assert c.hasten(*bench)[0] == 0  # its own results: replaced


def experiments_into_a_runs_folder(c: Ctx) -> None:
    run = c.copy_of_finished()
    before = digests(run)
    for command in (["sweep", *TINY, "--vary", "model.width=2,4", "--out", str(run)],
                    ["bench", *TINY, "--repeats", "1", "--no-naive", "--out", str(run)],
                    ["transfer", *TINY, "model.pretrained=x.safetensors", "--out", str(run)]):  # fmt: skip
        code, err = c.hasten(*command)
        expect_refusal(code, err, f"{command[0]}: {run}", "holds a run's files", "--out")
    assert digests(run) == before


def _take_the_lock(folder: str, barrier: object, results: object) -> None:
    from hasten.runfolder.folder import RunFolderError, RunLock

    lock = RunLock(folder)
    barrier.wait()  # every process tries at once
    try:
        lock.__enter__()
    except RunFolderError:
        results.put("refused")
        barrier.wait()
        return
    results.put("held")
    barrier.wait()  # held until every process has tried
    lock.__exit__(None, None, None)


def stale_lock_taken_over_by_exactly_one_of_many(c: Ctx) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for trial in range(8):  # read-then-unlink, as before, let two of twelve in on about one trial in six
        run = c.tmp / f"stale-{trial}"
        run.mkdir()
        (run / LOCK_NAME).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname()}))
        barrier, results = context.Barrier(12), context.Queue()
        workers = [context.Process(target=_take_the_lock, args=(str(run), barrier, results)) for _ in range(12)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        outcomes = sorted(results.get(timeout=5) for _ in workers)
        assert outcomes == ["held"] + ["refused"] * 11, outcomes
        assert not (run / LOCK_NAME).exists()  # released by its one holder


def lock_naming_an_impossible_pid(c: Ctx) -> None:
    for pid in (10**30, 0, -5, "many"):
        run = c.tmp / f"odd-{pid}"
        run.mkdir()
        (run / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
        code, err = c.train(run, "train.epochs=1")
        assert code == 0 and "Traceback" not in err, err
        assert "stale lock" in err


def lock_file_that_points_at_the_users_file(c: Ctx) -> None:
    precious = c.file("precious.txt", b"the user's own notes\n")
    for how in ("symlink", "hardlink"):
        run = c.tmp / how
        run.mkdir()
        (run / LOCK_NAME).symlink_to(precious) if how == "symlink" else os.link(precious, run / LOCK_NAME)
        code, err = c.train(run, "train.epochs=1")
        if how == "symlink":
            expect_refusal(code, err, LOCK_NAME, "not a lock file")
        else:  # a stale lock by its content: replaced, never written into
            assert code == 0, err
        assert precious.read_bytes() == b"the user's own notes\n"


OVERWRITE: list[Callable[[Ctx], None]] = [
    gan_into_a_finished_runs_folder,
    gan_beside_a_running_train,
    export_onto_a_runs_own_files,
    export_over_an_existing_file,
    evaluate_into_a_runs_own_files,
    experiments_into_a_runs_folder,
    experiments_into_a_folder_of_the_users,
    stale_lock_taken_over_by_exactly_one_of_many,
    lock_naming_an_impossible_pid,
    lock_file_that_points_at_the_users_file,
]


@pytest.mark.parametrize("row", OVERWRITE, ids=[f.__name__ for f in OVERWRITE])
def test_overwrite(row, finished, tmp_path, capsys, monkeypatch):
    row(Ctx(tmp_path, finished, capsys, monkeypatch))


# ----- resources: sizes, processes and downloads are bounded before anything is spent -----


def edit_summary(run: Path, **preprocessing: object) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary["preprocessing"] |= preprocessing
    (run / "summary.json").write_text(json.dumps(summary))


def devices_above_the_machine(c: Ctx) -> None:
    code, err = c.hasten("train", "--devices", "64", *TINY, "device=cpu", f"run.dir={c.tmp / 'never'}")
    expect_refusal(code, err, "--devices 64", "CPU core")
    assert not (c.tmp / "never").exists()


LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time\\n"
                          "from hasten.engine.distributed import die_with_launcher\\n"
                          "die_with_launcher(os.getppid())\\n"
                          "print('ready', flush=True)\\n"
                          "time.sleep(300)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent's reaping is left


def workers_die_with_their_launcher(c: Ctx) -> None:
    import time

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    assert not _gone(worker)
    launcher.kill()  # SIGKILL: no handler of the launcher runs
    launcher.wait()
    for _ in range(300):  # the worker must end on its own; 30 s at most
        if _gone(worker):
            break
        time.sleep(0.1)
    assert _gone(worker), "the worker outlived its launcher"


def sizes_in_summary_json_are_checked(c: Ctx) -> None:
    image = picture(c)
    for changes, needle in (({"height": 6000, "width": 6000}, "preprocessing.height"), ({"height": 1e6}, "height"),
                            ({"width": -5}, "preprocessing.width"), ({"std": [0.0]}, "preprocessing.std")):  # fmt: skip
        run = c.copy_of_finished()
        edit_summary(run, **changes)
        before = digests(run)
        for command in (["predict", str(run), str(image)], ["export", str(run), str(c.tmp / "w.safetensors")]):
            code, err = c.hasten(*command)
            expect_refusal(code, err, "summary.json", needle)
        assert digests(run) == before
        shutil.rmtree(run)


def stride_zero_tensor_in_a_checkpoint(c: Ctx) -> None:
    run = c.copy_of_finished()
    for path in checkpoints_in(run / "checkpoints"):  # every one: a run folder falls back to the next usable
        state = load_checkpoint(path)
        key = next(k for k, v in state["model"].items() if v.is_floating_point())
        state["model"][key] = torch.zeros(1).expand(40_000, 40_000)  # 4 bytes stored, 6.4 GB if ever copied
        save_checkpoint(state, path)
    newest = checkpoints_in(run / "checkpoints")[0]
    assert newest.stat().st_size < 1_000_000
    before = digests(run)
    for command in (["evaluate", str(run)], ["predict", str(run), str(picture(c))],
                    ["export", str(newest), str(c.tmp / "w.safetensors")]):  # fmt: skip
        code, err = c.hasten(*command)
        expect_refusal(code, err, newest.name, "(40000, 40000)", "stride 0")
    code, err = c.train(c.tmp / "other", f"model.pretrained={newest}")
    expect_refusal(code, err, newest.name, "stride 0")
    code, err = c.train(run, "resume=auto", "train.epochs=3")
    expect_refusal(code, err, newest.name, "stride 0")
    assert digests(run) == before


def checkpoint_that_unpacks_to_more_than_it_holds(c: Ctx) -> None:
    import zipfile

    state = load_checkpoint(checkpoints_in(c.finished / "checkpoints")[0])
    state["model"]["padding"] = torch.zeros(5_000_000)  # 20 MB of zeros: a few KB once deflated
    plain = c.tmp / "plain.pt"
    torch.save(state, plain)
    bomb = c.tmp / "bomb.pt"
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as packed:
        for record in source.infolist():
            packed.writestr(record.filename, source.read(record.filename))
    assert bomb.stat().st_size < 1_000_000
    for command in (["evaluate", str(bomb)], ["export", str(bomb), str(c.tmp / "w.safetensors")]):
        code, err = c.hasten(*command)
        expect_refusal(code, err, "bomb.pt", "unpack to")
    code, err = c.train(c.tmp / "r", f"model.pretrained={bomb}")
    expect_refusal(code, err, "bomb.pt", "unpack to")


def onnx_with_a_constant_bomb(export: Path, out: Path, op: str) -> Path:
    """`export` with a tensor of 60000 x 60000 computed from its constants alone (14.4 GB as floats) and added, times
    zero, to its logits: it runs, answering as the export does, once that memory is found."""
    import numpy
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    proto = onnx.load(str(export))
    graph = proto.graph
    logits = graph.output[0].name
    for node in graph.node:
        node.output[:] = ["clean" if name == logits else name for name in node.output]
    graph.initializer.extend([numpy_helper.from_array(numpy.array([60000, 60000], dtype=numpy.int64), "side"),
                              numpy_helper.from_array(numpy.array([1.0], dtype=numpy.float32), "one")])  # fmt: skip
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    made = {
        "ConstantOfShape": [helper.make_node("ConstantOfShape", ["side"], ["bomb"], value=one)],
        "Expand": [helper.make_node("Expand", ["one", "side"], ["bomb"])],
        "RandomNormal": [helper.make_node("RandomNormal", [], ["bomb"], shape=[60000, 60000])],
        # a shape that ONNX's inference cannot follow (Abs has no data propagation): not sized, so refused
        "Abs": [helper.make_node("Abs", ["side"], ["unsized"]),
                helper.make_node("ConstantOfShape", ["unsized"], ["bomb"], value=one)],
    }[op]  # fmt: skip
    graph.node.extend([*made, helper.make_node("ReduceSum", ["bomb"], ["total"], keepdims=0),
                       helper.make_node("Mul", ["total", "one"], ["scaled"]),
                       helper.make_node("Sub", ["scaled", "scaled"], ["nil"]),
                       helper.make_node("Add", ["clean", "nil"], [logits])])  # fmt: skip
    onnx.save(proto, str(out))
    return out


def onnx_graphs_that_compute_gigabytes_from_constants(c: Ctx) -> None:
    import onnxruntime

    export = c.tmp / "model.onnx"
    code, err = c.hasten("export", str(c.finished), str(export))
    assert code == 0, err

    class NoSession:
        def __init__(self, path: str, *args: object, **kwargs: object) -> None:
            raise AssertionError(f"onnxruntime was given {path}, a graph that takes 14.4 GB before any input")

    c.monkeypatch.setattr(onnxruntime, "InferenceSession", NoSession)
    for op, needle in (("ConstantOfShape", "ConstantOfShape 'bomb' of shape [60000, 60000]"),
                       ("Expand", "Expand 'bomb' of shape [60000, 60000]"),
                       ("RandomNormal", "RandomNormal 'bomb' of shape [60000, 60000]"),
                       ("Abs", "a size shape inference cannot tell")):  # fmt: skip
        bomb = onnx_with_a_constant_bomb(export, c.tmp / f"{op}.onnx", op)
        assert bomb.stat().st_size < 1_000_000
        code, err = c.hasten("predict", str(bomb), str(picture(c)))
        expect_refusal(code, err, f"{op}.onnx", needle, "from its constants alone")
        assert len(err.strip().splitlines()) == 1, err
        with pytest.raises(CheckpointError, match="from its constants alone"):
            hasten.load(bomb)


class Server:
    """A local HTTP server that misbehaves: /endless never stops sending, /trickle sends a byte every 2 s,
    /huge announces a terabyte."""

    def __init__(self) -> None:
        import http.server
        import threading
        import time

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                if self.path == "/huge":
                    self.send_header("Content-Length", str(10**12))
                elif self.path == "/trickle":
                    self.send_header("Content-Length", "1000")
                self.end_headers()
                try:
                    if self.path == "/endless":
                        while True:
                            self.wfile.write(b"\0" * 65536)
                    elif self.path == "/trickle":
                        for _ in range(1000):
                            self.wfile.write(b"x")
                            self.wfile.flush()
                            time.sleep(2)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def downloads_are_capped_in_size_and_time(c: Ctx) -> None:
    from hasten.data import download as downloads
    from hasten.errors import DataError

    server = Server()
    try:
        sha = "ab" * 32
        for path, limits, needle in (("/endless", {"max_bytes": 2 << 20}, "more than the 2,097,152"),
                                     ("/trickle", {"deadline": 3}, "stopped after 3 s"),
                                     ("/huge", {}, "announces 1,000,000,000,000 bytes")):  # fmt: skip
            dest = c.tmp / "dl" / "file.bin"
            with pytest.raises(DataError, match=needle):
                downloads.download(server.url + path, dest, sha, **limits)
            assert not dest.parent.exists() or list(dest.parent.iterdir()) == []  # nothing partial left
        # the same through model.pretrained from the command line, with the limits lowered for the test
        c.monkeypatch.setenv("XDG_CACHE_HOME", str(c.tmp / "cache"))
        c.monkeypatch.setattr(downloads, "MAX_DOWNLOAD_BYTES", 2 << 20)
        code, err = c.train(c.tmp / "r", f"model.pretrained={server.url}/endless", f"model.pretrained_sha256={sha}")
        expect_refusal(code, err, "model.pretrained", "/endless", "more than the 2,097,152")
        assert not (c.tmp / "r" / "summary.json").exists()
        assert [p for p in (c.tmp / "cache").rglob("*") if p.is_file()] == []
    finally:
        server.close()


def bomb_png(path: Path, side: int = 12000) -> Path:
    """A PNG header that claims side x side pixels (Pillow's bomb check reads only the header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    body = zlib.compress(b"\0" * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def decompression_bomb_images(c: Ctx) -> None:
    bomb = bomb_png(c.tmp / "bomb.png")
    code, err = c.hasten("predict", str(c.finished), str(bomb))
    expect_refusal(code, err, "bomb.png", "decompression-bomb", "144000000 pixels")
    root = c.tmp / "folder"
    for split, cls in (("train", "a"), ("train", "b"), ("val", "a"), ("val", "b")):
        (root / split / cls).mkdir(parents=True)
        Image.new("L", (8, 8), 128).save(root / split / cls / "1.png")
    bomb_png(root / "train" / "a" / "0.png")
    code, err = c.hasten("train", *TINY, "data.name=imagefolder", f"data.root={root}", "data.workers=0",
                         f"run.dir={c.tmp / 'r'}")  # fmt: skip
    expect_refusal(code, err, "0.png", "decompression-bomb")


def a_fifo_named_like_an_image(c: Ctx) -> None:
    import threading

    root = c.tmp / "folder"
    for split, cls in (("train", "a"), ("train", "b"), ("val", "a"), ("val", "b")):
        (root / split / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (8, 8), 60 * i + (100 if cls == "b" else 0)).save(root / split / cls / f"{i}.png")
    fifos = [root / "train" / "a" / "x.png", root / "val" / "b" / "x.png"]

    def feed(fifo: Path) -> None:  # were it read, the read gets bytes that are no image, not a wait for ever
        with open(fifo, "wb") as writer:
            writer.write(b"not an image")

    feeders = []
    for fifo in fifos:
        os.mkfifo(fifo)
        feeders.append(threading.Thread(target=feed, args=(fifo,), daemon=True))
        feeders[-1].start()
    try:
        run = c.tmp / "r"
        code, err = c.hasten("train", *QUICK, "data.name=imagefolder", f"data.root={root}", "data.workers=0",
                             "train.min_steps_per_epoch=0", f"run.dir={run}")  # fmt: skip
        assert code == 0, err
        assert "skipped 2 entries named like an image but not a regular file" in err, err
        assert "train/a/x.png (a FIFO)" in err, err
        code, err = c.hasten("evaluate", str(run))
        assert code == 0 and "Traceback" not in err, err
        assert "train/a/x.png (a FIFO)" in err, err
    finally:
        readers = [os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) for fifo in fifos]  # each feeder can now finish
        for feeder in feeders:
            feeder.join(timeout=10)
        for reader in readers:
            os.close(reader)


def sizes_in_the_recipe_are_bounded(c: Ctx) -> None:
    for override, needle in (("data.size=100000", "data.size"), ("data.synthetic_size=10000000000", "synthetic_size"),
                             ("data.size=-5", "data.size")):  # fmt: skip
        code, err = c.train(c.tmp / "never", override)
        expect_refusal(code, err, needle)
    assert not (c.tmp / "never").exists()


def counts_have_ceilings(c: Ctx) -> None:
    from hasten.errors import HastenError, RecipeError
    from hasten.experiments.bench import grid_variants, run_grid
    from hasten.recipe.gan import load_gan_recipe

    # each is refused by the schema first (without the ceiling, training a million epochs on 99,999,999 threads would
    # be what the command line below does), then through the command line, exit 2 naming the key
    at_most = "less than or equal to"
    for override, key, needle in (("model.width=70000", "model.width", "65536"),
                                  ("model.widths=[8,70000,8]", "model.widths", "65536"),
                                  ("model.blocks=[1,100000]", "model.blocks", "1000"),
                                  (f"model.blocks={[1] * 17}", "model.blocks", "at most 16 items"),
                                  ("train.threads=99999999", "train.threads", "1024"),
                                  ("train.epochs=1000000", "train.epochs", "100000"),
                                  ("data.workers=5000", "data.workers", "1024")):  # fmt: skip
        with pytest.raises(RecipeError, match=re.escape(key)):
            load_recipe(None, [override])
        code, err = c.train(c.tmp / "never", override)
        expect_refusal(code, err, key, needle)
        assert at_most in err or "at most" in err, err
    for override in ("train.epochs=1000000", "train.threads=99999999", "model.width=70000"):
        with pytest.raises(RecipeError, match=re.escape(override.split("=")[0])):
            load_gan_recipe(None, [override])
    assert not (c.tmp / "never").exists()
    recipe = load_recipe(None, TINY)
    with pytest.raises(HastenError, match="--repeats 1,000,000: from 1 to 1,000"):
        run_grid(recipe, [], 1_000_000, c.tmp / "grid", warmup=False, measure_peak=False)
    code, err = c.hasten("bench", *TINY, "--repeats", "1000000", "--no-naive", "--out", str(c.tmp / "bench"))
    expect_refusal(code, err, "--repeats 1,000,000", "1,000")
    seeds, epochs = ",".join(map(str, range(101))), ",".join(map(str, range(1, 101)))
    with pytest.raises(RecipeError, match=r"101 \(seed\) x 100 \(train.epochs\) = 10,100 runs"):
        grid_variants([("seed", seeds.split(",")), ("train.epochs", epochs.split(","))])
    for command in ("sweep", "bench"):
        out = c.tmp / command
        code, err = c.hasten(command, *TINY, "--vary", f"seed={seeds}", "--vary", f"train.epochs={epochs}",
                             "--out", str(out))  # fmt: skip
        expect_refusal(code, err, "--vary", "10,100 runs", "10,000")
        assert not out.exists()


def a_dataset_of_a_trillion_items(c: Ctx) -> None:
    from hasten.errors import DataError

    class Endless(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**12

        def __getitem__(self, index: int) -> tuple:
            return torch.zeros(1, 8, 8), 0

    recipe = load_recipe(None, [*TINY, f"run.dir={c.tmp / 'r'}", "data.val_fraction=0.2"])
    with pytest.raises(DataError, match=r"len\(\) is 1,000,000,000,000"):
        hasten.train(recipe, data=Endless())


def a_model_larger_than_the_machine(c: Ctx) -> None:
    for override in ("model.width=65536", "model.layers=[flatten, {dense: 10000000000}, {dense: classes}]"):
        extra = ["model.name=sequential"] if "layers" in override else []
        code, err = c.train(c.tmp / "never", *extra, override)
        expect_refusal(code, err, "parameters", "more than", "this machine has free")
    assert not (c.tmp / "never" / "summary.json").exists()


def memory_that_cannot_be_had(c: Ctx) -> None:
    def refused(*args: object, **kwargs: object) -> None:  # what torch's allocator raises (a real one is unsafe here)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 720000000000 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip

    c.monkeypatch.setattr(hasten.run.build, "build_model", refused)
    code, err = c.train(c.tmp / "r", "model.width=60000")
    expect_refusal(code, err, "out of memory", "720000000000 bytes", "model.width")


RESOURCES: list[Callable[[Ctx], None]] = [
    devices_above_the_machine,
    workers_die_with_their_launcher,
    sizes_in_summary_json_are_checked,
    stride_zero_tensor_in_a_checkpoint,
    checkpoint_that_unpacks_to_more_than_it_holds,
    onnx_graphs_that_compute_gigabytes_from_constants,
    downloads_are_capped_in_size_and_time,
    decompression_bomb_images,
    a_fifo_named_like_an_image,
    sizes_in_the_recipe_are_bounded,
    counts_have_ceilings,
    a_dataset_of_a_trillion_items,
    a_model_larger_than_the_machine,
    memory_that_cannot_be_had,
]


@pytest.mark.parametrize("row", RESOURCES, ids=[f.__name__ for f in RESOURCES])
def test_resources(row, finished, tmp_path, capsys, monkeypatch):
    row(Ctx(tmp_path, finished, capsys, monkeypatch))


# ----- tracebacks: inputs that once ended in one -----

QUICK = [o for o in TINY if not o.startswith(("data.name", "data.synthetic_size"))]  # TINY without its data


def last_batch_of_one_image(c: Ctx) -> None:
    # 1425 = 89 x 16 + 1: the last image joins the 89th batch (batch norm cannot train on one example)
    code, err = c.hasten("train", "fashion-fast", "data.name=digits", "data.subset=1425", "model.width=8",
                         "train.epochs=1", "precision=bf16", "train.channels_last=false", "train.threads=1",
                         "run.progress=false", "run.tensorboard=false", f"run.dir={c.tmp / 'r'}")  # fmt: skip
    assert code == 0 and "Traceback" not in err, err
    assert json.loads((c.tmp / "r" / "summary.json").read_text())["steps"] == 89


def own_arrays_with_a_last_batch_of_one(c: Ctx) -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (17, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.arange(17) % 2
    recipe = load_recipe(None, [*QUICK, "train.epochs=1", "train.min_steps_per_epoch=0", f"run.dir={c.tmp / 'r'}"])
    summary = hasten.train(recipe, data=((images, labels), (images[:4], labels[:4])))
    assert summary["steps"] == 1  # 17 images, batch 16: one batch of 17
    from hasten.errors import DataError

    for count, needle in ((1, "only class"), (2, None)):
        recipe = load_recipe(None, [*QUICK, "train.epochs=1", f"run.dir={c.tmp / f'n{count}'}"])
        two = (images[:count], labels[:count])
        if needle:
            with pytest.raises(DataError, match=needle):
                hasten.train(recipe, data=(two, two))
        else:
            assert hasten.train(recipe, data=(two, two))["steps"] == 1


def non_utf8_class_folder_names(c: Ctx) -> None:
    root = c.tmp / "folder"
    name = os.fsdecode(b"caf\xe9")  # a folder named in latin-1 on another system
    for split in ("train", "val"):
        for cls in ("plain", name):
            (root / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (8, 8), 60 * i + (100 if cls == name else 0)).save(root / split / cls / f"{i}.png")
    run = c.tmp / "r"
    code, err = c.hasten("train", *QUICK, "data.name=imagefolder", f"data.root={root}", "data.workers=0",
                         "train.min_steps_per_epoch=0", f"run.dir={run}")  # fmt: skip
    assert code == 0, err
    code, err = c.hasten("evaluate", str(run))
    assert code == 0 and "Traceback" not in err, err
    assert "caf\\xe9" in (run / "evaluation" / "confusion.csv").read_text(encoding="utf-8")
    code, err = c.hasten("predict", str(run), str(root / "val"))
    assert code == 0 and "Traceback" not in err, err


# every control character but the newline (a line of the output's own); a name's newline is checked escaped
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown_as_text(*outputs: str) -> None:
    """No control character of a name reached the output."""
    for text in outputs:
        found = CONTROL.search(text)
        assert found is None, repr(text[max(0, found.start() - 80) : found.end() + 40])


def output_of(c: Ctx, *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `hasten ARGS`, run in this process."""
    c.capsys.readouterr()
    code = main(list(args))
    out, err = c.capsys.readouterr()
    return code, out, err


# (no CJK in a folder's names: evaluate's confusion.png has no glyph for it, and matplotlib would warn)
ODD_CLASSES = {"plain": 3, "esc\x1b[31mred": 3, "new\nline": 3, "café": 3}  # and an empty one, below
SHOWN = ("esc\\x1b[31mred", "new\\nline", "café")  # as hasten shows them: escaped, Unicode kept


def control_characters_in_class_folder_names(c: Ctx) -> None:
    """Class folders named with ESC and a newline: the opening lines of train, evaluate's table and files, and
    predict's table, CSV and JSON show them escaped (as repr writes them), never raw."""
    root, empty = c.tmp / "folder", "void\x1b]0;title\x07"  # a terminal-title sequence: an empty training class
    try:
        image_folder(root, ODD_CLASSES)
        image_folder(root, {empty: 0}, ("train",))
        image_folder(root, {empty: 3}, ("val",))
    except OSError as error:  # a file system that refuses such names has nothing to show
        pytest.skip(f"this file system refuses control characters in folder names: {error}")
    run = c.tmp / "r"
    code, out, err = output_of(c, "train", *QUICK, "data.name=imagefolder", f"data.root={root}", "data.workers=0",
                               "train.min_steps_per_epoch=0", f"run.dir={run}")  # fmt: skip
    assert code == 0, err
    assert "train/void\\x1b]0;title\\x07 hold(s) no images" in err  # the opening lines' warning names it
    shown_as_text(out, err)
    code, out, err = output_of(c, "evaluate", str(run))
    assert code == 0, err
    assert all(name in out for name in SHOWN)
    shown_as_text(out, err, (run / "evaluation" / "confusion.csv").read_text(encoding="utf-8"))
    for how in ([], ["--csv"], ["--json"]):
        code, out, err = output_of(c, "predict", str(run), str(root / "val"), "--top-k", "5", *how)
        assert code == 0, err
        shown_as_text(out.replace("\r\n", "\n"), err)  # (the CSV's own line ends are CRLF)
    predictions = json.loads(out)  # (--json, the last: its names are the shown ones too)
    assert any(p["image"].endswith("/new\\nline/0.png") for p in predictions)
    assert {top["class"] for p in predictions for top in p["top"]} >= set(SHOWN)


def control_characters_in_an_exports_class_names(c: Ctx) -> None:
    """An export whose metadata names classes with ESC and a newline: predict and hasten.load show them escaped."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    export, odd = c.tmp / "model.safetensors", c.tmp / "odd.safetensors"
    code, err = c.hasten("export", str(c.finished), str(export))
    assert code == 0, err
    with safe_open(str(export), framework="pt") as f:
        meta = dict(f.metadata())
    classes = json.loads(meta["hasten_classes"])
    odd_names = ["plain", "esc\x1b[31mred", "new\nline", "日本\u202eevil"]
    meta["hasten_classes"] = json.dumps([*odd_names, *classes[len(odd_names) :]])
    save_file(load_file(str(export)), str(odd), metadata=meta)
    code, out, err = output_of(c, "predict", str(odd), str(picture(c)), "--top-k", str(len(classes)))
    assert code == 0, err
    shown = ["plain", "esc\\x1b[31mred", "new\\nline", "日本\\u202eevil"]
    shown_as_text(out, err)
    assert all(name in "".join(out.split()) for name in shown)  # (in a cell that wraps)
    assert hasten.load(odd).classes[:4] == shown


def control_characters_in_a_file_name_in_an_error(c: Ctx) -> None:
    """A file in an image folder that is not an image, named with ESC and a newline: the error names it escaped."""
    root = image_folder(c.tmp / "folder", {"a": 3, "b": 3})
    try:
        (root / "val" / "a" / "bad\x1b[2J\nname.png").write_text("not an image")
    except OSError as error:
        pytest.skip(f"this file system refuses control characters in file names: {error}")
    code, out, err = output_of(c, "train", *QUICK, "data.name=imagefolder", f"data.root={root}", "data.workers=0",
                               f"run.dir={c.tmp / 'r'}")  # fmt: skip
    expect_refusal(code, err, "bad\\x1b[2J\\nname.png")
    shown_as_text(out, err)


def full_disk_during_evaluate(c: Ctx) -> None:
    import matplotlib.figure

    run = c.copy_of_finished()
    before = digests(run)

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    c.monkeypatch.setattr(matplotlib.figure.Figure, "savefig", no_space)
    code, err = c.hasten("evaluate", str(run))
    expect_refusal(code, err, "evaluation", "No space left on device", "free")
    assert not (run / "evaluation").exists() and not list(run.glob(".evaluation*"))
    assert digests(run) == before


def a_rank_killed_mid_run(c: Ctx) -> None:
    worker = Path(__file__).parents[1] / "dist_worker.py"
    args = ["train", *TINY, "device=cpu", "train.epochs=3", "model.name=sequential",
            "model.layers=[{conv: {out: 4, kernel: 3, padding: 1}}, relu, flatten, {dense: classes}]",
            f"run.dir={c.tmp / 'r'}"]  # fmt: skip
    result = subprocess.run([sys.executable, str(worker), *args], env=os.environ | {"HASTEN_TEST_FAULT": "kill:1:3"},
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 128 + 9, result.stderr[-3000:]
    reported = [line for line in result.stderr.splitlines() if re.search(r"\brank\b", line)]  # not the run folder
    assert reported == ["hasten: worker rank 1 was killed by signal 9 (SIGKILL); rank 0 was stopped with it"], reported
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    code, err = c.hasten(*args, "resume=auto")  # one process goes on from the last epoch's checkpoint
    assert code == 0, err
    assert json.loads((c.tmp / "r" / "summary.json").read_text())["epochs"] == 3


def checkpoint_sections_of_the_wrong_type(c: Ctx) -> None:
    for section, change, needle in (
        ("trainer", {"epoch": "two"}, "trainer.epoch"),
        ("trainer", {"step": -3}, "trainer.step"),
        ("trainer", {"time_to_accuracy": [1, 2]}, "trainer.time_to_accuracy"),
        ("hooks", {"ema": {"n_averaged": torch.tensor([1, 2])}}, "n_averaged"),
        ("model", "weights", "model"),
    ):
        run = c.copy_of_finished()
        for path in checkpoints_in(run / "checkpoints"):
            state = load_checkpoint(path)
            state["recipe"]["tricks"]["ema"] = 0.9
            state[section] = (state.get(section) or {}) | change if isinstance(change, dict) else change
            save_checkpoint(state, path)
        before = digests(run)
        newest = checkpoints_in(run / "checkpoints")[0]
        for command in (["evaluate", str(newest)], ["export", str(newest), str(c.tmp / "w.safetensors")]):
            code, err = c.hasten(*command)
            expect_refusal(code, err, newest.name, needle)
        code, err = c.train(run, f"resume={newest}", "train.epochs=3", "tricks.ema=0.9")
        expect_refusal(code, err, newest.name, needle)
        assert digests(run) == before
        shutil.rmtree(run)


def exports_with_metadata_that_does_not_fit(c: Ctx) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    export = c.tmp / "model.safetensors"
    code, err = c.hasten("export", str(c.finished), str(export))
    assert code == 0, err
    with safe_open(str(export), framework="pt") as f:
        meta = f.metadata()
    image = picture(c)
    for key, value, needle in (
        ("hasten_preprocessing", {"height": 1e6}, "preprocessing.height"),
        ("hasten_preprocessing", {"width": -5}, "preprocessing.width"),
        ("hasten_std", [0.0], "std"),
        ("hasten_input_shape", [1, 6000, 6000], "input_shape"),
        ("hasten_classes", [], "classes"),
        ("hasten_tta_translate", 99, "tta_translate"),
    ):
        edited = dict(meta)
        old = json.loads(meta[key])
        edited[key] = json.dumps(old | value if isinstance(value, dict) else value)
        bad = c.tmp / f"bad-{key}.safetensors"
        save_file(load_file(str(export)), str(bad), metadata=edited)
        code, err = c.hasten("predict", str(bad), str(image))
        expect_refusal(code, err, bad.name, needle)


def onnx_exports_that_do_not_fit(c: Ctx) -> None:
    import onnx

    export = c.tmp / "model.onnx"
    code, err = c.hasten("export", str(c.finished), str(export))
    assert code == 0, err
    proto = onnx.load(str(export))
    for prop in proto.metadata_props:
        if prop.key == "hasten_classes":
            prop.value = json.dumps(json.loads(prop.value)[:3])
    onnx.save(proto, str(export))
    code, err = c.hasten("predict", str(export), str(picture(c)))
    expect_refusal(code, err, "model.onnx", "3 classes")
    # weights kept in a file the export names (hasten's never are): not read
    outside = c.tmp / "outside"
    outside.mkdir()
    external = outside / "external.onnx"
    onnx.save(proto, str(external), save_as_external_data=True, location="weights.bin", size_threshold=0)
    code, err = c.hasten("predict", str(external), str(picture(c)))
    expect_refusal(code, err, "external.onnx", "other files it names")


def images_too_small_for_hastens_own_model(c: Ctx) -> None:
    """The ResNet on 2 x 2 digits or a folder of 1 x 1 images ended in torch's "Output size is too small" (exit 1)
    in train, schedule, lr-find and batch-size; now each says the size is too small and a data.size that works."""
    for command in ("train", "schedule", "lr-find", "batch-size"):  # the default recipe's ResNet: refused at once
        code, err = c.hasten(
            command, "data.name=digits", "data.size=2", "train.threads=1", f"run.dir={c.tmp / command}"
        )
        expect_refusal(code, err, "model.name=resnet: images of 2 x 2 pixels are too small", "data.size=")
        assert not (c.tmp / command).exists()
    root = c.tmp / "dots"
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (1, 1), 40 + 100 * i).save(root / split / cls / f"{i}.png")
    code, err = c.hasten(
        "train", "data.name=imagefolder", f"data.root={root}", "data.workers=0", f"run.dir={c.tmp / 'r'}"
    )
    expect_refusal(code, err, "images of 1 x 1 pixels are too small", "data.size=")
    assert not (c.tmp / "r").exists()


def evaluate_past_a_corrupt_newest_checkpoint(c: Ctx) -> None:
    """The newest checkpoint damaged: evaluate skips it for the one before, and says the accuracy it shows beside
    its own is that checkpoint's from metrics.csv, not summary.json's (which came from the weights skipped)."""
    run = c.copy_of_finished()
    newest, older = checkpoints_in(run / "checkpoints")[:2]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    summary = json.loads((run / "summary.json").read_text())
    summary["test_accuracy"] = last = 0.123  # the last weights' accuracy, told apart from any epoch's of this run
    (run / "summary.json").write_text(json.dumps(summary))
    code, out, err = output_of(c, "evaluate", str(run))
    assert code == 0, err
    assert newest.name in err and "corrupt" in err
    evaluation = json.loads((run / "evaluation" / "evaluation.json").read_text())
    assert Path(evaluation["source"]).name == older.name and evaluation["summary_test_accuracy"] == last
    recorded = evaluation["recorded_test_accuracy"]
    assert recorded is not None and recorded != last
    assert f"(metrics.csv for this checkpoint: {recorded!r}; summary.json's {last!r}" in out
    assert "(summary.json:" not in out


def evaluate_on_a_folder_whose_classes_are_named_otherwise(c: Ctx) -> None:
    """Other data's labels are scored by position: a folder whose class names are not the run's gave an accuracy
    (0.0 for one renamed folder) without a word; now it warns, naming the pairs, and evaluation.json records it."""
    root = image_folder(c.tmp / "renamed", {f"k{i}": 2 for i in range(10)})  # the run's classes are "0".."9"
    code, out, err = output_of(c, "evaluate", str(c.finished), "data.name=imagefolder", f"data.root={root}",
                               "data.workers=0", "--out", str(c.tmp / "ev"))  # fmt: skip
    assert code == 0, err
    assert "warning: the data's class names are not the run's and labels are scored by position: k0 as 0" in err
    evaluation = json.loads((c.tmp / "ev" / "evaluation.json").read_text())
    assert "scored by position" in evaluation["classes_matched"]
    same = image_folder(c.tmp / "same", {str(i): 2 for i in range(10)})
    code, out, err = output_of(c, "evaluate", str(c.finished), "data.name=imagefolder", f"data.root={same}",
                               "data.workers=0", "--out", str(c.tmp / "ev2"))  # fmt: skip
    assert code == 0 and "scored by position" not in err, err
    assert json.loads((c.tmp / "ev2" / "evaluation.json").read_text())["classes_matched"] == "by name"


TRACEBACKS: list[Callable[[Ctx], None]] = [
    evaluate_on_a_folder_whose_classes_are_named_otherwise,
    evaluate_past_a_corrupt_newest_checkpoint,
    images_too_small_for_hastens_own_model,
    last_batch_of_one_image,
    own_arrays_with_a_last_batch_of_one,
    non_utf8_class_folder_names,
    control_characters_in_class_folder_names,
    control_characters_in_an_exports_class_names,
    control_characters_in_a_file_name_in_an_error,
    full_disk_during_evaluate,
    a_rank_killed_mid_run,
    checkpoint_sections_of_the_wrong_type,
    exports_with_metadata_that_does_not_fit,
    onnx_exports_that_do_not_fit,
]


@pytest.mark.parametrize("row", TRACEBACKS, ids=[f.__name__ for f in TRACEBACKS])
def test_tracebacks(row, finished, tmp_path, capsys, monkeypatch):
    row(Ctx(tmp_path, finished, capsys, monkeypatch))


# ----- messages: the error says what is wrong, and points the right way -----


def image_folder(root: Path, classes: dict[str, int], splits: tuple[str, ...] = ("train", "val")) -> Path:
    """root/<split>/<class>/<i>.png: `classes` maps each class to its image count (0: an empty folder)."""
    for split in splits:
        for cls, count in classes.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.new("L", (8, 8), (37 * i + 80 * len(cls)) % 256).save(root / split / cls / f"{i}.png")
    return root


def nan_or_inf_in_float_data(c: Ctx) -> None:
    from hasten.errors import DataError

    images, labels = torch.rand(40, 1, 8, 8), torch.arange(40) % 2
    recipe = load_recipe(None, [*QUICK, f"run.dir={c.tmp / 'r'}"])
    poisoned = images.clone()
    poisoned[7, 0, 2, 2] = float("nan")
    with pytest.raises(DataError, match=r"data: train images: 1 pixel value\(s\) are NaN \(first in image 7\)"):
        hasten.train(recipe, data=((poisoned, labels), (images[:8], labels[:8])))
    poisoned[7, 0, 2, 2] = float("inf")
    with pytest.raises(DataError, match="data: test images: .* inf"):
        hasten.train(recipe, data=((images, labels), (poisoned, labels)))
    assert not (c.tmp / "r").exists()


def learning_rates_that_are_not_finite(c: Ctx) -> None:
    for value in ("inf", "nan", "-inf", "1e999"):
        code, err = c.train(c.tmp / "never", f"optim.lr={value}")
        expect_refusal(code, err, "optim.lr", "finite")
    code, err = c.train(c.tmp / "never", "tricks.ema=nan")
    expect_refusal(code, err, "tricks.ema", "finite")
    assert not (c.tmp / "never").exists()


def class_names_that_do_not_match_the_data(c: Ctx) -> None:
    code, err = c.hasten("train", *QUICK, "data.name=digits", "data.classes=[a,b,c]", f"run.dir={c.tmp / 'never'}")
    expect_refusal(code, err, "data.classes", "['a', 'b', 'c']", "digits")
    assert not (c.tmp / "never").exists()


def empty_and_single_class_folders(c: Ctx) -> None:
    root = image_folder(c.tmp / "folder", {"a": 3, "b": 3, "empty": 0})
    common = [*QUICK, "data.name=imagefolder", "data.workers=0", "train.min_steps_per_epoch=0"]
    code, err = c.hasten("train", *common, f"data.root={root}", f"run.dir={c.tmp / 'r'}")
    assert code == 0, err
    assert "warning:" in err and "train/empty" in err and "never sees an example" in err
    one = image_folder(c.tmp / "one", {"only": 4})
    code, err = c.hasten("train", *common, f"data.root={one}", f"run.dir={c.tmp / 'r1'}")
    expect_refusal(code, err, "only class 'only'", "at least 2 classes")
    assert not (c.tmp / "r1" / "summary.json").exists()


def extends_from_the_recipe_s_own_folder(c: Ctx) -> None:
    folder = c.tmp / "recipes"
    folder.mkdir()
    (folder / "base.yaml").write_text("train:\n  epochs: 7\n")
    (folder / "child.yaml").write_text("extends: base.yaml\nseed: 3\n")
    elsewhere = c.tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "base.yaml").write_text("train:\n  epochs: 1\n")  # a file of the same name where the user stands
    c.monkeypatch.chdir(elsewhere)
    recipe = load_recipe(str(folder / "child.yaml"))
    assert recipe.train.epochs == 7 and recipe.seed == 3
    secret = c.file("shadow", b"root:$6$secret-hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    for target in (str(secret), "../shadow"):
        (folder / "evil.yaml").write_text(f"extends: {target}\n")
        code, err = c.hasten("train", str(folder / "evil.yaml"))
        expect_refusal(code, err, "extends", "not a recipe file")
        assert "secret-hash" not in err and "daemon" not in err
    code, err = c.hasten("train", str(secret))
    expect_refusal(code, err, "shadow", "not a recipe file")
    assert "secret-hash" not in err


def export_to_an_unknown_suffix(c: Ctx) -> None:
    for out, fmt in (("out.xyz", []), ("out", []), ("out.onnx", ["--format", "safetensors"])):
        code, err = c.hasten("export", str(c.finished), str(c.tmp / out), *fmt)
        expect_refusal(code, err, out, "must end in")
        assert not (c.tmp / out).exists()


def duplicate_keys_in_a_recipe(c: Ctx) -> None:
    recipe = c.file("twice.yaml", b"train:\n  epochs: 3\n  batch_size: 16\n  epochs: 30\n")
    code, err = c.hasten("train", str(recipe))
    expect_refusal(code, err, "twice.yaml", "duplicate key 'epochs'", "line 2")
    code, err = c.train(c.tmp / "never", "data.args={a: 1, a: 2}")
    expect_refusal(code, err, "duplicate key 'a'")


def run_dir_at_the_root_or_home(c: Ctx) -> None:
    for folder, needle in (("/", "filesystem root"), ("~/", "home folder"), (str(Path.home()), "home folder"),
                           (str(Path.home().parent), "above your home")):  # fmt: skip
        if needle == "above your home" and Path.home().parent == Path("/"):
            continue
        code, err = c.hasten("train", *TINY, f"run.dir={folder}")
        expect_refusal(code, err, "run.dir", needle)
    code, err = c.hasten("sweep", *TINY, "--vary", "model.width=2,4", "--out", "/")
    expect_refusal(code, err, "sweep", "filesystem root")


def unknown_keys_get_the_closest_valid_one(c: Ctx) -> None:
    code, err = c.hasten("train", "fashion-fast", "train.epoch=3")
    expect_refusal(code, err, "train.epoch: unknown key", "did you mean train.epochs?", "the command line")
    for typo, meant in (("optim.lrr=0.1", "optim.lr"), ("lr=0.1", "optim.lr"), ("trian.epochs=2", "train"),
                        ("data.augment.flp=true", "data.augment.flip")):  # fmt: skip
        code, err = c.hasten("train", *TINY, typo)
        expect_refusal(code, err, typo.partition("=")[0], f"did you mean {meant}?")


def an_override_s_error_is_the_command_line_s(c: Ctx) -> None:
    code, err = c.hasten("train", "fashion-fast", "train.epochs=0")
    expect_refusal(code, err, "the command line", "train.epochs")
    assert "shipped recipe 'fashion-fast': 1 problem" not in err
    bad = c.file("bad.yaml", b"train:\n  epochs: 0\n")
    code, err = c.hasten("train", str(bad), "seed=2")
    expect_refusal(code, err, "bad.yaml: 1 problem(s)", "train.epochs")
    assert "command line" not in err


def data_root_that_does_not_exist(c: Ctx) -> None:
    missing = c.tmp / "no-such-folder"
    for extra in (["data.name=imagefolder"], ["data.name=fashion-mnist"]):
        code, err = c.hasten("train", *QUICK, *extra, f"data.root={missing}", f"run.dir={c.tmp / 'never'}")
        expect_refusal(code, err, f"data.root={missing}: no such folder")
        assert "make-folder" not in err
    assert not (c.tmp / "never").exists()


def a_folder_without_data_name_imagefolder(c: Ctx) -> None:
    root = image_folder(c.tmp / "photos", {"cat": 3, "dog": 3})
    code, err = c.hasten("train", *QUICK, f"data.root={root}", f"run.dir={c.tmp / 'never'}")
    expect_refusal(code, err, "holds an image folder", "data.name=imagefolder")
    assert "How to get" not in err and not (c.tmp / "never").exists()
    code, err = c.hasten("train", str(root), *QUICK, "data.workers=0", "train.min_steps_per_epoch=0",
                         f"run.dir={c.tmp / 'r'}")  # fmt: skip
    assert code == 0, err
    assert json.loads((c.tmp / "r" / "summary.json").read_text())["classes"] == ["cat", "dog"]
    code, err = c.hasten("train", str(c.tmp))
    expect_refusal(code, err, "is a folder, not a recipe")


def valid_values_without_internal_ones(c: Ctx) -> None:
    code, err = c.hasten("train", *TINY, "model.name=resnet50")
    expect_refusal(code, err, "model.name", "'resnet50'", "did you mean resnet?", "model.name=import")
    assert "object" not in err
    code, err = c.hasten("train", *TINY, "data.name=fashion")
    expect_refusal(code, err, "data.name", "did you mean fashion-mnist?", "data.name=import", "imagefolder")
    assert "object" not in err


MESSAGES: list[Callable[[Ctx], None]] = [
    nan_or_inf_in_float_data,
    learning_rates_that_are_not_finite,
    class_names_that_do_not_match_the_data,
    empty_and_single_class_folders,
    extends_from_the_recipe_s_own_folder,
    export_to_an_unknown_suffix,
    duplicate_keys_in_a_recipe,
    run_dir_at_the_root_or_home,
    unknown_keys_get_the_closest_valid_one,
    an_override_s_error_is_the_command_line_s,
    data_root_that_does_not_exist,
    a_folder_without_data_name_imagefolder,
    valid_values_without_internal_ones,
]


@pytest.mark.parametrize("row", MESSAGES, ids=[f.__name__ for f in MESSAGES])
def test_messages(row, finished, tmp_path, capsys, monkeypatch):
    row(Ctx(tmp_path, finished, capsys, monkeypatch))


# ----- the checkpoint loader fails closed -----


def mutations(data: bytes, count: int, rng: random.Random) -> list[bytes]:
    """`count` damaged copies of `data`: flipped bytes, truncation, inserted, overwritten or zeroed spans."""
    out = []
    for _ in range(count):
        b = bytearray(data)
        kind = rng.randrange(6)
        at = rng.randrange(len(b))
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del b[at:]
        elif kind == 2:
            b[at:at] = rng.randbytes(rng.randint(1, 64))
        elif kind == 3:
            span = rng.randint(1, 256)
            b[at : at + span] = rng.randbytes(len(b[at : at + span]))
        elif kind == 4:
            span = rng.randint(1, 512)
            b[at : at + span] = bytes(len(b[at : at + span]))
        else:
            b[at : at + rng.randint(1, 64)] = b""
        out.append(bytes(b))
    return out


def test_checkpoint_loader_fails_closed_on_malformed_files(finished, tmp_path, capsys):
    """300 damaged copies of a real checkpoint (no digest sidecar, so the parser itself meets the damage): each
    one loads, or is a CheckpointError (exit 2) naming the file; nothing else is raised."""
    original = checkpoints_in(finished / "checkpoints")[0]
    recipe = load_recipe(None, [*TINY, f"run.dir={tmp_path / 'unused'}"])
    parts = build(recipe)
    trainer = trainer_for(parts, Plan(epochs=2, num_classes=len(parts.data.classes)), RunLog("", enabled=False))
    outcomes = {"loaded": 0, "refused": 0}
    for i, data in enumerate(mutations(original.read_bytes(), 300, random.Random(17))):
        path = tmp_path / f"m{i}.pt"
        path.write_bytes(data)
        try:
            state = load_checkpoint(path)
            trainer.load_state_dict(state, str(path))
        except CheckpointError as error:
            assert path.name in str(error)
            outcomes["refused"] += 1
        else:
            outcomes["loaded"] += 1
        if i % 10 == 0:  # and through the CLI: exit 0 or 2, never a traceback
            capsys.readouterr()
            code = main(["export", str(path), str(tmp_path / "w.safetensors")])
            err = capsys.readouterr().err
            assert code in (0, 2) and "Traceback" not in err
            if code == 0:
                assert read_weights(tmp_path / "w.safetensors")
        path.unlink()
    assert outcomes["refused"] > 100, outcomes  # the damage was real: most copies are refused
