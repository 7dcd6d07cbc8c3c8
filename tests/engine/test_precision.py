"""Precision modes: inf/NaN steps are skipped with the schedule held, the scale halves and grows as configured;
fp16-master keeps fp32 masters beside fp16 weights and follows fp32's trajectory; every mode trains."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import hasten
from hasten.engine.precision import MODES, FP16Master, make_precision
from hasten.errors import RecipeError
from hasten.recipe.schema import PRECISION_MODES
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 3))


def make_trainer(precision_name: str, growth_interval: int = 3, init_scale: float = 2.0**8) -> Trainer:
    device = torch.device("cpu")
    precision = make_precision(precision_name, device, init_scale=init_scale, growth_interval=growth_interval)
    model = precision.prepare(tiny_model())
    groups = [{"params": list(model.parameters()), "weight_decay": 1e-4}]
    optimizer = torch.optim.SGD(precision.optimizer_groups(groups), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.98**step)
    plan = Plan(epochs=1, num_classes=3, progress=False, measure_step_memory=False)
    return Trainer(model, optimizer, scheduler, precision, (None, None), plan, RunLog("", enabled=False))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """32 inputs of shape (1, 4, 4) labelled by a fixed linear rule, so there is something to learn."""
    images = torch.randn(32, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    rule = torch.randn(16, 3, generator=torch.Generator().manual_seed(1234))
    return images, (images.flatten(1) @ rule).argmax(1)


def snapshot(trainer: Trainer) -> dict:
    return copy.deepcopy(
        {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "masters": [p.detach() for g in trainer.optimizer.param_groups for p in g["params"]],
        }
    )


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("mode", ["fp16", "fp16-master"])
def test_inf_gradient_skips_the_step_halves_the_scale_and_holds_the_schedule(mode):
    trainer = make_trainer(mode, growth_interval=3, init_scale=256.0)
    inject = {"now": False}
    first_linear = trainer.model[1].weight
    first_linear.register_hook(lambda g: torch.full_like(g, float("inf")) if inject["now"] else g)

    for s in range(2):  # two clean steps: the scale holds (growth after 3)
        trainer.train_step(*batch(s))
    assert trainer.precision.loss_scale == 256.0 and trainer.state.step == 2

    before, lr_before, epoch_before = snapshot(trainer), trainer.optimizer.param_groups[0]["lr"], None
    epoch_before = trainer.scheduler.last_epoch
    inject["now"] = True
    trainer.train_step(*batch(2))  # step s = 2: an inf gradient
    inject["now"] = False
    # BatchNorm's running statistics move in the forward pass whatever the step does; compare the rest
    after = snapshot(trainer)
    for key in [k for k in before["model"] if "running" in k or "num_batches" in k]:
        del before["model"][key], after["model"][key]
    assert_same(before, after)
    assert trainer.precision.loss_scale == 128.0
    assert trainer.scheduler.last_epoch == epoch_before
    assert trainer.optimizer.param_groups[0]["lr"] == lr_before
    assert trainer.state.step == 2 and trainer.state.skipped_steps == 1

    scales = []
    for s in range(3, 9):
        trainer.train_step(*batch(s))
        scales.append(trainer.precision.loss_scale)
    assert scales == [128.0, 128.0, 256.0, 256.0, 256.0, 512.0]  # doubles after every 3 clean steps
    assert trainer.state.step == 8 and trainer.scheduler.last_epoch == epoch_before + 6


def test_fp16_master_holds_fp32_masters_beside_fp16_weights():
    trainer = make_trainer("fp16-master")
    model, precision = trainer.model, trainer.precision
    assert model[1].weight.dtype == torch.float16 and model[4].weight.dtype == torch.float16
    assert model[2].weight.dtype == torch.float32  # BatchNorm stays fp32
    masters = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in masters)
    assert not any(m is p for m in masters for p in model.parameters())
    for s in range(3):
        trainer.train_step(*batch(s))
    assert model[1].weight.dtype == torch.float16
    for weight, master in precision.pairs:
        assert master.dtype == torch.float32 and weight.grad is None
        assert torch.equal(weight, master.to(weight.dtype))  # the fp16 weights are the rounded masters
    out = model(torch.randn(4, 1, 4, 4))
    assert out.dtype == torch.float32  # fp32 in, fp32 out


@pytest.mark.numerics
def test_fp16_master_follows_the_fp32_trajectory():
    def losses_and_weights(mode: str) -> tuple[list[float], torch.Tensor]:
        trainer = make_trainer(mode, growth_interval=1000)
        losses = [trainer.train_step(*batch(s % 4))[0].item() for s in range(30)]
        return losses, trainer.model[4].weight.detach().float()

    fp32_losses, fp32_weight = losses_and_weights("fp32")
    half_losses, half_weight = losses_and_weights("fp16-master")
    assert half_losses[-1] < 0.6 * half_losses[0]  # it learns
    assert max(abs(a - b) for a, b in zip(fp32_losses, half_losses, strict=True)) < 0.02
    assert (half_weight - fp32_weight).norm() < 0.01 * fp32_weight.norm()


def test_fp16_master_state_dict_restores_scale_and_masters():
    trainer = make_trainer("fp16-master")
    for s in range(2):
        trainer.train_step(*batch(s))
    state = copy.deepcopy(trainer.precision.state_dict())
    other = make_trainer("fp16-master")
    other.precision.load_state_dict(state)
    assert other.precision.loss_scale == trainer.precision.loss_scale
    for (weight, master), (other_weight, other_master) in zip(
        trainer.precision.pairs, other.precision.pairs, strict=True
    ):
        assert torch.equal(master, other_master) and torch.equal(weight, other_weight)


def test_fp16_master_without_its_optimizer_groups_is_a_clear_error():
    precision = FP16Master(torch.device("cpu"))
    model = precision.prepare(tiny_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(batch(0)[0]).sum())
    with pytest.raises(RuntimeError, match="optimizer_groups"):
        precision.step(optimizer)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("mode", ["bf16", "fp16", "fp16-master"])
def test_a_mode_the_device_cannot_run_fails_naming_mode_and_device(mode):
    with pytest.raises(RecipeError, match=f"precision: {mode} cannot run on cuda"):
        make_precision(mode, torch.device("cuda"))


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16", "fp16-master"])
def test_each_mode_in_a_two_step_run(mode, tiny_overrides, tmp_path):
    two_steps = ["data.subset=32", "data.test_subset=64", "train.epochs=1", "loss_scale.init=1024"]
    summary = hasten.train("fashion-fast", [*tiny_overrides, *two_steps, f"precision={mode}"])
    assert summary["steps"] + summary["skipped_steps"] == 2
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["peak_step_memory_bytes"] > 0 and saved["peak_memory_bytes"] > 0


def test_the_engine_implements_exactly_the_recipes_modes():
    """The recipe names the modes (PRECISION_MODES); the engine has one class for each, in the same order."""
    assert tuple(MODES) == PRECISION_MODES == ("fp32", "bf16", "fp16", "fp16-master")
