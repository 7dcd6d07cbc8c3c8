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
from torch.optim.optimizer import register_optimizer_step_pre_hook

import hasten
from hasten import cli
from hasten.recipe.schema import load_recipe
from hasten.run import assemble as assemble_module
from hasten.run import build as build_module
from hasten.run import resolve as resolve_module

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
