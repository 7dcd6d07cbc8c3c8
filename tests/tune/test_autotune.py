"""`precision: auto` and `train.channels_last: auto`: the start-up probe's candidates, its choice, what it leaves
untouched, and a resume whose probe chooses otherwise."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten import machine
from hasten.errors import RecipeError
from hasten.runfolder.checkpoint import checkpoints_in
from hasten.tune import autotune, choices, probe_cache, rules, steadiness
from hasten.tune.choices import Candidate

pytestmark = pytest.mark.machine  # every CPU's candidates, under every HASTEN_MACHINE profile (.ci/run)

AVX2, ZEN4 = machine.PROFILES["avx2"], machine.PROFILES["avx512-bf16"]  # without and with bf16 kernels


class IdleMeter:
    """An ActivityMeter that reads the machine as idle: the tests of the probe's rounds count steps, which a busy
    shared machine must not change; the meter itself is tested in tests/test_machine.py."""

    def start(self) -> None:
        pass

    def stop(self) -> machine.Activity:
        return machine.Activity(wall_seconds=1.0, own_seconds=1.0, others_seconds=0.0, cpus=2)


class BusyMeter(IdleMeter):
    def stop(self) -> machine.Activity:
        return machine.Activity(wall_seconds=1.0, own_seconds=1.0, others_seconds=1.5, cpus=2)


def test_candidates_are_the_auto_keys_combinations():
    # AVX2 alone: bf16 is emulated, never timed
    assert choices.candidates("auto", "auto", "cpu", AVX2) == [Candidate("fp32", False), Candidate("fp32", True)]
    assert choices.candidates("auto", "auto", "cpu", ZEN4) == [
        Candidate("fp32", False), Candidate("fp32", True), Candidate("bf16", False), Candidate("bf16", True)
    ]  # fmt: skip
    assert choices.candidates("fp32", "auto", "cpu", ZEN4) == [Candidate("fp32", False), Candidate("fp32", True)]
    assert choices.candidates("auto", False, "cpu", ZEN4) == [Candidate("fp32", False), Candidate("bf16", False)]
    for profile in machine.PROFILES.values():
        assert "fp16" not in choices.precision_candidates(profile, "cpu")  # no fast fp16 kernels on a CPU


def _fake_timings(monkeypatch, seconds: dict[Candidate, float], losses: dict[str, float] | None = None):
    """The probe's step timer replaced: each candidate's step takes `seconds`, its loss `losses[precision]`."""
    current: list[Candidate] = []
    real_step = autotune.TrainStep

    class Step(real_step):
        def __init__(self, model, optimizer, precision, *args, **kwargs):
            super().__init__(model, optimizer, precision, *args, **kwargs)
            layout = not next(
                p for p in model.parameters() if p.dim() == 4
            ).is_contiguous()  # (4, 2, 3, 3): unambiguous
            self.candidate = Candidate(precision.name, layout)

    def timed(step, batch, device):
        current.append(step.candidate)
        loss = (losses or {}).get(step.candidate.precision, 1.0)
        return seconds[step.candidate], loss

    monkeypatch.setattr(autotune, "TrainStep", Step)
    monkeypatch.setattr(autotune, "_timed_step", timed)
    return current


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def test_probe_takes_the_fastest_and_drops_a_16_bit_mode_whose_loss_strays(monkeypatch):
    options = choices.candidates("auto", "auto", "cpu", ZEN4)
    seconds = {options[0]: 1.4, options[1]: 1.3, options[2]: 1.2, options[3]: 1.0}  # none outpaced: all timed
    batch = (torch.randn(128, 2, 8, 8), torch.randint(0, 3, (128,)))  # the first look takes 16 of them
    calls = _fake_timings(monkeypatch, seconds)
    result = autotune.probe(_net(), batch, 3, options, meter=IdleMeter())
    assert result.choice == Candidate("bf16", True) and result.seconds == seconds
    # a first look (two steps each on a small batch), a warm-up round, then the timed ones, interleaved
    assert len(calls) == len(options) * (2 + autotune.ROUNDS + 1)
    assert calls[: len(options)] == options and calls[2 * len(options) : 3 * len(options)] == options
    _fake_timings(monkeypatch, seconds, losses={"fp32": 2.3, "bf16": 2.9})  # bf16 far from fp32: not safe here
    result = autotune.probe(_net(), batch, 3, options, meter=IdleMeter())
    assert result.choice == Candidate("fp32", True)
    assert set(result.dropped) == {options[2], options[3]} and all(math.isinf(result.seconds[o]) for o in options[2:])
    _fake_timings(monkeypatch, seconds, losses={"fp32": 2.3, "bf16": float("nan")})
    assert autotune.probe(_net(), batch, 3, options, meter=IdleMeter()).choice == Candidate("fp32", True)
    near_tie = {options[0]: 1.04, options[1]: 1.0, options[2]: 1.2, options[3]: 1.3}  # within 5%: the first wins
    _fake_timings(monkeypatch, near_tie)
    assert autotune.probe(_net(), batch, 3, options, meter=IdleMeter()).choice == Candidate("fp32", False)


def test_probe_spends_no_rounds_on_hopeless_candidates(monkeypatch):
    """bf16 without bf16 instructions: far slower at a first look, left out of the full-batch rounds, said why; a
    candidate outpaced by half in the first timed round is timed no more."""
    options = choices.candidates("auto", "auto", "cpu", ZEN4)  # bf16 a candidate, as on a CPU with bf16
    seconds = {options[0]: 1.0, options[1]: 1.6, options[2]: 8.0, options[3]: 9.0}  # fp32, fp32 cl, bf16, bf16 cl
    batch = (torch.randn(128, 2, 8, 8), torch.randint(0, 3, (128,)))
    calls = _fake_timings(monkeypatch, seconds)
    result = autotune.probe(_net(), batch, 3, options, meter=IdleMeter())
    assert result.choice == options[0]
    assert set(result.dropped) == {options[2], options[3]}
    assert "8.0x slower than fp32 on a first look (16 images)" in result.dropped[options[2]]
    assert all(math.isinf(result.seconds[o]) for o in options[2:]) and result.seconds[options[1]] == 1.6
    full_rounds = calls[2 * len(options) :]
    assert options[2] not in full_rounds and options[3] not in full_rounds
    assert full_rounds.count(options[1]) == 2 and full_rounds.count(options[0]) == autotune.ROUNDS + 1
    assert "left out: 8.0x slower" in result.describe(128)


def test_the_probe_is_bounded_by_the_run_it_serves(monkeypatch):
    """After its second timed round the probe stops once it has taken PROBE_SHARE of the run's predicted training
    time (its images at the fastest seconds per image), or MAX_PROBE_SECONDS; with one precision there is no first
    look (it is for a 16-bit candidate that may be hopeless)."""
    assert steadiness.time_limit(None, 1.0) == steadiness.MAX_PROBE_SECONDS
    assert steadiness.time_limit(1_000, 0.002) == pytest.approx(steadiness.PROBE_SHARE * 2.0)
    assert steadiness.time_limit(10**9, 0.002) == steadiness.MAX_PROBE_SECONDS
    options = choices.candidates("fp32", "auto", "cpu", AVX2)  # two layouts of fp32
    seconds = {options[0]: 1.0, options[1]: 1.2}  # per step of 128 images
    batch = (torch.randn(128, 2, 8, 8), torch.randint(0, 3, (128,)))

    class Clock:  # each reading a second after the last
        now = 0.0

        def perf_counter(self) -> float:
            self.now += 1.0
            return self.now

    monkeypatch.setattr(steadiness, "time", Clock())
    calls = _fake_timings(monkeypatch, seconds)
    autotune.probe(
        _net(), batch, 3, options, run_images=100, meter=IdleMeter()
    )  # a run of 100 images: ~0.8 s of training
    assert calls == options * 3  # no first look; the warm-up round and two timed ones
    calls = _fake_timings(monkeypatch, seconds)
    assert autotune.probe(_net(), batch, 3, options, run_images=10**6, meter=IdleMeter()).choice == options[0]
    assert calls == options * (autotune.ROUNDS + 1)  # a long run: every round
    calls = _fake_timings(monkeypatch, seconds)
    monkeypatch.setattr(autotune, "BATCH_OUTPACED", math.inf)  # (a step of 16 as long as one of 64 is outpaced)
    seconds_by_size, _ = autotune.time_batches(
        _net(), batch, 3, options[0], [16, 64], run_images=100, meter=IdleMeter()
    )
    assert seconds_by_size.keys() == {16, 64}
    assert len(calls) == 2 * 3


def test_probe_leaves_the_model_as_it_was(monkeypatch):
    model = _net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randn(8, 2, 8, 8), torch.randint(0, 3, (8,)))
    result = autotune.probe(model, batch, 3, choices.candidates("auto", "auto", "cpu", ZEN4))  # bf16 too, really
    assert result.choice in result.seconds and all(s > 0 for s in result.seconds.values())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN statistics too
    assert model[0].weight.is_contiguous()  # memory format unchanged


def same_run(value: float, within: float = 0.0) -> object:
    """What a repeat of a run gives: `value` exactly on a CPU; on a GPU, whose kernels' sums have no fixed order
    (atomics, cuDNN's algorithms), `value` to its rounding, or within `within` (an accuracy: the share of the test
    images that rounding may move across a decision)."""
    if not torch.cuda.is_available():
        return value
    return pytest.approx(value, abs=within) if within else pytest.approx(value, rel=1e-4)


def test_auto_run_records_the_choice_and_trains_as_that_fixed_choice_would(tiny_overrides, tmp_path):
    auto = hasten.train(None, [*tiny_overrides, "precision=auto", "train.channels_last=auto", "model.width=4",
                               f"run.dir={tmp_path / 'auto'}"])  # fmt: skip
    saved = yaml.safe_load((tmp_path / "auto" / "recipe.yaml").read_text())
    chosen = (saved["precision"], saved["train"]["channels_last"])
    assert chosen in {("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)}
    fixed = hasten.train(None, [*tiny_overrides, f"precision={chosen[0]}", f"train.channels_last={chosen[1]}",
                                "model.width=4", f"run.dir={tmp_path / 'fixed'}"])  # fmt: skip
    # the probe trained copies, under a forked random stream: the run itself is the fixed choice's, bit for bit (on
    # a GPU, whose convolution kernels sum in no fixed order, to their rounding)
    assert auto["train_loss"] == same_run(fixed["train_loss"])
    assert auto["test_accuracy"] == same_run(fixed["test_accuracy"], within=2 / fixed["dataset"]["test_size"])


def test_a_resume_keeps_what_the_resumed_run_chose(tiny_overrides, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    hasten.train(None, [*tiny_overrides, "precision=bf16", "train.epochs=1", f"run.dir={run}"])
    first = checkpoints_in(run / "checkpoints")[0]
    probed = []

    monkeypatch.setenv("HASTEN_MACHINE", "avx512-bf16")  # bf16 a candidate on every CPU: the probe's line is reached

    def slow_bf16(model, batch, num_classes, options, loss_fn=None, run_images=None, meter=None):  # now: fp32
        probed.append(options)
        seconds = {o: (2.0 if o.precision == "bf16" else 1.0) for o in options}
        return choices.Probe(seconds, min(options, key=seconds.get), {})

    monkeypatch.setattr(autotune, "probe", slow_bf16)
    summary = hasten.train(None, [*tiny_overrides, "precision=auto", "train.epochs=2", f"run.dir={run}",
                                  f"resume={first}", "resume.allow_changes=[train.epochs]"])  # fmt: skip
    assert summary["epochs"] == 2 and summary["precision"] == "bf16"  # the checkpoint's choice: an exact resume
    assert "precision=auto -> bf16, as the run being resumed chose" in capsys.readouterr().err
    assert all(len({o.precision for o in options}) == 1 for options in probed)  # precision was not probed again
    assert yaml.safe_load((run / "recipe.yaml").read_text())["precision"] == "bf16"
    fresh = hasten.train(None, [*tiny_overrides, "precision=auto", f"run.dir={tmp_path / 'fresh'}"])
    assert fresh["precision"] == "fp32"  # no resume: the probe decides


def test_auto_is_validated_like_the_fixed_values(tiny_overrides):
    with pytest.raises(RecipeError, match="train.channels_last"):
        hasten.train(None, [*tiny_overrides, "train.channels_last=sometimes"])


# ----- the probe's cache -----------------------------------------------------------------------------------------


def unwrapped(err: str) -> str:
    """hasten's notes as one line each: the terminal's 80 columns wrap them between words (hasten.progress.say)."""
    return err.replace("\n  ", " ")


@pytest.fixture
def counted_probe(monkeypatch) -> list[list[Candidate]]:
    """autotune.probe replaced by one that picks bf16 channels_last (when offered) and counts its calls."""
    calls: list[list[Candidate]] = []

    def fake(model, batch, num_classes, options, loss_fn=None, run_images=None, meter=None):
        calls.append(list(options))
        seconds = {o: 1.0 + 0.1 * i for i, o in enumerate(reversed(options))}
        return choices.Probe(seconds, options[-1], {})

    monkeypatch.setattr(autotune, "probe", fake)
    return calls


def _cached(model: nn.Module, images: torch.Tensor, options: list[Candidate]) -> Candidate:
    batch = (images, torch.randint(0, 3, (len(images),)))
    return autotune.cached_probe(model, batch, 3, options, ["precision", "train.channels_last"], ZEN4).choice


def test_a_second_probe_of_the_same_key_is_read_from_the_cache(counted_probe, capsys):
    options = choices.candidates("auto", "auto", "cpu", ZEN4)
    model, images = _net(), torch.randn(8, 2, 8, 8)
    assert _cached(model, images, options) == Candidate("bf16", True) and len(counted_probe) == 1
    first = unwrapped(capsys.readouterr().err)
    key = probe_cache.probe_key(model, images, options, ZEN4)
    path = probe_cache.cache_path(key)
    assert path.is_file() and path.parent == Path(os.environ["HASTEN_CACHE"]) / "probe"
    assert f"probe cache key {probe_cache.key_digest(key)}: kept in" in first and path.name in first
    assert _cached(model, images, options) == Candidate("bf16", True) and len(counted_probe) == 1  # not probed again
    second = unwrapped(capsys.readouterr().err)
    assert "as probed on this machine before" in second
    assert probe_cache.key_digest(key) in second and path.name in second
    saved = json.loads(path.read_text())
    assert saved["key"] == key and saved["choice"] == "bf16 channels_last"


def test_the_key_changes_with_what_the_timing_depends_on(monkeypatch):
    options = choices.candidates("auto", "auto", "cpu", ZEN4)
    model, images = _net(), torch.randn(8, 2, 8, 8)
    base = probe_cache.key_digest(probe_cache.probe_key(model, images, options, ZEN4))
    wider = nn.Sequential(nn.Conv2d(2, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 3))
    frozen = _net()
    frozen[0].weight.requires_grad_(False)
    others = [
        probe_cache.probe_key(wider, images, options, ZEN4),  # model shape
        probe_cache.probe_key(frozen, images, options, ZEN4),  # what trains
        probe_cache.probe_key(model, torch.randn(16, 2, 8, 8), options, ZEN4),  # batch
        probe_cache.probe_key(model, torch.randn(8, 2, 10, 10), options, ZEN4),  # input shape
        probe_cache.probe_key(model, images, options[:1], ZEN4),  # candidates
    ]
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    others.append(probe_cache.probe_key(model, images, options, ZEN4))  # torch version
    monkeypatch.undo()
    monkeypatch.setattr(probe_cache, "_cpu_identity", lambda: {"cpu": "Another CPU", "arch": "x86_64", "flags": "0"})
    others.append(probe_cache.probe_key(model, images, options, ZEN4))  # the hardware timed on
    monkeypatch.undo()
    others.append(probe_cache.probe_key(model, images, options, machine.PROFILES["amx"]))  # the facts decided from
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        others.append(probe_cache.probe_key(model, images, options, ZEN4))  # threads
    finally:
        torch.set_num_threads(threads)
    digests = [probe_cache.key_digest(key) for key in others]
    assert base not in digests and len(set(digests)) == len(digests)
    same_again = probe_cache.probe_key(_net(), torch.randn(8, 2, 8, 8), options, ZEN4)
    assert probe_cache.key_digest(same_again) == base


def test_a_corrupt_or_foreign_cache_file_is_ignored_with_a_note_never_executed(counted_probe, capsys, tmp_path):
    """Each bad file: a note naming it and why, a fresh probe, a valid file written in its place. The pickle would
    create `marker` if it were ever unpickled."""
    import pickle

    options = choices.candidates("auto", "auto", "cpu", ZEN4)
    model, images = _net(), torch.randn(8, 2, 8, 8)
    key = probe_cache.probe_key(model, images, options, ZEN4)
    path = probe_cache.cache_path(key)
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("pwned",))

    good = {"format": probe_cache.CACHE_FORMAT, "key": key, "choice": "fp32", "seconds": {str(o): 1.0 for o in options},
            "dropped": {}}  # fmt: skip
    cases = {
        "not JSON": pickle.dumps(Payload()),
        "not JSON (UnicodeDecodeError)": b"\xff\xfe",
        "larger than": b" " * (probe_cache.MAX_CACHE_BYTES + 1),
        f"not a format-{probe_cache.CACHE_FORMAT} probe result": json.dumps([1, 2]).encode(),
        "not a format": json.dumps(good | {"format": 1}).encode(),  # timed before inputs took their layout's strides
        "written for another key": json.dumps(good | {"key": {**key, "batch": 9}}).encode(),
        "is not one of the candidates": json.dumps(good | {"choice": "fp64 turbo"}).encode(),
        "timings do not name the candidates": json.dumps(good | {"seconds": {"fp32": 1.0}}).encode(),
        "is not a number of seconds": json.dumps(good | {"seconds": {str(o): "fast" for o in options}}).encode(),
    }
    for why, data in cases.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        before = len(counted_probe)
        assert _cached(model, images, options) == Candidate("bf16", True)
        err = unwrapped(capsys.readouterr().err)
        assert len(counted_probe) == before + 1, why  # probed again
        assert f"probe cache {path} ignored (" in err and why in err, (why, err)
        assert json.loads(path.read_text())["choice"] == "bf16 channels_last"  # replaced by a valid result
    assert not marker.exists()
    path.write_text(json.dumps(good))  # a valid file of another machine's choice for this very key is taken as is
    assert _cached(model, images, options) == Candidate("fp32", False) and len(counted_probe) == len(cases)


def test_an_auto_run_probes_once_and_the_next_reads_the_cache(tiny_overrides, tmp_path, capsys):
    # (every timing is kept here, tests/conftest.py; what is not kept, and why, is tested below, marked steadiness)
    common = [*tiny_overrides, "precision=auto", "train.channels_last=auto", "model.width=4"]
    first = hasten.train(None, [*common, f"run.dir={tmp_path / 'one'}"])
    assert "probe (images/s of the training step)" in unwrapped(capsys.readouterr().err)
    second = hasten.train(None, [*common, f"run.dir={tmp_path / 'two'}"])
    assert "as probed on this machine before" in unwrapped(capsys.readouterr().err)
    assert (first["precision"], first["channels_last"]) == (second["precision"], second["channels_last"])
    assert first["train_loss"] == same_run(second["train_loss"])  # the same choice, the same run


# ----- a busy machine, timings that do not repeat --------------------------------------------------------------


@pytest.mark.steadiness
def test_timings_that_repeat_on_an_idle_machine_are_kept_and_others_are_timed_again_then_not_kept(monkeypatch):
    options = choices.candidates("fp32", "auto", "cpu", AVX2)
    batch = (torch.randn(64, 2, 8, 8), torch.randint(0, 3, (64,)))
    calls = _fake_timings(monkeypatch, {options[0]: 1.0, options[1]: 1.6})
    steady = autotune.probe(_net(), batch, 3, options, meter=IdleMeter())
    assert steady.steadiness.repeats and not steady.steadiness.retimed
    assert len(calls) == len(options) + len(options) + (autotune.ROUNDS - 1)  # warm-up, round 1, then the fastest
    # a machine busy with other work: timed again, and still busy, so the result is the run's and not kept
    calls = _fake_timings(monkeypatch, {options[0]: 1.0, options[1]: 1.6})
    busy = autotune.probe(_net(), batch, 3, options, meter=BusyMeter())
    assert busy.steadiness.busy and busy.steadiness.retimed and not busy.steadiness.repeats
    assert len(calls) == len(options) + len(options) + (autotune.ROUNDS - 1) + steadiness.RETIME_ROUNDS
    assert "the machine is busy: other work took 1.5 of 2 CPUs while timing, even timed again" in (
        busy.steadiness.problem()
    )


@pytest.mark.steadiness
def test_noise_between_repeats_is_not_taken_for_a_difference(monkeypatch):
    """Two layouts 8% apart, each one's fastest step 20% faster than every other (as where other work paused once):
    the gap is within the noise, so the first in order wins (the same choice every run), and the result, timed
    again and still not repeating, is not kept; steady timings 8% apart: the faster."""
    options = choices.candidates("fp32", "auto", "cpu", AVX2)
    batch = (torch.randn(64, 2, 8, 8), torch.randint(0, 3, (64,)))
    counts = {option: 0 for option in options}

    def noisy(step, batch, device):
        counts[step.candidate] += 1  # the first is the warm-up; the first timed step is fast, no other
        base = 1.08 if step.candidate == options[0] else 1.0
        return base * (1.0 if counts[step.candidate] == 2 else 1.2), 1.0

    _fake_timings(monkeypatch, {})
    monkeypatch.setattr(autotune, "_timed_step", noisy)
    result = autotune.probe(_net(), batch, 3, options, meter=IdleMeter())
    assert result.choice == options[0] and result.steadiness.spread == pytest.approx(0.2)
    assert result.steadiness.retimed and counts[options[0]] == 1 + autotune.ROUNDS + steadiness.RETIME_ROUNDS
    assert not result.steadiness.repeats and "timings differed by up to 20%" in result.steadiness.problem()
    _fake_timings(monkeypatch, {options[0]: 1.08, options[1]: 1.0})
    assert autotune.probe(_net(), batch, 3, options, meter=IdleMeter()).choice == options[1]


@pytest.mark.steadiness
def test_a_result_that_did_not_repeat_is_used_and_said_but_not_cached(monkeypatch, capsys):
    options = choices.candidates("auto", "auto", "cpu", ZEN4)
    model, images = _net(), torch.randn(8, 2, 8, 8)
    unsteady = steadiness.Steadiness.of(0.3, BusyMeter().stop(), retimed=True)
    calls = []

    def fake(model, batch, num_classes, options, loss_fn=None, run_images=None, meter=None):
        calls.append(options)
        return choices.Probe({o: 1.0 for o in options}, options[0], {}, unsteady)

    monkeypatch.setattr(autotune, "probe", fake)
    assert _cached(model, images, options) == options[0]
    err = unwrapped(capsys.readouterr().err)
    assert "timing the training step in 4 settings (at most about 8 s" in err  # said before it times
    assert "not kept: the machine is busy: other work took 1.5 of 2 CPUs" in err and "the next one times again" in err
    assert not probe_cache.cache_path(probe_cache.probe_key(model, images, options, ZEN4)).exists()
    _cached(model, images, options)
    assert len(calls) == 2  # nothing was cached: timed again


@pytest.mark.steadiness
def test_batch_timings_that_did_not_repeat_are_not_cached(monkeypatch):
    option = Candidate("fp32", False)
    batch = (torch.randn(64, 2, 8, 8), torch.randint(0, 3, (64,)))
    calls = []

    def fake(model, batch, num_classes, option, sizes, run_images=None, meter=None):
        calls.append(sizes)
        return {size: 0.001 * size for size in sizes}, steadiness.Steadiness.of(0.4, None, retimed=True)

    monkeypatch.setattr(autotune, "time_batches", fake)
    measured, where = autotune.cached_batch_times(_net(), batch, 3, option, [16, 64], AVX2)
    assert measured.seconds == {16: 0.016, 64: 0.064} and "not kept" in where and "differed by up to 40%" in where
    autotune.cached_batch_times(_net(), batch, 3, option, [16, 64], AVX2)
    assert len(calls) == 2


def test_a_batch_size_that_cannot_win_is_timed_once_and_the_others_every_round(monkeypatch):
    """time_batches: after the first timed round, a size whose predicted time to the result (rules.predicted_cost)
    is BATCH_OUTPACED times the least keeps that one timing (on a CPU the largest batch's steps were most of the
    timing); the others go on, and the choice is the one timing them all every round gives."""
    option = Candidate("fp32", False)
    batch = (torch.randn(256, 2, 8, 8), torch.randint(0, 3, (256,)))
    # seconds a step: 16 and 64 close (costs 5 x 0.010 and 2 x 0.030), 256 far behind (1.25 x 0.3 = 0.375)
    step_seconds = {16: 0.010, 64: 0.030, 256: 0.300}
    timed: list[int] = []

    def fake(step, batch, device):
        size = len(batch[1])
        timed.append(size)
        return step_seconds[size], 1.0

    monkeypatch.setattr(autotune, "_timed_step", fake)
    seconds, _ = autotune.time_batches(_net(), batch, 3, option, [16, 64, 256], run_images=10**7, meter=IdleMeter())
    assert seconds == step_seconds  # the one timing of 256 still stands for it (the line through the sizes)
    assert timed.count(256) == 2  # the warm-up and the first timed round
    assert timed.count(16) == timed.count(64) == autotune.ROUNDS + 1
    assert rules.choose_batch(rules.step_time_line(seconds, [16, 32, 64, 128, 256])) == 16
    timed.clear()
    step_seconds[256] = 0.080  # now 1.25 x 0.08 = 0.1, within 2x of 16's 0.05: timed every round
    autotune.time_batches(_net(), batch, 3, option, [16, 64, 256], run_images=10**7, meter=IdleMeter())
    assert timed.count(256) == timed.count(16) == autotune.ROUNDS + 1
