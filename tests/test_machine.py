"""The machine as data (hasten/machine.py): the facts gathered or named by HASTEN_MACHINE, the decisions that read
them under every profile, and the meter that tells a busy machine."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import hasten
from hasten import machine
from hasten.cli import main
from hasten.engine.distributed import resolve_device
from hasten.engine.optimizers import newton_schulz_dtype
from hasten.tune import autotune, choices, probe_cache

pytestmark = pytest.mark.machine

PROFILES = machine.PROFILES


def test_the_kernel_set_is_the_largest_the_cpu_has_no_larger_than_a_cap():
    zen4 = {"avx2", "avx512f", "avx512_bf16"}
    assert machine.kernel_set(zen4) == "avx512-bf16"
    assert machine.kernel_set(zen4 | {"amx_tile"}) == "amx"
    assert machine.kernel_set({"sse4_1", "avx2"}) == "avx2"
    assert machine.kernel_set(set()) == "sse41"
    assert machine.kernel_set(zen4, "AVX2") == "avx2"  # make test-as CPU=avx2: bf16 emulated, as on an AVX2 CPU
    assert machine.kernel_set(zen4, "avx512_core") == "avx512"
    assert machine.kernel_set({"avx2"}, "AVX512_CORE_AMX") == "avx2"  # a cap never adds instructions
    assert machine.kernel_set(zen4, "nonsense") == "avx512-bf16"  # oneDNN ignores what it does not know
    assert machine.cpu_flags("processor: 0\nflags\t\t: fpu avx2 avx512f\n") == {"fpu", "avx2", "avx512f"}


def test_a_profile_replaces_the_gathered_facts_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.delenv(machine.ENV, raising=False)
    assert machine.current() == machine.gather() and machine.current().profile is None
    monkeypatch.setenv(machine.ENV, "amx")
    amx = machine.current()
    assert amx.kernels == "amx" and amx.cpu_bf16 and amx.profile == "amx" and amx.accelerator is None
    monkeypatch.setenv(machine.ENV, "native")
    assert machine.current() == machine.gather()
    monkeypatch.setenv(machine.ENV, "zen4")
    with pytest.raises(machine.MachineError, match="HASTEN_MACHINE: 'zen4' is not a machine profile; choose one of"):
        machine.current()


def test_the_cli_refuses_an_unknown_profile_before_any_work(monkeypatch, capsys):
    monkeypatch.setenv(machine.ENV, "h100")
    assert main(["schedule", "fashion-fast"]) == 2
    err = capsys.readouterr().err
    assert "HASTEN_MACHINE: 'h100' is not a machine profile" in err and "cuda" in err and "Traceback" not in err


def test_a_cuda_profile_on_a_machine_without_one_runs_on_the_cpu_and_says_why(monkeypatch):
    monkeypatch.setenv(machine.ENV, "cuda")
    described = machine.current()
    assert described.accelerator is not None and described.accelerator.bf16
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the profile's GPU is present (tests marked cuda run it)")
    assert not described.accelerator.present and described.gpu is None
    kind, note = machine.auto_device(described)
    assert kind == "cpu" and "HASTEN_MACHINE=cuda describes a cuda device" in note and "this process has none" in note
    assert resolve_device("auto", described).type == "cpu"


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_s_decisions(name):
    """What each machine decides, on any machine: the table a reviewer checks against the hardware."""
    described = PROFILES[name]
    gpu = described.accelerator
    precisions = choices.precision_candidates(described, "cpu")
    assert precisions == (["fp32", "bf16"] if name in ("avx512-bf16", "amx", "cuda") else ["fp32"])
    if gpu is not None:
        assert choices.precision_candidates(described, "cuda") == (["fp32", "bf16"] if gpu.bf16 else ["fp32", "fp16"])
        assert newton_schulz_dtype("cuda", described) == (torch.bfloat16 if gpu.bf16 else torch.float32)
        assert machine.process_backend("cuda") == "nccl"
    assert newton_schulz_dtype("cpu", described) == torch.float32  # no fast small bf16 products on the CPUs measured
    assert machine.process_backend("cpu") == "gloo"
    assert not machine.pin_memory(described, "cpu")
    assert machine.loader_workers(described) == min(4, described.cores - 1)
    assert machine.threads_per_process(described, 2) == max(1, described.cores // 2)
    heap = {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 64 << 20}  # glibc: a CPU step's tensors from the heap
    assert machine.cpu_allocator(described, "cpu") == heap
    assert machine.cpu_allocator(described, "cuda") == {}  # a GPU's tensors: torch's caching allocator


def test_the_allocator_rule_reads_the_c_library():
    """mallopt is glibc's: another C library (or one Python cannot name) keeps its own defaults."""
    zen4 = PROFILES["avx512-bf16"]
    for libc, settings in (("glibc 2.36", True), ("glibc", True), ("musl", False), ("", False)):
        assert bool(machine.cpu_allocator(dataclasses.replace(zen4, libc=libc), "cpu")) is settings, libc
    assert machine.apply_cpu_allocator({}) is False  # nothing asked: nothing changed


def test_a_cpu_run_under_glibc_takes_the_allocator_settings_says_so_and_records_them(tiny_overrides, capsys):
    if not machine.gather().libc.startswith("glibc"):
        pytest.skip(f"this machine's C library is {machine.gather().libc or 'unknown'}, not glibc")
    summary = hasten.train(None, [*tiny_overrides, "train.epochs=1", "device=cpu"])
    err = capsys.readouterr().err.replace("\n  ", " ")
    assert summary["cpu_allocator"] == {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 64 << 20}
    assert "CPU allocator (glibc mallopt): M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 64 MiB" in err


def test_workers_and_threads_share_the_cores_between_processes():
    sixteen = PROFILES["cuda"]
    assert machine.loader_workers(sixteen) == 4
    four_ranks = machine.Machine(**{**sixteen.record(), "accelerator": sixteen.accelerator, "processes": 4})
    assert machine.loader_workers(four_ranks) == 3  # 4 cores each, one for the rank itself
    assert machine.loader_workers(PROFILES["avx2"]) == 1
    assert machine.threads_per_process(PROFILES["avx2"], 4) == 1


@pytest.mark.parametrize("name", ["avx2", "avx512-bf16", "amx"])
def test_a_cpu_profile_s_precision_choice_runs_on_any_cpu(name, tiny_overrides, monkeypatch, capsys):
    """Under a CPU profile the run really times its candidates (bf16 autocast runs on every CPU, slowly), so the
    lines a Zen 4 or an AMX Xeon reaches run here too; under avx2 there is no bf16 candidate."""
    monkeypatch.setenv(machine.ENV, name)
    summary = hasten.train(None, [*tiny_overrides, "precision=auto", "train.channels_last=false", "train.epochs=1"])
    err = capsys.readouterr().err.replace("\n  ", " ")
    if name == "avx2":
        assert summary["precision"] == "fp32" and "probe (images/s" not in err  # one candidate: nothing timed
        assert "precision=auto -> fp32: the CPU has no bf16 instructions (avx2 kernels" in err
    else:
        assert summary["precision"] in ("fp32", "bf16") and "bf16 " in err.split("probe (images/s")[1]
    assert summary["machine"]["profile"] == name and summary["machine"]["kernels"] == name  # recorded with the run


TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit, as read_proc_stat reads it


def _stat_text(busy_seconds: float, cpus: int) -> str:
    """/proc/stat's text on a machine whose `cpus` CPUs have spent `busy_seconds` busy since boot."""
    ticks = round(busy_seconds * TICKS)
    lines = [f"cpu  {ticks - ticks // 4} 0 {ticks // 4} 987654 321 0 0 0 0 0"]  # user, nice, system, idle, iowait...
    lines += [f"cpu{n} 0 0 0 0 0 0 0 0 0 0" for n in range(cpus)] + ["intr 12 3 4", "ctxt 5678", "processes 91"]
    return "\n".join(lines) + "\n"


class Readings:
    """What an ActivityMeter reads, as a machine with stopped clocks gives it: each sample moves the wall clock on
    by `wall` seconds, this process's CPU clock by `own`, and the CPU time the machine spent busy by `busy` (this
    process's included). No real time passes and no other process runs: the meter's arithmetic alone is tested."""

    def __init__(self, wall: float, own: float, busy: float, cpus: int = 2):
        self.step = {"wall": wall, "own": own, "busy": busy}
        self.reads = {"wall": 0, "own": 0, "busy": 0}
        self.cpus = cpus

    def _next(self, kind: str, since: float) -> float:
        self.reads[kind] += 1
        return since + (self.reads[kind] - 1) * self.step[kind]

    def stat(self) -> str:
        return _stat_text(self._next("busy", 50_000.0), self.cpus)

    def own(self) -> float:
        return self._next("own", 12.5)

    def wall(self) -> float:
        return self._next("wall", 800.0)

    def meter(self) -> machine.ActivityMeter:
        return machine.ActivityMeter(read_stat=self.stat, own_clock=self.own, wall_clock=self.wall)


def test_the_meter_counts_other_processes_time_not_its_own():
    """Other work on the machine is the busy CPU time /proc/stat counts less this process's own CPU time."""
    busy = Readings(wall=1.0, own=0.05, busy=1.9).meter()  # two CPUs: this process 0.05 s, other work 1.85 s
    busy.start()
    activity = busy.stop()
    assert activity == machine.Activity(wall_seconds=1.0, own_seconds=pytest.approx(0.05),
                                        others_seconds=pytest.approx(1.85), cpus=2)  # fmt: skip
    assert activity.others_share == pytest.approx(0.925) and activity.others_cpus == pytest.approx(1.85)
    assert activity.describe() == "other work took 1.9 of 2 CPUs"
    alone = Readings(wall=2.0, own=1.6, busy=1.6, cpus=4).meter()  # all the busy time is this process's
    alone.start()
    assert alone.stop() == machine.Activity(2.0, pytest.approx(1.6), pytest.approx(0.0, abs=1e-9), 4)
    both = activity + machine.Activity(2.0, 1.6, 0.0, 4)  # two intervals: their sums, on the larger machine
    assert both == machine.Activity(3.0, pytest.approx(1.65), pytest.approx(1.85), 4)
    assert both.others_share == pytest.approx(1.85 / 12)


def test_the_meter_knows_nothing_where_the_machine_s_cpu_time_cannot_be_read():
    unread = machine.ActivityMeter(read_stat=lambda: None, own_clock=lambda: 1.0, wall_clock=lambda: 2.0)
    unread.start()
    assert unread.stop() is None  # not Linux, or /proc not mounted
    garbled = machine.ActivityMeter(read_stat=lambda: "cpu  1 2 x\n", own_clock=lambda: 1.0, wall_clock=lambda: 2.0)
    garbled.start()
    assert garbled.stop() is None
    assert Readings(1.0, 0.0, 0.0).meter().stop() is None  # stopped before it was started
    assert machine.read_proc_stat(_stat_text(12.0, 3)) == (pytest.approx(12.0), 3)


def test_this_machine_s_proc_stat_reads_as_busy_seconds_and_cpus():
    text = machine._proc_stat()
    if text is None:
        pytest.skip("/proc/stat cannot be read here")
    busy, cpus = machine.read_proc_stat(text)
    assert cpus == sum(1 for line in text.splitlines() if line[:3] == "cpu" and line[3:4].isdigit()) >= 1
    assert busy > 0  # the machine has run since boot


def test_a_child_waited_for_is_the_meters_own_with_the_children_clock():
    """A benchmark that times a child process: the child's CPU time is its own, not other work's, once the child
    has been waited for (the default clock counts this process alone, so the same child reads as other work)."""
    # a child that used 1.0 s of CPU while this process used 0.02 s: the machine's busy time rose by 1.02 s
    children = Readings(wall=1.5, own=1.02, busy=1.02).meter()  # the clock that counts the waited-for child
    alone = Readings(wall=1.5, own=0.02, busy=1.02).meter()  # this process's clock alone
    for meter in (children, alone):
        meter.start()
    assert children.stop() == machine.Activity(1.5, pytest.approx(1.02), pytest.approx(0.0, abs=1e-9), 2)
    assert alone.stop() == machine.Activity(1.5, pytest.approx(0.02), pytest.approx(1.0), 2)
    # the children clock itself: a child that spins until its own CPU clock reads 0.2 s adds that much once waited
    # for (CPU time the child used, whatever else the machine is doing: no wall-clock reading is compared)
    spin = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\n"
    before = machine.with_children_cpu_seconds()
    subprocess.run([sys.executable, "-c", spin], check=True)
    assert machine.with_children_cpu_seconds() - before >= 0.19


@pytest.mark.steadiness
def test_a_real_probe_with_other_processes_busy_says_so_and_keeps_nothing(capsys, monkeypatch):
    """The probe on a loaded machine (its meter reads other work on 1.5 of 2 CPUs): re-timed, said busy, nothing
    cached (the choice serves this run only)."""
    readings = Readings(wall=1.0, own=0.5, busy=2.0)

    def busy_meter(*args, **kwargs) -> machine.ActivityMeter:
        return readings.meter()

    monkeypatch.setattr(autotune, "ActivityMeter", busy_meter)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 14 * 14, 10))  # fmt: skip
    batch = (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)))
    options = choices.candidates("fp32", "auto", "cpu", PROFILES["avx2"])
    result = autotune.cached_probe(model, batch, 10, options, ["train.channels_last"], PROFILES["avx2"])
    err = capsys.readouterr().err.replace("\n  ", " ")
    assert result.steadiness is not None and result.steadiness.busy and result.steadiness.retimed
    assert "not kept: the machine is busy: other work took 1.5 of 2 CPUs" in err
    assert readings.reads["busy"] == 4  # read around the timing and around the timing again
    assert not probe_cache.cache_path(probe_cache.probe_key(model, batch[0], options, PROFILES["avx2"])).exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch sees none on this machine")
def test_the_gathered_gpu_is_the_device_auto_runs_on():
    found = machine.gather()
    assert found.gpu is not None and found.gpu.kind == "cuda" and found.gpu.count == torch.cuda.device_count()
    assert resolve_device("auto", found).type == "cuda"
    assert found.gpu.bf16 == torch.cuda.is_bf16_supported()
