"""Cutout: the function against a hand-made mask, and the technique wired into a built run by its recipe key."""

from __future__ import annotations

import numpy as np
import torch

from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.log import RunLog
from hasten.techniques.cutout import Cutout, cutout


def test_cutout_zeroes_the_square_clipped_at_the_border():
    x = torch.ones(2, 1, 5, 5)
    out = cutout(x, torch.tensor([[2, 2], [0, 4]]), 3)
    first = torch.ones(5, 5)
    first[1:4, 1:4] = 0  # centred
    second = torch.ones(5, 5)
    second[0:2, 3:5] = 0  # clipped at the top right corner
    assert torch.equal(out[0, 0], first) and torch.equal(out[1, 0], second)
    assert torch.equal(x, torch.ones(2, 1, 5, 5))  # not in place


def test_cutout_draws_repeat_from_its_state():
    images, y = torch.randn(4, 1, 8, 8), torch.eye(4)
    first = Cutout(4, np.random.default_rng(3))
    state = first.state_dict()
    a, targets = first.on_batch(images, y)
    second = Cutout(4, np.random.default_rng(99))
    second.load_state_dict(state)
    assert torch.equal(second.on_batch(images, y)[0], a) and targets is y
    assert ((a == 0) & (images != 0)).flatten(1).sum(1).min() >= 4  # every image lost at least a 2x2 corner


def test_cutout_is_wired_by_its_recipe_key_and_checkpointed(tiny_overrides):
    parts = build(load_recipe("fashion-fast", [*tiny_overrides, "data.synthetic_size=32", "tricks.cutout=6"]))
    images, labels = next(iter(parts.train_loader))
    seen = []
    parts.model.register_forward_pre_hook(lambda _module, args: seen.append(args[0].detach().clone()))
    trainer = trainer_for(parts, Plan(epochs=1, num_classes=10, progress=False), RunLog("", enabled=False))
    trainer.train_step(images, labels)
    zeroed = (seen[0] == 0) & (images != 0)
    assert zeroed.any() and not zeroed.all()
    assert set(trainer.state_dict()["ranks"][0]["hooks"]) == {"cutout"}
