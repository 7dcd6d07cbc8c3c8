"""The default recipe's rules (hasten/tune/rules.py): the batch of least predicted time to the result, the budget, and
what a run decides and records when they are `auto`. Step times are faked where a rule's choice is asserted, so the
tests hold on any machine; no timing is asserted."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten import machine
from hasten.clock import Clock
from hasten.data.datasets import ImageDataset
from hasten.engine.schedules import asked_rise_steps
from hasten.recipe.schema import load_recipe, shipped_recipes
from hasten.run.build import build, divergence_advice, short_run_note, start_run
from hasten.run.resolve import choose_on_machine, resolve_default_lr, resolve_for_data
from hasten.run.trainer import Trainer
from hasten.tune import autotune, choices, probe_cache, rules, steadiness

pytestmark = pytest.mark.machine  # the batch and evaluation-batch rules and the probe's candidates, every profile


def test_the_time_rule_weighs_steps_needed_against_step_time():
    # a step time that grows almost in proportion to the batch (a CPU): a small batch, where the fixed cost of a
    # step stops paying for the steps a small batch needs more of: (1 + 64/B) t(B) = 0.10, 0.09, 0.11, 0.165
    cpu_like = {16: 0.020, 32: 0.030, 64: 0.055, 128: 0.110}
    assert rules.choose_batch(cpu_like, noise_batch=64) == 32
    assert rules.choose_batch({16: 0.016, 32: 0.030, 64: 0.060}, noise_batch=64) == 16  # no fixed cost: the smallest
    # a step time that hardly grows (a GPU below its capacity): the largest batch takes the fewest seconds
    gpu_like = {16: 0.010, 32: 0.010, 64: 0.011, 128: 0.012, 256: 0.013}  # 0.018 at 128, 0.01625 at 256
    assert rules.choose_batch(gpu_like, noise_batch=64) == 256
    # ... unless the largest gains less than BATCH_TIE (5%): 0.0175 at 256 is a tie with 128, the smaller wins
    assert rules.choose_batch({**gpu_like, 256: 0.014}, noise_batch=64) == 128
    # (1 + 64/B) x t(B), exactly
    assert rules.predicted_cost(32, 0.03, noise_batch=64) == pytest.approx(0.09)
    assert rules.choose_batch({16: float("inf"), 32: 1.0}) == 32  # a batch that could not be timed is never chosen
    with pytest.raises(ValueError):
        rules.choose_batch({})


def test_candidates_keep_the_run_long_enough():
    assert rules.batch_candidates(400, epochs=1) == [16]  # 25 steps at 16: nothing larger keeps 64 steps
    assert rules.batch_candidates(60_000, epochs=1) == [16, 32, 64, 128, 256, 512]
    assert rules.batch_candidates(1200, epochs=1) == [16]  # 32 would leave 38 steps
    assert rules.batch_candidates(1200, epochs=10) == [16, 32, 64, 128]  # 128: 10 x 10 steps
    assert rules.batch_candidates(60_000, epochs=1, world=2) == [16, 32, 64, 128, 256]  # 512 x 2: 59 steps
    # epochs=auto: each candidate gets the budget's whole RUN_STEPS, not cut short by MAX_EPOCHS. 300 images at
    # batch 64 would be 60 epochs of 5 steps, half the budget: a faster machine's timing chose it, and it learnt less
    assert rules.batch_candidates(300, epochs=None) == [16, 32]  # 32: 60 epochs of 10 steps
    assert rules.batch_candidates(20, epochs=None) == [16]  # even 16 falls short: the smallest, as long as allowed
    for images in (50, 300, 400, 1200, 5000, 60_000):
        for batch in rules.batch_candidates(images, epochs=None)[1:]:
            epochs = rules.auto_epochs(images, batch)
            assert epochs * rules.steps_per_epoch(images, batch) >= rules.RUN_STEPS and epochs <= rules.MAX_EPOCHS


def test_auto_epochs_take_enough_steps_within_bounds():
    assert rules.auto_epochs(60_000, 32) == rules.MIN_EPOCHS  # a large set: its minimum passes
    small = rules.auto_epochs(1200, 16)
    assert small * rules.steps_per_epoch(1200, 16) >= rules.RUN_STEPS and small < rules.MAX_EPOCHS
    assert rules.auto_epochs(20, 16) == rules.MAX_EPOCHS  # two steps an epoch: capped


def _fake_step_times(monkeypatch, seconds: dict[int, float]) -> list[list[int]]:
    timed = []

    def time_batches(model, batch, num_classes, option, sizes, run_images=None, meter=None):
        timed.append(list(sizes))
        assert len(batch[0]) >= max(sizes)  # real images for the largest candidate
        return {size: seconds[size] for size in sizes}, steadiness.Steadiness(0.0)

    monkeypatch.setattr(autotune, "time_batches", time_batches)
    return timed


QUIET = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "precision=fp32", "model.width=4"]


def test_a_run_takes_the_batch_the_rule_picks_and_records_it(tmp_path, monkeypatch, capsys):
    seconds = {16: 0.016, 32: 0.020, 64: 0.060, 128: 0.120, 256: 0.240, 512: 0.480}
    timed = _fake_step_times(monkeypatch, seconds)
    overrides = [*QUIET, "data.name=synthetic", "data.synthetic_size=2048", "train.epochs=1", f"run.dir={tmp_path}"]
    summary = hasten.train(None, overrides)
    expected = rules.choose_batch({b: seconds[b] for b in rules.batch_candidates(2048, 1)})
    assert timed == [rules.batch_candidates(2048, 1)] and expected == 32
    assert summary["global_batch"] == expected
    recorded = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert recorded["train"]["batch_size"] == expected and recorded["train"]["epochs"] == 1
    assert "train.batch_size=auto -> 32" in capsys.readouterr().err


def test_a_batch_under_a_plain_loops_says_what_its_epochs_cost_and_how_to_be_shorter():
    # 1,200 images at batch 16, epochs auto: 1,000 steps planned (5/3 of 600), 75 an epoch, so 14 epochs of 1,050
    # steps, 10.5 s at 10 ms a step; the same 14 epochs at 64 are 266 steps, 8.0 s at 30 ms: under 0.9x, said
    seconds = {16: 0.010, 32: 0.016, 64: 0.030}
    assert rules.auto_epochs(1200, 16) == 14
    (note,) = rules.shorter_run_note(seconds, 16, 1200, None)
    assert "14 epochs at batch 16: 1,050 optimizer steps, about 10 s" in note and "64, 266 steps, about 8.0 s" in note
    # the epochs named with the batch: train.epochs=auto alone would plan 600 steps at 64, 32 epochs, longer
    assert note.endswith("train.batch_size=64 train.epochs=14") and rules.auto_epochs(1200, 64) == 32
    (given,) = rules.shorter_run_note(seconds, 16, 1200, 3)  # epochs given: those
    assert "3 epochs at batch 16: 225 optimizer steps" in given and given.endswith("train.epochs=3")
    assert rules.shorter_run_note({**seconds, 64: 0.040}, 16, 1200, None) == []  # 10.6 s at 64: not shorter
    assert rules.shorter_run_note(seconds, 64, 1200, None) == []  # the plain loop's batch itself
    # 64 not timed (on a small set often no candidate): read off the line through the timed batches, 28 ms here
    (read_off,) = rules.shorter_run_note({16: 0.010, 32: 0.016}, 16, 1200, None)
    assert "64, 266 steps, about 7.4 s" in read_off
    assert rules.shorter_run_note({16: 0.010}, 16, 1200, None) == []  # one batch timed: no line to read 64 off
    assert rules.shorter_run_note({**seconds, 64: math.inf}, 16, 1200, None) == []  # 64 could not be timed


def test_a_run_at_a_small_batch_prints_the_shorter_runs_keys(tmp_path, monkeypatch, capsys):
    seconds = {16: 0.010, 32: 0.016, 64: 0.030}  # (1 + 64/B) t(B): 0.050, 0.048, 0.060; 16 ties 32 and wins
    _fake_step_times(monkeypatch, seconds)
    overrides = [*QUIET, "data.name=synthetic", "data.synthetic_size=4096", "train.epochs=1", f"run.dir={tmp_path}"]
    assert hasten.train(None, overrides)["global_batch"] == 16
    err = " ".join(capsys.readouterr().err.split())  # (wrapped to 80 columns)
    assert "1 epoch at batch 16: 256 optimizer steps, about 2.6 s" in err and "at batch 64, 64 steps, about 1.9" in err
    assert "For the shorter run: train.batch_size=64 train.epochs=1" in err


def test_the_eval_batch_on_a_cpu_is_smaller_for_larger_images_and_larger_in_bf16():
    # fp32 (4 bytes an activation): 256 of small images, 64 at 64x64 (1 MiB of input), fewer of larger ones
    assert rules.eval_batch("cpu", 8, 8) == rules.eval_batch("cpu", 28, 28) == rules.eval_batch("cpu", 32, 32) == 256
    assert rules.eval_batch("cpu", 48, 48) == rules.eval_batch("cpu", 64, 64) == 64
    assert rules.eval_batch("cpu", 80, 80) == 32  # 40 of 80x80 fit in 1 MiB: the power of two below
    assert rules.eval_batch("cpu", 96, 96) == rules.eval_batch("cpu", 512, 512) == rules.MIN_BATCH  # at least 16
    # bf16 and fp16 take half the bytes: twice the images where the bytes bind, the same cap of 256
    bf16 = rules.element_bytes("bf16")
    assert bf16 == rules.element_bytes("fp16") == rules.element_bytes("fp16-master") == 2
    assert rules.element_bytes("fp32") == rules.element_bytes("auto") == 4
    assert rules.eval_batch("cpu", 28, 28, bf16) == 256
    assert rules.eval_batch("cpu", 48, 48, bf16) == rules.eval_batch("cpu", 64, 64, bf16) == 128
    assert rules.eval_batch("cpu", 96, 96, bf16) == 32
    assert rules.eval_batch("cuda", 28, 28) == rules.eval_batch("cuda", 224, 224, bf16) == rules.EVAL_BATCH == 256


def test_a_run_records_the_eval_batch_it_decided_at_its_precision(tmp_path, capsys):
    overrides = [*QUIET, "data.name=synthetic", "data.synthetic_size=64", "data.size=64", "train.batch_size=16",
                 "train.epochs=1", "model.width=4", "device=cpu", "precision=fp32", f"run.dir={tmp_path}"]  # fmt: skip
    hasten.train(None, overrides)
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["train"]["eval_batch_size"] == 64
    assert "train.eval_batch_size=auto -> 64 (64x64 images in fp32 on a CPU)" in capsys.readouterr().err
    # bf16 decided (here asked) before the eval batch: its activations take half the bytes, twice the images
    half = tmp_path / "bf16"
    hasten.train(None, [*overrides[:-2], "precision=bf16", f"run.dir={half}"])
    assert yaml.safe_load((half / "recipe.yaml").read_text())["train"]["eval_batch_size"] == 128
    assert "train.eval_batch_size=auto -> 128 (64x64 images in bf16 on a CPU)" in capsys.readouterr().err
    given = tmp_path / "given"
    hasten.train(None, [*overrides[:-1], "train.eval_batch_size=100", f"run.dir={given}"])  # as given
    assert yaml.safe_load((given / "recipe.yaml").read_text())["train"]["eval_batch_size"] == 100


def test_small_data_gets_the_smallest_batch_without_timing_any(tmp_path, monkeypatch, capsys):
    timed = _fake_step_times(monkeypatch, {})
    overrides = [*QUIET, "data.name=synthetic", "data.synthetic_size=256", "train.epochs=2", f"run.dir={tmp_path}"]
    summary = hasten.train(None, overrides)
    assert timed == [] and summary["global_batch"] == rules.MIN_BATCH
    assert f"train.batch_size=auto -> {rules.MIN_BATCH}: the smallest batch" in capsys.readouterr().err


def test_the_budget_is_decided_from_the_data_and_recorded(tmp_path, capsys):
    overrides = [*QUIET, "data.name=synthetic", "data.synthetic_size=64", "train.batch_size=16", f"run.dir={tmp_path}"]
    summary = hasten.train(None, overrides)
    epochs = rules.auto_epochs(64, 16)
    assert summary["epochs"] == epochs and summary["steps"] == epochs * 4
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["train"]["epochs"] == epochs
    assert f"train.epochs=auto -> {epochs}" in capsys.readouterr().err


def test_a_resume_keeps_the_batch_and_budget_its_run_chose(tmp_path, monkeypatch):
    run = tmp_path / "run"
    base = [*QUIET, "data.name=synthetic", "data.synthetic_size=1024", f"run.dir={run}"]
    _fake_step_times(monkeypatch, {16: 1.0, 32: 0.1, 64: 1.0, 128: 1.0, 256: 1.0, 512: 1.0})
    first = hasten.train(None, [*base, "train.epochs=4"])
    assert first["global_batch"] == 32
    _fake_step_times(monkeypatch, {16: 0.1, 32: 1.0, 64: 1.0, 128: 1.0, 256: 1.0, 512: 1.0})  # would now pick 16
    summary = hasten.train(None, [*base, "train.epochs=4", "resume=auto"])  # (nothing left to train: the summary)
    assert summary["global_batch"] == 32


def test_the_lr_rises_over_one_step_a_class_and_at_least_ten():
    assert [rules.auto_rise_steps(classes) for classes in (2, 10, 11, 100, 1000)] == [10, 10, 11, 100, 1000]


@pytest.mark.parametrize("classes", [10, 100])
def test_the_default_recipe_rises_over_one_step_a_class(classes):
    images = torch.zeros(2 * classes, 3, 8, 8, dtype=torch.uint8)
    labels = torch.arange(classes).repeat(2)
    data = ImageDataset(
        "a-folder", images, labels, images[:classes], labels[:classes], [f"c{i}" for i in range(classes)]
    )
    resolved, notes = resolve_for_data(load_recipe(None, []), data)
    assert resolved.schedule.min_warmup_steps == max(10, classes)
    assert f"LR rise over at least {max(10, classes)} optimizer steps ({classes} classes;" in "\n".join(notes)
    # a recipe that names its rise keeps it, whatever the classes
    named = resolve_for_data(load_recipe("fashion-fast", []), data)[0]
    assert named.schedule.min_warmup_steps == 50


def test_the_rise_the_data_decided_is_recorded(tmp_path):
    hasten.train(
        None, [*QUIET, "data.name=synthetic", "data.synthetic_size=64", "train.epochs=1", f"run.dir={tmp_path}"]
    )
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["schedule"]["min_warmup_steps"] == 10
    with pytest.raises(ValueError, match="decided from the data"):  # never built unresolved
        asked_rise_steps(load_recipe(None, []).schedule)


def test_lr_auto_works_with_the_default_optimizer(tmp_path, capsys):
    recipe = load_recipe(None, [*QUIET, "data.name=synthetic", "data.synthetic_size=512", "train.epochs=1",
                                "optim.lr=auto", f"run.dir={tmp_path}"])  # fmt: skip
    assert recipe.optim.name == "adamw"
    summary = hasten.train(recipe)
    assert "optim.lr=auto: peak LR" in capsys.readouterr().err
    recorded = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert isinstance(recorded["optim"]["lr"], float) and recorded["optim"]["lr"] > 0
    assert summary["lr"] == pytest.approx(recorded["optim"]["lr"] * (summary["global_batch"] / 32) ** 0.5)


@pytest.mark.parametrize("name", [n for n in shipped_recipes() if not n.startswith("dcgan")])
def test_every_piece_of_divergence_advice_is_accepted_by_its_recipe(name):
    recipe = load_recipe(name, ["train.batch_size=64", "train.epochs=3"])  # as resolved: fixed values
    recipe = resolve_default_lr(recipe, nn.BatchNorm2d(1))[0]  # an unset LR as the run decides it
    advice = divergence_advice(recipe)
    assert advice and any(a.startswith("optim.lr=") for a in advice)
    for override in advice:
        load_recipe(name, ["train.batch_size=64", "train.epochs=3", override])  # raises when refused
    # the range test's rule was measured for SGD: offered there only (for AdamW it picked 0.57 per 32 on glyphs)
    assert ("optim.lr=auto" in advice) is (recipe.optim.name in rules.LR_AUTO_CALIBRATED)
    assert any(a.startswith("schedule.min_warmup_steps=") for a in advice)  # a longer rise, for every schedule


@pytest.mark.machine
def test_bf16_is_timed_only_where_the_cpu_computes_in_it():
    for name, expected in {"sse41": ["fp32"], "avx2": ["fp32"], "avx512": ["fp32"], "avx512-bf16": ["fp32", "bf16"],
                           "amx": ["fp32", "bf16"]}.items():  # fmt: skip
        assert choices.precision_candidates(machine.PROFILES[name], "cpu") == expected, name
    # a GPU: bf16 where it has it, else fp16 with loss scaling; its host CPU's candidates are the CPU's own
    assert choices.precision_candidates(machine.PROFILES["cuda"], "cuda") == ["fp32", "bf16"]
    assert choices.precision_candidates(machine.PROFILES["cuda-fp16"], "cuda") == ["fp32", "fp16"]
    assert choices.precision_candidates(machine.PROFILES["cuda-fp16"], "cpu") == ["fp32"]
    assert choices.precision_candidates(machine.PROFILES["avx2"], "cuda") == ["fp32"]  # no such device: nothing


@pytest.mark.machine
def test_a_16_bit_precision_given_where_the_machine_emulates_it_is_said_and_kept():
    """seed-cnn-32 gives bf16: on an AVX2-only CPU that mode is emulated (348 images/s against fp32's 1,234 on one),
    so the run says so at start and trains as asked; where bf16 is native, or the precision is fp32 or auto, it says
    nothing of it. fp16 is slow on every CPU; a GPU's own flags say which 16-bit mode it computes fast."""
    profiles = machine.PROFILES
    for name in ("sse41", "avx2", "avx512"):
        said = choices.slow_precision("bf16", profiles[name], "cpu")
        assert said == f"the CPU has no bf16 instructions ({name} kernels), so bf16 is emulated, slower than fp32"
    for name in ("avx512-bf16", "amx"):
        assert choices.slow_precision("bf16", profiles[name], "cpu") is None
        assert "no fast fp16 kernels" in choices.slow_precision("fp16-master", profiles[name], "cpu")
    assert all(choices.slow_precision(p, profiles["avx2"], "cpu") is None for p in ("fp32", "auto"))
    assert choices.slow_precision("bf16", profiles["cuda"], "cuda") is None
    assert choices.slow_precision("fp16", profiles["cuda"], "cuda") is None  # fast fp16 too, not a probe candidate
    assert "no fast bf16 arithmetic" in choices.slow_precision("bf16", profiles["cuda-fp16"], "cuda")
    recipe = load_recipe("seed-cnn-32", ["train.batch_size=64"])  # bf16, contiguous, batch 64: nothing left to time
    cpu = torch.device("cpu")
    kept, keys, notes = choose_on_machine(recipe, nn.Linear(1, 1), None, cpu, machine=profiles["avx2"])
    assert kept.precision == "bf16" and keys == ()
    assert notes == ["precision=bf16 as given: the CPU has no bf16 instructions (avx2 kernels), so bf16 is emulated, "
                     "slower than fp32; precision=auto trains in what is fast here"]  # fmt: skip
    assert choose_on_machine(recipe, nn.Linear(1, 1), None, cpu, machine=profiles["avx512-bf16"])[2] == []


def test_noise_widens_the_batch_tie_toward_the_smaller_batch():
    """Batches whose predicted times are closer than the step timings' own spread count as tied: the smaller
    wins, so noise does not pick the batch; a real gap still does."""
    seconds = {16: 0.016, 32: 0.0295}  # (1 + 64/16) 0.016 = 0.080 against (1 + 64/32) 0.0295 = 0.0885: 16 by 10%
    assert rules.choose_batch(seconds) == 16
    seconds = {16: 0.016, 32: 0.0255}  # 0.080 against 0.0765: 32 by 4.5%, within BATCH_TIE: the smaller
    assert rules.choose_batch(seconds) == 16
    seconds = {16: 0.016, 32: 0.0245}  # 0.080 against 0.0735: 32 by 8.8%
    assert rules.choose_batch(seconds) == 32
    assert rules.choose_batch(seconds, tie=rules.batch_tie(0.10)) == 16  # timings 10% apart: a tie, the smaller
    assert rules.batch_tie(0.0) == rules.BATCH_TIE and rules.batch_tie(math.inf) == rules.MAX_BATCH_TIE


def test_three_batches_are_timed_and_the_rest_read_off_their_line():
    candidates = [16, 32, 64, 128, 256, 512]
    assert rules.timed_sizes(candidates) == [16, 128, 512] and rules.timed_sizes([16, 32]) == [16, 32]
    measured = {16: 0.005 + 0.001 * 16, 128: 0.005 + 0.001 * 128, 512: 0.005 + 0.001 * 512}  # t = a + b B
    line = rules.step_time_line(measured, candidates)
    assert line[64] == pytest.approx(0.069) and line[16] == measured[16]  # measured values kept as measured
    # a falling line (noise: a larger batch cannot step faster) is flat at the mean: slope 0, not extrapolated
    assert rules.step_time_line({16: 0.02, 512: 0.01}, [16, 64, 512])[64] == pytest.approx(0.015)
    # a line that would cross zero below the smallest batch starts at 0 instead: t(64) = 64 x the slope
    assert rules.step_time_line({16: 0.001, 512: 1.0}, [16, 64, 512])[64] == pytest.approx(64 * 0.999 / 496)


def test_a_second_run_reads_the_batch_timings_from_the_cache(tmp_path, monkeypatch, capsys):
    """The step times behind train.batch_size=auto are kept per machine, model, image shape and sizes: a second
    identical run times nothing and picks the same batch; a cache file that is not a timing is ignored, said so."""
    seconds = {16: 0.016, 32: 0.020, 64: 0.060, 128: 0.120, 256: 0.240, 512: 0.480}
    timed = _fake_step_times(monkeypatch, seconds)
    # the layout fixed: a real probe of a tiny net need not repeat, and is then timed again by the next run
    base = [*QUIET, "data.name=synthetic", "data.synthetic_size=2048", "train.epochs=1", "train.channels_last=false"]
    first = hasten.train(None, [*base, f"run.dir={tmp_path / 'a'}"])
    assert len(timed) == 1 and "train.batch_size=auto -> 32" in capsys.readouterr().err
    second = hasten.train(None, [*base, f"run.dir={tmp_path / 'b'}"])
    err = capsys.readouterr().err
    assert len(timed) == 1 and second["global_batch"] == first["global_batch"] == 32
    assert "timed on this machine before" in err
    (kept,) = (Path(os.environ["HASTEN_CACHE"]) / "probe").glob("batch-*.json")
    kept.write_text(
        json.dumps({"format": probe_cache.CACHE_FORMAT, "what": "batch", "key": {}, "seconds": {"16": "soon"}})
    )
    third = hasten.train(None, [*base, f"run.dir={tmp_path / 'c'}"])
    assert len(timed) == 2 and third["global_batch"] == 32
    assert "ignored (written for another key); timing again" in capsys.readouterr().err.replace("\n  ", " ")


def test_auto_shifts_are_a_thirty_second_of_the_side_in_runs_of_five_epochs_or_more():
    assert [rules.auto_translate(side, 5) for side in (8, 28, 32, 64, 96)] == [0, 1, 1, 2, 3]
    assert rules.auto_translate(64, rules.AUTO_TRANSLATE_EPOCHS - 1) == 0  # a short run learns faster unshifted


def test_optim_lr_auto_with_an_uncalibrated_optimizer_warns(tiny_overrides, capsys):
    hasten.train(None, [*tiny_overrides, "optim.name=adamw", "optim.lr=auto", "train.epochs=1"])
    assert "warning: optim.lr=auto's rule was measured for sgd only; for optim.name=adamw" in capsys.readouterr().err
    assert "optim.lr=auto" not in divergence_advice(load_recipe(None, ["train.batch_size=64", "train.epochs=3"]))
    assert "optim.lr=auto" in divergence_advice(load_recipe(None, ["optim.name=sgd", "train.batch_size=64",
                                                                  "train.epochs=3"]))  # fmt: skip


def test_a_short_run_is_first_advised_the_epochs_of_the_budget():
    # 200 images at batch 16 for one epoch: 13 optimizer steps, where the budget rule gives small sets 600 at batch
    # 32 and, by the batch rule's S(B), 1,000 at batch 16
    recipe = resolve_default_lr(load_recipe(None, ["train.batch_size=16", "train.epochs=1"]), nn.BatchNorm2d(1))[0]
    advice = divergence_advice(recipe, run_steps=13)
    assert advice[0] == "train.epochs=77" and advice[1].startswith("optim.lr=")  # ceil(1000 / 13)
    load_recipe(None, ["train.batch_size=16", "train.epochs=1", advice[0]])  # accepted by the recipe
    three = divergence_advice(load_recipe(None, ["train.batch_size=16", "train.epochs=3"]), run_steps=39)
    assert three[0] == "train.epochs=77"  # 3 epochs x 1000 / 39 steps
    at_32 = divergence_advice(load_recipe(None, ["train.batch_size=32", "train.epochs=1"]), run_steps=7)
    assert at_32[0] == "train.epochs=86"  # ceil(600 / 7): batch 32 is the budget's own batch
    # a run of the budget's length at its batch, or one whose length is not known
    for long_enough in (rules.budget_steps(rules.RUN_STEPS, 16), None):
        assert not any(a.startswith("train.epochs=") for a in divergence_advice(recipe, run_steps=long_enough))


def test_a_short_run_says_at_start_that_it_is_short():
    recipe = load_recipe(None, ["train.batch_size=16", "train.epochs=1"])
    note = short_run_note(recipe, 75)  # 1,200 images at batch 16 for one epoch
    assert note is not None and "75 optimizer steps" in note
    assert note.endswith("train.epochs=14 gives it 1,000")  # ceil(1000 / 75): 600 at 32, x5/3 at 16
    load_recipe(None, ["train.batch_size=16", "train.epochs=1", "train.epochs=14"])  # what it names is accepted
    assert short_run_note(recipe, 1000) is None  # the budget's length at this batch: nothing to say
    assert short_run_note(load_recipe(None, ["train.batch_size=16"]), 75) is None  # train.epochs=auto plans its own
    capped = short_run_note(load_recipe(None, ["train.batch_size=16", "train.epochs=60"]), 780, chosen=True)
    assert capped is not None and capped.startswith("train.epochs=auto's 60, the most it plans, gives this run 780 ")
    assert capped.endswith("train.epochs=77 gives it 1,000")  # 200 images: 13 steps an epoch, 60 epochs at most


def test_a_run_at_chance_is_told_what_to_try(tiny_overrides, capsys):
    recipe = load_recipe(None, [*tiny_overrides, "train.epochs=1", "model.whiten=false"])
    parts = build(recipe)
    trainer, log = start_run(parts.recipe, parts, Path(parts.recipe.run.dir), None, Clock())
    log.close()
    steps = -(-len(parts.train_loader.images) // 16)  # one epoch at batch 16
    assert trainer.plan.divergence_advice[0] == f"train.epochs={-(-rules.budget_steps(rules.RUN_STEPS, 16) // steps)}"
    said = " ".join(capsys.readouterr().err.split())  # (wrapped to 80 columns)
    assert short_run_note(parts.recipe, steps) in said  # the same run was told at its start that it is short
    warned = []
    ran = SimpleNamespace(plan=trainer.plan, warn=warned.append, recent_losses=[], constant_classes=())
    Trainer.check_result(ran, 0.1)  # a result at chance
    assert len(warned) == 1 and "chance level" in warned[0]
    assert warned[0].endswith("try " + ", ".join(trainer.plan.divergence_advice))
