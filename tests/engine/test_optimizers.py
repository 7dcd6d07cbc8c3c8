"""optim.name=muon (hasten/engine/optimizers.py): the Newton-Schulz iteration and the filters' step against
torch.optim.Muon on the reshaped matrix, the other parameters against torch.optim.SGD, the schedule driving both kinds
of group (one-cycle's momentum leaving Muon's alone), a two-step run, fp16-master, checkpoint round trips and bad
recipes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hasten
from hasten.engine.optimizers import (
    Muon,
    gram_form_pays,
    muon_groups,
    newton_schulz,
    newton_schulz_dtype,
    orthogonalize,
    torch_newton_schulz,
)
from hasten.errors import RecipeError
from hasten.machine import PROFILES
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from tests.resuming import final_weights, resume_into

needs_torch_muon = pytest.mark.skipif(torch_newton_schulz is None, reason="this torch has no torch.optim.Muon")


@pytest.mark.numerics
@needs_torch_muon
@pytest.mark.parametrize("shape", [(4, 27), (27, 4), (5, 5)])
def test_newton_schulz_is_torchs_iteration_and_nearly_orthogonal(shape):
    matrix = torch.randn(shape)
    ours = newton_schulz(matrix)
    assert torch.equal(ours, torch_newton_schulz(matrix.clone(), (3.4445, -4.7750, 2.0315), 5, 1e-7))
    singular = torch.linalg.svdvals(ours.float())
    assert singular.min() > 0.5 and singular.max() < 1.5  # Jordan's quintic: near 1, not exactly


@needs_torch_muon
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("nesterov", [True, False])
def test_filter_step_is_torch_muon_on_the_reshaped_matrix(channels_last, nesterov):
    filters = nn.Parameter(torch.randn(4, 3, 3, 3))
    if channels_last:
        filters.data = filters.data.to(memory_format=torch.channels_last)
    matrix = nn.Parameter(filters.detach().reshape(4, 27).clone())
    ours = Muon([{"params": [filters], "orthogonalize": True}], lr=0.1, momentum=0.9, nesterov=nesterov,
                weight_decay=0.01, ns_dtype=torch.bfloat16)  # fmt: skip
    theirs = torch.optim.Muon([matrix], lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    for _ in range(3):
        grad = torch.randn(4, 3, 3, 3)
        filters.grad = grad.to(memory_format=torch.channels_last) if channels_last else grad
        matrix.grad = grad.reshape(4, 27)
        ours.step()
        theirs.step()
        assert torch.equal(filters.detach().reshape(4, 27), matrix.detach())
    assert filters.is_contiguous(memory_format=torch.channels_last) == channels_last  # its layout kept
    assert torch.equal(ours.state[filters]["momentum_buffer"], theirs.state[matrix]["momentum_buffer"])


@pytest.mark.machine
def test_newton_schulz_runs_in_float32_on_a_cpu_and_in_bfloat16_on_a_gpu_that_has_it():
    for profile in PROFILES.values():
        assert newton_schulz_dtype("cpu", profile) == torch.float32
    assert newton_schulz_dtype("cuda", PROFILES["cuda"]) == torch.bfloat16
    assert newton_schulz_dtype("cuda", PROFILES["cuda-fp16"]) == torch.float32  # no bf16 on that GPU
    matrix = torch.randn(8, 36)
    cpu = orthogonalize(matrix)
    assert cpu.dtype == torch.float32 and torch.equal(cpu, newton_schulz(matrix, dtype=torch.float32))
    singular = torch.linalg.svdvals(cpu)
    assert singular.min() > 0.5 and singular.max() < 1.5
    assert not torch.equal(cpu, orthogonalize(matrix, torch.bfloat16).float())  # a real difference of precision


@pytest.mark.parametrize("ns_dtype", [None, torch.float32])
def test_a_cpu_filter_step_orthogonalises_in_float32(ns_dtype):
    filters = nn.Parameter(torch.randn(4, 3, 3, 3))
    start = filters.detach().clone()
    ours = Muon([{"params": [filters], "orthogonalize": True}], lr=0.1, momentum=0.9, nesterov=True, ns_dtype=ns_dtype)
    grad = torch.randn(4, 3, 3, 3)
    filters.grad = grad
    ours.step()
    flat = grad.reshape(4, 27)
    buffer = torch.zeros(4, 27).lerp_(flat, 1 - 0.9)  # the momentum, from zeros; then Nesterov's look-ahead
    expected = start.reshape(4, 27).add(newton_schulz(flat.lerp(buffer, 0.9), dtype=torch.float32), alpha=-0.1)
    assert torch.equal(filters.detach().reshape(4, 27), expected)


@pytest.mark.parametrize("shape", [(16, 144), (144, 16), (5, 5)])
def test_a_stack_of_matrices_is_orthogonalised_as_each_alone(shape):
    stack = torch.randn(3, *shape)
    stack[1] *= 1e3  # each scaled by its own norm: a large one beside small ones changes nothing for them
    together = newton_schulz(stack, dtype=torch.float32)
    for matrix, result in zip(stack, together, strict=True):
        torch.testing.assert_close(result, newton_schulz(matrix, dtype=torch.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(32, 288), (288, 32), (3, 64, 576), (2, 32, 128)])
def test_the_gram_form_is_the_direct_iteration(shape):
    """float32 matrices at least 32 high and four times as wide (or the transpose) iterate on their Gram matrix: the
    same matrix as the direct loop to float32's rounding, and as nearly orthogonal."""
    matrix = torch.randn(*shape)
    rows, cols = sorted(shape[-2:])
    assert gram_form_pays(rows, cols, torch.float32)
    gram = newton_schulz(matrix, dtype=torch.float32)
    torch.testing.assert_close(gram, newton_schulz(matrix, dtype=torch.float32, gram=False), rtol=1e-4, atol=2e-5)
    assert not torch.equal(gram, newton_schulz(matrix, dtype=torch.float32, gram=False))  # the other form ran
    wide = gram if shape[-2] <= shape[-1] else gram.mT
    singular = torch.linalg.svdvals(wide)
    assert singular.min() > 0.5 and singular.max() < 1.5  # the quintic's band


def test_the_gram_form_is_taken_only_where_it_saves_work():
    assert gram_form_pays(64, 576, torch.float32) and gram_form_pays(32, 128, torch.float32)
    assert not gram_form_pays(16, 144, torch.float32)  # small products: their count costs more than the arithmetic
    assert not gram_form_pays(64, 255, torch.float32)  # not four times as wide
    assert not gram_form_pays(64, 576, torch.bfloat16)  # bfloat16 stays torch.optim.Muon's own sequence
    matrix = torch.randn(16, 144)
    direct = newton_schulz(matrix, dtype=torch.float32, gram=False)
    assert torch.equal(newton_schulz(matrix, dtype=torch.float32), direct)


@pytest.mark.parametrize("channels_last", [False, True])
def test_filter_banks_of_one_shape_step_together_as_each_would_alone(channels_last):
    """Three banks of one shape (orthogonalised in one batch) and one of another: after three steps each is where
    a Muon holding it alone puts it, momentum buffers too."""
    shapes = [(8, 4, 3, 3), (8, 4, 3, 3), (16, 8, 3, 3), (8, 4, 3, 3)]
    banks = [nn.Parameter(torch.randn(shape)) for shape in shapes]
    if channels_last:
        for bank in banks:
            bank.data = bank.data.to(memory_format=torch.channels_last)
    alone = [nn.Parameter(bank.detach().clone()) for bank in banks]
    settings = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    together = Muon([{"params": banks, "orthogonalize": True}], **settings)
    singles = [Muon([{"params": [bank], "orthogonalize": True}], **settings) for bank in alone]
    for _ in range(3):
        for bank, single in zip(banks, alone, strict=True):
            bank.grad = torch.randn_like(bank)
            single.grad = bank.grad.clone()
        together.step()
        for optimizer in singles:
            optimizer.step()
    for bank, single, optimizer in zip(banks, alone, singles, strict=True):
        torch.testing.assert_close(bank.detach(), single.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(together.state[bank]["momentum_buffer"], optimizer.state[single]["momentum_buffer"])
        assert bank.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert not torch.equal(banks[0].detach(), banks[1].detach())  # each bank its own update


def tiny_net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_other_parameters_take_torchs_nesterov_sgd_step():
    net = tiny_net()
    reference = copy.deepcopy(net)
    groups = muon_groups([{"params": list(net.parameters()), "weight_decay": 1e-3}], 0.1, 0.02, 0.95)
    assert [len(g["params"]) for g in groups] == [5, 1]  # conv bias, BN scale and shift, head weight and bias; filters
    assert [g.get("orthogonalize", False) for g in groups] == [False, True] and groups[1]["lr"] == 0.02
    ours = Muon(groups, lr=0.1, momentum=0.9, nesterov=True)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    for _ in range(3):  # the same gradients for both (backpropagated ones would differ once the filters do)
        for mine, theirs in zip(net.parameters(), reference.parameters(), strict=True):
            mine.grad = torch.randn_like(mine)
            theirs.grad = mine.grad.clone()
        ours.step()
        sgd.step()
    mine, theirs = dict(net.named_parameters()), dict(reference.named_parameters())
    assert all(torch.equal(mine[n], theirs[n]) for n in mine if n != "0.weight")
    assert not torch.allclose(mine["0.weight"], theirs["0.weight"])  # the filters followed Muon instead


def test_state_dict_round_trip_continues_identically():
    net = tiny_net()
    make = lambda model: Muon(muon_groups([{"params": list(model.parameters())}], 0.1, 0.05, 0.9), lr=0.1)  # noqa: E731
    first = make(net)
    x = torch.randn(8, 1, 6, 6)

    def step(model, optimizer):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step(net, first)
    twin = copy.deepcopy(net)
    second = make(twin)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    assert second.param_groups[1]["orthogonalize"] and second.param_groups[1]["momentum"] == 0.9
    for model, optimizer in ((net, first), (twin, second)):
        step(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), twin.parameters(), strict=True))


def test_schedule_drives_both_lrs_and_cycles_only_sgd_momentum(tiny_overrides):
    recipe = ["data.synthetic_size=64", "optim.name=muon", "optim.muon_lr=0.03", "optim.muon_momentum=0.6"]
    parts = build(load_recipe("fashion-fast", [*tiny_overrides, *recipe]))  # one-cycle, momentum [0.85, 0.95]
    groups = parts.optimizer.param_groups
    sgd, muon = [g for g in groups if not g["orthogonalize"]], [g for g in groups if g["orthogonalize"]]
    assert sgd and muon and not groups[0]["orthogonalize"]  # the logged LR (the first group's) is optim.lr's
    assert all(g["initial_lr"] == pytest.approx(parts.lr) for g in sgd)  # scaled by the batch rule
    assert all(g["initial_lr"] == 0.03 for g in muon)  # not scaled
    for _ in range(3):
        parts.scheduler.step()
    multiplier = parts.scheduler.lr(parts.scheduler.progress)
    assert 0 < multiplier < 1
    assert all(g["lr"] == pytest.approx(parts.lr * multiplier) for g in sgd)
    assert all(g["lr"] == pytest.approx(0.03 * multiplier) for g in muon)
    assert all(0.85 < g["momentum"] < 0.95 for g in sgd)  # cycled
    assert all(g["momentum"] == 0.6 for g in muon)  # kept


@pytest.mark.parametrize("precision", ["fp32", "fp16-master"])
def test_two_step_run_moves_the_filters_by_muon(tiny_overrides, tmp_path, precision):
    run = tmp_path / "r"
    two_steps = ["data.synthetic_size=32", "train.epochs=1", f"run.dir={run}", f"precision={precision}"]
    hasten.train(None, [*tiny_overrides, *two_steps, "optim.name=muon", "loss_scale.init=64"])
    state = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    assert state["trainer"]["step"] == 2 and state["trainer"]["skipped_steps"] == 0
    groups = state["optimizer"]["param_groups"]
    filters = [i for g in groups if g["orthogonalize"] for i in g["params"]]
    buffers = [state["optimizer"]["state"][i]["momentum_buffer"] for i in filters]
    assert filters and all(b.ndim == 2 and b.abs().sum() > 0 for b in buffers)  # (out, in*k*k) momentum, used


def test_resume_mid_run_is_exact(tiny_overrides, tmp_path):
    common = [*tiny_overrides, "data.synthetic_size=128", "optim.name=muon", "run.save_every_steps=5", "run.keep=100"]
    whole = tmp_path / "whole"
    hasten.train(None, [*common, f"run.dir={whole}"])
    middle = whole / "checkpoints" / "step-10.pt"  # 8 steps an epoch: mid-epoch 2, Muon's momentum in flight
    resumed = resume_into(tmp_path / "resumed", None, common, middle, metrics_from=whole)
    a, b = final_weights(whole), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["optim.name=muon", "optim.lr=auto"], "optim.lr: auto is not available with optim.name=muon"),
        (["optim.muon_lr=0"], "optim.muon_lr"),
        (["optim.muon_momentum=1"], "optim.muon_momentum"),
        (["optim.name=lion"], "optim.name"),
    ],
)
def test_bad_values_are_recipe_errors_naming_the_field(overrides, field):
    with pytest.raises(RecipeError, match=field):
        load_recipe("fashion-fast", overrides)


def test_a_model_without_filters_trains_all_of_it_by_nesterov_sgd(tiny_overrides, capsys):
    """The default recipe's optimizer on a user's MLP: nothing to orthogonalise, so every parameter is the SGD part."""
    dense = ["model.name=sequential", "model.layers=[flatten, {dense: classes}]", "optim.name=muon"]
    parts = build(load_recipe("fashion-fast", [*tiny_overrides, "data.synthetic_size=32", *dense]))
    assert "no trainable convolution filters" in capsys.readouterr().err
    assert not any(group.get("orthogonalize") for group in parts.optimizer.param_groups)
    before = [p.detach().clone() for p in parts.model.parameters()]
    images, labels = next(iter(parts.train_loader))
    loss = torch.nn.functional.cross_entropy(parts.model(images), labels)
    loss.backward()
    parts.optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, parts.model.parameters(), strict=True))
