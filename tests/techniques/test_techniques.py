"""Technique objects wired into a built run: each test fails when its technique's hook is not called by the loop
the recipe builds (mixup and cutmix change the batch the model sees, label smoothing the loss, the EMA's copy
moves away from the live weights, zero-init zeroes the gammas, no-bias-decay splits the optimizer's groups), and
every technique's state round-trips through a checkpoint made by `trainer_for`, whatever built the Trainer."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from hasten.models import Residual
from hasten.recipe.schema import load_recipe
from hasten.run.assemble import Parts
from hasten.run.build import build, trainer_for
from hasten.run.plan import Hooks, Plan, Saving
from hasten.runfolder.checkpoint import load_checkpoint, save_checkpoint
from hasten.runfolder.log import RunLog
from hasten.techniques import Context, Technique, one_hot, smooth, soft_cross_entropy, techniques


def built(tiny_overrides: list[str], *overrides: str) -> Parts:
    return build(load_recipe("fashion-fast", [*tiny_overrides, "data.synthetic_size=64", "precision=fp32", *overrides]))


def plan_for(parts: Parts) -> Plan:
    return Plan(epochs=1, num_classes=len(parts.data.classes), progress=False, measure_step_memory=False)


def seen_by_model(parts: Parts, images: Tensor, labels: Tensor) -> Tensor:
    """The images the model's forward received in one `train_step` of the run `trainer_for` builds."""
    seen = []
    handle = parts.model.register_forward_pre_hook(lambda _module, args: seen.append(args[0].detach().clone()))
    try:
        trainer_for(parts, plan_for(parts), RunLog("", enabled=False)).train_step(images, labels)
    finally:
        handle.remove()
    return seen[0]


def a_batch(parts: Parts) -> tuple[Tensor, Tensor]:
    images, labels = next(iter(parts.train_loader))
    return images.clone(), labels.clone()


def test_mixup_changes_the_batch_the_model_sees(tiny_overrides):
    plain = built(tiny_overrides)
    images, labels = a_batch(plain)
    assert torch.equal(seen_by_model(plain, images, labels), images)  # the probe itself: no technique, no change
    mixed = built(tiny_overrides, "tricks.mixup=0.4")
    seen = seen_by_model(mixed, images, labels)
    assert seen.shape == images.shape and not torch.equal(seen, images)
    # a blend of two images of the batch: inside the pixel range of the batch, not a new value range
    assert seen.min() >= images.min() - 1e-5 and seen.max() <= images.max() + 1e-5


def test_cutmix_pastes_a_box_of_another_image(tiny_overrides):
    parts = built(tiny_overrides, "tricks.cutmix=1.0")
    images, labels = a_batch(parts)
    seen = seen_by_model(parts, images, labels)
    changed = (seen != images).any(0).any(0)  # (H, W): pixels changed in some image
    assert changed.any() and not changed.all()  # a box, not the whole image
    rows, cols = changed.any(1).nonzero().flatten(), changed.any(0).nonzero().flatten()
    box = changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    assert box.all()  # the changed pixels form one rectangle
    # outside the box every image is untouched; inside, each image holds pixels of another image of the batch
    assert torch.equal(seen[..., ~changed], images[..., ~changed])
    first = seen[0, :, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    patches = images[:, :, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    assert any(torch.equal(first, patch) for patch in patches)


@pytest.mark.numerics
def test_label_smoothing_changes_the_loss_to_the_smoothed_one(tiny_overrides):
    losses = {}
    for eps in (0.0, 0.3):
        parts = built(tiny_overrides, f"tricks.label_smoothing={eps}")
        images, labels = a_batch(parts)
        model = copy.deepcopy(parts.model)  # the weights before the step, in training mode as the step runs it
        with torch.no_grad():
            expected = soft_cross_entropy(model(images), smooth(one_hot(labels, 10), eps))
        losses[eps], _ = trainer_for(parts, plan_for(parts), RunLog("", enabled=False)).train_step(images, labels)
        assert losses[eps].item() == pytest.approx(expected.item(), rel=1e-5)
    assert losses[0.3].item() != pytest.approx(losses[0.0].item(), rel=1e-3)


def test_the_ema_copy_moves_away_from_the_live_weights_and_is_evaluated(tiny_overrides):
    parts = built(tiny_overrides, "tricks.ema=0.5")
    trainer = trainer_for(parts, plan_for(parts), RunLog("", enabled=False))
    batches = iter(parts.train_loader)
    for _ in range(3):  # the first update copies; the later ones average
        trainer.train_step(*next(batches))
    live = dict(parts.model.named_parameters())
    averaged = parts.hooks.eval_model(parts.model)
    assert averaged is not parts.model
    differs = [name for name, p in averaged.named_parameters() if not torch.equal(p, live[name])]
    assert differs  # the average lags the live weights
    assert set(parts.hooks.stateful) == {"ema"} and int(parts.hooks.stateful["ema"].averaged.n_averaged) == 3


def test_zero_init_zeroes_the_last_gamma_of_each_residual_block(tiny_overrides):
    def gammas(parts: Parts) -> list[Tensor]:
        return [m.last_bn.weight for m in parts.model.modules() if isinstance(m, Residual)]

    zeroed, kept = gammas(built(tiny_overrides, "model.zero_init_residual=true")), gammas(built(tiny_overrides))
    assert len(zeroed) == len(kept) == 3  # one residual block per stage (model.blocks=[1, 1, 1]): all() of none passes
    assert all(torch.count_nonzero(g) == 0 for g in zeroed)
    assert all(torch.count_nonzero(g) > 0 for g in kept)


def test_no_bias_decay_splits_the_built_optimizers_groups(tiny_overrides):
    muon = built(tiny_overrides, "optim.no_bias_decay=true", "optim.weight_decay=0.001", "optim.name=muon")
    for group in muon.optimizer.param_groups:  # the filters' Muon groups and the SGD ones alike
        assert group["weight_decay"] == (0.001 if all(p.ndim > 1 for p in group["params"]) else 0.0)
    tiny_overrides = [*tiny_overrides, "optim.name=sgd"]
    parts = built(tiny_overrides, "optim.no_bias_decay=true", "optim.weight_decay=0.001")
    decayed, undecayed = parts.optimizer.param_groups
    assert decayed["weight_decay"] == 0.001 and undecayed["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim == 1 for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(parts.model.parameters()))
    (only,) = built(tiny_overrides, "optim.no_bias_decay=false").optimizer.param_groups
    assert len(only["params"]) == len(list(parts.model.parameters()))


def states(hooks: Hooks) -> dict[str, Any]:
    return {name: copy.deepcopy(technique.state_dict()) for name, technique in hooks.stateful.items()}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


def test_every_techniques_state_round_trips_through_a_trainer_for_checkpoint(tiny_overrides, tmp_path):
    tricks = ["tricks.mixup=0.4", "tricks.cutmix=1.0", "tricks.ema=0.9", "tricks.label_smoothing=0.1"]
    overrides = [*tricks, "train.freeze_epochs=1", "model.zero_init_residual=true"]
    parts = built(tiny_overrides, *overrides)
    saving = Saving(tmp_path / "checkpoints")
    trainer = trainer_for(parts, plan_for(parts), RunLog("", enabled=False), saving)  # no hand-merged state
    batches = iter(parts.train_loader)
    for _ in range(2):
        trainer.train_step(*next(batches))
    state = trainer.state_dict()
    assert set(state["hooks"]) == {"ema", "freeze"}  # shared by the ranks
    assert set(state["ranks"][0]["hooks"]) == {"mixing"}  # one stream per rank
    path = save_checkpoint(state, tmp_path / "step-2.pt")
    saved = states(parts.hooks)
    images, labels = next(batches)

    fresh = built(tiny_overrides, *overrides)
    assert int(fresh.hooks.stateful["freeze"].steps) == 0
    resumed = trainer_for(fresh, plan_for(fresh), RunLog("", enabled=False), Saving(tmp_path / "other"))
    resumed.load_state_dict(load_checkpoint(path), str(path))  # torch.load(weights_only=True) inside
    assert_same(states(fresh.hooks), saved)
    # and they act the same from there: the next step's mixing draw and update agree bitwise
    expected = seen_by_model(parts, images.clone(), labels)
    assert torch.equal(seen_by_model(fresh, images.clone(), labels), expected)


class Negate(Technique):
    """A technique defined outside hasten, as a new one would be: wired by build with no other file changed."""

    name, hooks, stateful = "negate_probe", frozenset({"on_batch", "after_step"}), True

    def __init__(self) -> None:
        self.steps = 0

    @classmethod
    def from_recipe(cls, recipe: Any, context: Context) -> Negate | None:
        return cls() if recipe.name == "negate-probe" else None  # off for every other recipe in the suite

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        return -images, y_soft

    def after_step(self, model: nn.Module) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def test_a_new_technique_is_wired_and_checkpointed_by_declaring_itself(tiny_overrides):
    parts = built(tiny_overrides, "name=negate-probe")
    images, labels = a_batch(parts)
    assert torch.equal(seen_by_model(parts, images, labels), -images)
    trainer = trainer_for(parts, plan_for(parts), RunLog("", enabled=False))
    trainer.train_step(images, labels)
    assert trainer.state_dict()["hooks"]["negate_probe"] == {"steps": 2}  # one step here, one in the probe


def test_a_technique_must_define_the_hooks_it_declares():
    with pytest.raises(TypeError, match="hook point"):

        class Broken(Technique):  # declares on_batch, defines none
            name, hooks = "broken", frozenset({"on_batch"})

    with pytest.raises(TypeError, match="unknown hook point"):

        class Misspelt(Technique):
            name, hooks = "misspelt", frozenset({"before_batch"})


def test_techniques_follow_the_recipe(tiny_overrides):
    recipe = load_recipe(
        "fashion-fast", [*tiny_overrides, "tricks.mixup=0.2", "tricks.ema=0", "optim.no_bias_decay=false"]
    )
    names = [t.name for t in techniques(recipe, Context(rank=1))]
    assert names == ["label_smoothing", "mixing"]  # fashion-fast smooths; mixup asked; EMA and no-bias-decay off
    mixing = techniques(recipe, Context(rank=1))[1]
    assert mixing.rng.bit_generator.state == np.random.default_rng([recipe.seed, 1]).bit_generator.state
