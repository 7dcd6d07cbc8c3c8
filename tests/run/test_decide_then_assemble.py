"""Decide, then assemble (hasten/run/resolve.py, hasten/run/assemble.py, hasten/run/build.py): `resolve` makes
every choice and returns the recipe that recipe.yaml records, `assemble` builds from it without changing it; the
path from the command to `optimizer.step()` stays short; SIGINT/SIGTERM handlers are installed once per run."""

from __future__ import annotations

import inspect
import signal
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from torch.optim.optimizer import register_optimizer_step_pre_hook

import hasten
from hasten import cli
from hasten.recipe.schema import load_recipe
from hasten.run import assemble as assemble_module
from hasten.run import build as build_module
from hasten.run import resolve as resolve_module
from hasten.runfolder import checkpoint as checkpoint_module
from hasten.runfolder.folder import LOCK_NAME, RunFolderError, RunLock

PACKAGE = str(Path(hasten.__file__).parent)
MAX_FRAMES_BELOW_MAIN = 7  # with cli.run above main: at most 8 hasten frames from the command to optimizer.step()


def _hasten_frames() -> list[str]:
    """The hasten functions on the stack, outermost first, as path:function."""
    frames = [f for f in reversed(inspect.stack()) if f.filename.startswith(PACKAGE)]
    return [f"{Path(f.filename).relative_to(PACKAGE).as_posix()}:{f.function}" for f in frames]


def test_optimizer_step_is_at_most_eight_frames_below_the_command(tiny_overrides):
    stacks: list[list[str]] = []
    handle = register_optimizer_step_pre_hook(lambda *_: stacks.append(_hasten_frames()) if not stacks else None)
    try:
        assert cli.main(["train", *tiny_overrides, "train.epochs=1", "run.tensorboard=false"]) == 0
    finally:
        handle.remove()
    frames = stacks[0]
    assert frames[0] == "cli/__init__.py:main", frames
    assert len(frames) <= MAX_FRAMES_BELOW_MAIN, frames  # cli.main -> ... -> the frame that calls optimizer.step()
    assert frames[-1] == "engine/precision.py:step", frames


@pytest.mark.machine
def test_assemble_builds_from_the_resolved_recipe_and_never_changes_it(tiny_overrides, monkeypatch):
    # optim.lr=auto is decided in resolve (a range test on a trial assembly), so assemble gets a number
    recipe = load_recipe(None, [*tiny_overrides, "optim.name=sgd", "optim.lr=auto", "train.batch_size=auto"])
    seen: list[tuple[dict, dict]] = []
    real_assemble = assemble_module.assemble

    def watched(recipe, *args, **kwargs):
        before = recipe.model_dump(mode="json")
        parts = real_assemble(recipe, *args, **kwargs)
        seen.append((before, recipe.model_dump(mode="json")))
        assert parts.recipe is recipe  # the parts carry the very recipe they were built from
        return parts

    monkeypatch.setattr(build_module, "assemble", watched)  # the run's
    monkeypatch.setattr(resolve_module, "assemble", watched)  # the range test's trial
    summary = hasten.train(recipe, ["train.epochs=1", "run.tensorboard=false"])
    assert len(seen) == 2  # the range test's trial assembly, then the run's
    for before, after in seen:
        assert before == after
    final = seen[-1][1]
    assert isinstance(final["optim"]["lr"], float) and isinstance(final["train"]["batch_size"], int)
    recorded = yaml.safe_load((Path(summary["run_dir"]) / "recipe.yaml").read_text())
    assert recorded["optim"]["lr"] == final["optim"]["lr"]
    assert recorded["train"]["batch_size"] == final["train"]["batch_size"]


def test_signal_handlers_are_installed_once_a_run(tiny_overrides, monkeypatch):
    installed: list[int] = []
    real_signal = signal.signal

    def counting(signum, handler):
        if signum == signal.SIGINT and callable(handler) and getattr(handler, "__name__", "") == "request":
            installed.append(signum)
        return real_signal(signum, handler)

    monkeypatch.setattr(signal, "signal", counting)
    hasten.train(None, [*tiny_overrides, "train.epochs=1", "run.tensorboard=false"])
    assert installed == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is not None and torch.is_grad_enabled()  # restored, nothing left on


def _leaves(tree, prefix=""):
    """Every (dotted key, value) of a nested mapping."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_recipe_a_run_records_holds_every_choice_and_is_frozen(tiny_overrides, monkeypatch):
    """What the run decided is in recipe.yaml, not left `auto` or unset: the device, how the data was read (in
    memory; the loader's workers; torch's threads), the images' size and channels, the class names, the model's
    size, the fused optimizer; and the recipe assemble builds from cannot be changed after resolve."""
    built = []
    real_build = build_module.build
    monkeypatch.setattr(build_module, "build", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    open_keys = [override for override in tiny_overrides if not override.startswith("train.eval_batch_size")]
    summary = hasten.train(None, [*open_keys, "train.epochs=1", "run.tensorboard=false"])
    recorded = yaml.safe_load((Path(summary["run_dir"]) / "recipe.yaml").read_text())
    leaves = dict(_leaves(recorded))
    assert [key for key, value in leaves.items() if value == "auto"] == []
    assert (leaves["device"], leaves["data.in_memory"], leaves["optim.fused"]) == ("cpu", True, True)
    assert (leaves["data.size"], leaves["data.rgb"]) == (28, False)
    assert isinstance(leaves["data.workers"], int) and leaves["train.threads"] == torch.get_num_threads()
    assert leaves["train.eval_batch_size"] >= 1 and len(recorded["data"]["classes"]) == 10
    assert leaves["model.parameters"] == sum(p.numel() for p in built[0].model.parameters())
    frozen = built[0].recipe
    with pytest.raises(ValidationError):
        frozen.train.epochs = 3  # type: ignore[misc]
    assert recorded == frozen.model_dump(mode="json")


def test_a_resume_reads_its_checkpoint_once_under_the_runs_lock(tiny_overrides, monkeypatch):
    # the batch left to the machine: the resume takes the one its run chose from the checkpoint it continues from
    tiny_overrides = [*tiny_overrides, "train.batch_size=auto"]
    first = hasten.train(None, [*tiny_overrides, "train.epochs=1", "run.tensorboard=false"])
    folder = Path(first["run_dir"])
    reads: list[bool] = []
    real_load = checkpoint_module.load_checkpoint

    def counted(*args, **kwargs):
        reads.append((folder / LOCK_NAME).exists())  # the lock is held while the checkpoint is read
        return real_load(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", counted)
    monkeypatch.setattr(resolve_module, "load_checkpoint", counted)
    hasten.train(None, [*tiny_overrides, "train.epochs=2", "run.tensorboard=false", "resume=auto"])
    assert reads == [True]


def test_a_locked_run_folder_is_refused_before_the_data_is_read(tiny_overrides, tmp_path, monkeypatch):
    read: list[str] = []
    real_dataset = build_module.dataset
    monkeypatch.setattr(build_module, "dataset", lambda recipe: read.append(recipe.name) or real_dataset(recipe))
    folder = tmp_path / "held"
    with RunLock(folder), pytest.raises(RunFolderError, match="run.dir"):
        hasten.train(None, [*tiny_overrides, f"run.dir={folder}"])
    assert read == []


def test_the_loops_plan_and_checkpointing_take_their_defaults_from_the_recipe_schema():
    """One home for each default: a Plan or Saving made without a recipe (tools that drive a loop of their own)
    does what the default recipe says."""
    from hasten.recipe.schema import Recipe
    from hasten.run.plan import Plan, Saving

    plan, saving, default = Plan(epochs=1, num_classes=2), Saving(Path("checkpoints")), Recipe()
    assert tuple(plan.thresholds) == tuple(default.run.thresholds) and plan.progress == default.run.progress
    assert (plan.accumulate, plan.on_nan, plan.clip_grad_norm) == (
        default.train.accumulate, default.train.on_nan, default.train.clip_grad_norm,
    )  # fmt: skip
    assert (plan.eval_every_steps, plan.mid_eval) == (default.train.eval_every_steps, default.train.mid_eval)
    assert (saving.every_epochs, saving.every_steps, saving.keep) == (
        default.run.save_every, default.run.save_every_steps, default.run.keep,
    )  # fmt: skip


def test_a_run_records_its_times_to_fractions_of_its_best_accuracy(tiny_overrides):
    summary = hasten.train(None, [*tiny_overrides, "train.epochs=2", "run.tensorboard=false"])
    milestones = summary["time_to_fraction_of_best"]
    best = max(point[2] for point in summary["accuracy_curve"])
    assert list(milestones) == ["0.50", "0.75", "0.90", "0.95", "0.99"]
    for key, reached in milestones.items():
        assert reached["accuracy"] == pytest.approx(float(key) * best)
        first = next(point for point in summary["accuracy_curve"] if point[2] >= reached["accuracy"])
        assert (reached["train_seconds"], reached["wall_seconds"]) == (first[0], first[3])
