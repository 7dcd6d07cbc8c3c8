"""Memory: the step-peak measurement, the batch-size search (with faked out-of-memory), its advice and CLI, and
activation checkpointing (same gradients and BatchNorm statistics, less memory)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp

from hasten.cli import main
from hasten.engine.memory import NothingFits, agree_on_min, measure_peak, parse_bytes, search_batch_size
from hasten.errors import HastenError
from hasten.experiments.batch_size import advise
from hasten.models import ResNet
from hasten.recipe.schema import load_recipe

MiB = 2**20


def test_measure_peak_sees_a_tensor_that_lived_and_died_inside():
    with measure_peak(torch.device("cpu")) as peak:
        a = torch.ones(MiB // 4)  # 1 MiB of float32
        b = torch.ones(2 * MiB // 4)  # 2 MiB, while a is alive
        del a, b
        c = torch.ones(MiB // 4)
        del c
    assert 3 * MiB <= peak.bytes < 3 * MiB + 64 * 1024


def test_search_doubles_then_bisects_to_the_largest_fit():
    search = search_batch_size(lambda b: b <= 100)
    assert search.batch_size == 100 and not search.capped
    doubling = [(2**i, True) for i in range(7)] + [(128, False)]
    bisection = [(96, True), (112, False), (104, False), (100, True), (102, False), (101, False)]
    assert search.tried == doubling + bisection


def test_search_from_a_start_too_large_halves_first():
    search = search_batch_size(lambda b: b <= 100, start=512)
    assert [size for size, _ in search.tried][:4] == [512, 256, 128, 64]
    assert search.batch_size == 100


def test_search_stops_at_the_limit_and_within_tolerance():
    capped = search_batch_size(lambda b: True, limit=50)
    assert capped.batch_size == 50 and capped.capped and capped.tried[-1] == (50, True)
    rough = search_batch_size(lambda b: b <= 1000, tolerance=1 / 16)
    assert 1000 - 1000 / 16 <= rough.batch_size <= 1000 and len(rough.tried) < 16


def test_search_lets_other_errors_through_and_says_when_nothing_fits():
    def broken(size: int) -> bool:
        if size == 8:
            raise ValueError("not a memory problem")
        return True

    with pytest.raises(ValueError, match="not a memory problem"):
        search_batch_size(broken)
    with pytest.raises(NothingFits, match="even a batch of 1"):
        search_batch_size(lambda b: False)


def test_advice_rescales_the_lr_or_keeps_the_global_batch(tiny_overrides):
    recipe = load_recipe("fashion-fast", tiny_overrides)  # batch 16, base_batch 256
    assert advise(recipe, 100, "linear") == (
        100,
        1,
        ["train.batch_size=100", "train.accumulate=1", "optim.scaling=linear"],
    )
    assert advise(recipe, 100, "sqrt")[2][-1] == "optim.scaling=sqrt"
    no_base = load_recipe("fashion-fast", [*tiny_overrides, "optim.base_batch=null"])
    assert "optim.base_batch=16" in advise(no_base, 100, "linear")[2]
    big = load_recipe("fashion-fast", [*tiny_overrides, "train.batch_size=256"])
    assert advise(big, 100, "accumulate") == (64, 4, ["train.batch_size=64", "train.accumulate=4"])  # 256 = 4 x 64
    assert advise(big, 300, "accumulate")[:2] == (256, 1)


def test_parse_bytes():
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("512MiB") == 512 * MiB and parse_bytes("1.5GB") == 1.5e9
    with pytest.raises(HastenError, match="--memory-budget"):
        parse_bytes("lots")


def test_batch_size_command_finds_a_size_within_the_budget(tiny_overrides, capsys):
    assert main(["batch-size", "fashion-fast", *tiny_overrides, "--memory-budget", "6MiB", "--rule", "sqrt"]) == 0
    out = capsys.readouterr()
    overrides = dict(item.split("=") for item in out.out.split())
    assert 1 < int(overrides["train.batch_size"]) < 384 and overrides["optim.scaling"] == "sqrt"
    assert "largest batch that fits in 6.0 MiB" in out.err


def test_batch_size_command_says_when_not_even_the_smallest_batch_fits(tiny_overrides, capsys):
    assert main(["batch-size", "fashion-fast", *tiny_overrides, "--memory-budget", "1KiB"]) == 2
    assert "even a batch of 2 does not fit in the budget of 1.0 KiB (it needs" in capsys.readouterr().err


def test_batch_size_command_never_tries_one_image_a_batch_norm_cannot_train_on(tmp_path, capsys):
    """The default ResNet on 8 x 8 digits ends in a 1 x 1 feature map, where batch norm cannot train on one image:
    a budget that not even 2 images fit is said (exit 2), where the search tried 1 and ended in torch's ValueError."""
    argv = ["batch-size", "data.name=digits", "train.threads=1", f"run.dir={tmp_path / 'run'}"]
    assert main([*argv, "--memory-budget", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert "even a batch of 2 does not fit in the budget of 1.0 KiB" in err and "Traceback" not in err


def test_the_search_stops_at_its_smallest_batch():
    tried = []
    with pytest.raises(NothingFits, match="even a batch of 2"):
        search_batch_size(lambda size: tried.append(size) or False, start=16, smallest=2)
    assert tried == [16, 8, 4, 2]


def _agree_worker(rank: int, port: int, results) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results[rank] = agree_on_min([96, 80][rank])
    torch.distributed.destroy_process_group()


def test_all_ranks_agree_on_the_smallest_size():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").Manager().dict()
    mp.spawn(_agree_worker, args=(port, results), nprocs=2)
    assert dict(results) == {0: 80, 1: 80}
    assert agree_on_min(96) == 96  # no process group: as is


def _resnet_pair() -> tuple[ResNet, ResNet]:
    torch.manual_seed(0)
    plain = ResNet(1, 10, width=8, blocks=[1, 1, 1])
    checkpointed = copy.deepcopy(plain)
    checkpointed.checkpoint_activations = True
    return plain, checkpointed


def test_checkpointing_gives_the_same_gradients_and_batch_norm_statistics():
    plain, checkpointed = _resnet_pair()
    x = torch.randn(16, 1, 28, 28)
    for model in (plain, checkpointed):
        model(x).square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(plain.named_buffers(), checkpointed.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=name)  # running stats updated once, not again in the recompute
    assert checkpointed.checkpointed_segments() == 3  # the stem, stage 1's downsampling unit and its block


def test_checkpointing_lowers_the_step_peak():
    peaks = {}
    for name, model in zip(("plain", "checkpointed"), _resnet_pair(), strict=True):
        x = torch.randn(64, 1, 28, 28)
        with measure_peak(torch.device("cpu")) as peak:
            model(x).square().mean().backward()
        peaks[name] = peak.bytes
    assert peaks["checkpointed"] < 0.7 * peaks["plain"]


def test_checkpointing_and_compile_in_two_step_runs(tiny_overrides, tmp_path, monkeypatch):
    import hasten
    from hasten.engine import compiling

    monkeypatch.setattr(compiling, "BACKEND", "eager")  # Dynamo without Inductor: the plumbing, in seconds
    two_steps = ["data.subset=32", "data.test_subset=64", "train.epochs=1", "precision=fp32"]
    for option in ("train.checkpoint_activations=true", "train.compile=true"):  # fashion-fast: channels_last too
        summary = hasten.train("fashion-fast", [*tiny_overrides, *two_steps, option, f"run.dir={tmp_path / option}"])
        assert summary["steps"] == 2


def test_checkpointing_a_model_without_blocks_is_a_recipe_error(tiny_overrides, capsys):
    layers = "model.layers=[flatten, {dense: classes}]"
    args = ["train", *tiny_overrides, "model.name=sequential", layers, "train.checkpoint_activations=true"]
    assert main(args) == 2
    assert "train.checkpoint_activations" in capsys.readouterr().err
