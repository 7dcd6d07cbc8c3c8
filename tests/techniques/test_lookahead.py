"""Lookahead (tricks.lookahead_steps, tricks.lookahead_alpha): the update's exact values, the hook in the loop the
recipe builds (against the same run without it), its composition with the EMA, an exact mid-cycle resume, and bad
values as recipe errors naming the field."""

from __future__ import annotations

import pytest
import torch

import hasten
from hasten.errors import RecipeError
from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.runfolder.log import RunLog
from hasten.techniques.lookahead import lookahead_update
from tests.resuming import final_checkpoint, resume_into


def test_lookahead_update_moves_slow_alpha_of_the_way_and_resets_fast():
    slow = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([[4.0]])]
    fast = [torch.tensor([4.0, -1.0, 2.0]), torch.tensor([[0.0]])]
    lookahead_update(slow, fast, 0.25)
    assert torch.equal(slow[0], torch.tensor([1.0, 0.5, 2.0])) and torch.equal(slow[1], torch.tensor([[3.0]]))
    assert all(torch.equal(s, f) for s, f in zip(slow, fast, strict=True))
    assert slow[0].data_ptr() != fast[0].data_ptr()  # copies, not the same storage
    lookahead_update(slow, fast, 1.0)  # alpha 1: the slow weights become the fast ones, nothing moves
    assert torch.equal(slow[0], torch.tensor([1.0, 0.5, 2.0]))


def two_steps(tiny_overrides: list[str], *overrides: str) -> tuple[dict, dict]:
    """The parameters before and the model's state after two optimizer steps on the same batch."""
    parts = build(
        load_recipe("fashion-fast", [*tiny_overrides, "data.synthetic_size=64", "precision=fp32", *overrides])
    )
    before = {name: p.detach().clone() for name, p in parts.model.named_parameters()}
    trainer = trainer_for(parts, Plan(epochs=1, num_classes=10, progress=False), RunLog("", enabled=False))
    images, labels = next(iter(parts.train_loader))
    for _ in range(2):
        trainer.train_step(images, labels)
    return before, {name: value.detach().clone() for name, value in parts.model.state_dict().items()}


def test_every_k_steps_the_weights_are_pulled_back_towards_the_slow_copy(tiny_overrides):
    start, plain = two_steps(tiny_overrides)
    same_start, pulled = two_steps(tiny_overrides, "tricks.lookahead_steps=2", "tricks.lookahead_alpha=0.25")
    assert all(torch.equal(start[name], same_start[name]) for name in start)
    for name, value in pulled.items():
        if name in start:  # parameters: a quarter of the way from the start to where plain SGD went
            assert torch.allclose(value, start[name] + 0.25 * (plain[name] - start[name]), atol=1e-6), name
        else:  # buffers (batch-norm statistics) are not averaged
            assert torch.equal(value, plain[name]), name
    moved = [name for name in start if not torch.equal(plain[name], start[name])]
    assert moved and any(not torch.allclose(pulled[name], plain[name]) for name in moved)


def test_not_yet_k_steps_leaves_the_weights_alone(tiny_overrides):
    _, plain = two_steps(tiny_overrides)
    _, waiting = two_steps(tiny_overrides, "tricks.lookahead_steps=3")
    assert all(torch.equal(waiting[name], plain[name]) for name in plain)


def test_two_step_run_with_the_ema_checkpoints_both(tiny_overrides, tmp_path):
    run = tmp_path / "r"
    tiny = ["data.synthetic_size=32", "train.epochs=1", f"run.dir={run}", "tricks.ema=0.9"]
    summary = hasten.train(None, [*tiny_overrides, *tiny, "tricks.lookahead_steps=2", "tricks.lookahead_alpha=0.5"])
    assert summary["epochs"] == 1
    state = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    assert set(state["hooks"]) == {"ema", "lookahead"}
    lookahead = state["hooks"]["lookahead"]
    assert lookahead["taken"] == 2
    names = [name for name, _ in build(load_recipe(None, [*tiny_overrides, *tiny])).model.named_parameters()]
    assert len(lookahead["slow"]) == len(names)  # the parameters, in order; no buffers
    assert all(torch.equal(s, state["model"][n]) for s, n in zip(lookahead["slow"], names, strict=True))  # synced
    assert int(state["hooks"]["ema"]["n_averaged"]) == 2


def test_resume_mid_cycle_is_exact(tiny_overrides, tmp_path):
    common = [*tiny_overrides, "tricks.lookahead_steps=4", "run.save_every_steps=7", "run.keep=100"]
    whole = tmp_path / "whole"
    hasten.train(None, [*common, f"run.dir={whole}"])
    middle = whole / "checkpoints" / "step-35.pt"  # 35 = 8 x 4 + 3: the slow copy is 3 steps behind
    saved = load_checkpoint(middle)["hooks"]["lookahead"]
    assert saved["taken"] == 35
    resumed = resume_into(tmp_path / "resumed", None, common, middle, metrics_from=whole)
    a, b = final_checkpoint(whole), final_checkpoint(resumed)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(
        torch.equal(x, y) for x, y in zip(a["hooks"]["lookahead"]["slow"], b["hooks"]["lookahead"]["slow"], strict=True)
    )


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["tricks.lookahead_steps=-1"], "tricks.lookahead_steps"),
        (["tricks.lookahead_alpha=0"], "tricks.lookahead_alpha"),
        (["tricks.lookahead_alpha=1.5"], "tricks.lookahead_alpha"),
        (["tricks.lookahead_steps=5", "precision=fp16-master"], "tricks.lookahead_steps: .*fp16-master"),
    ],
)
def test_bad_values_are_recipe_errors_naming_the_field(overrides, field):
    with pytest.raises(RecipeError, match=field):
        load_recipe("fashion-fast", overrides)
