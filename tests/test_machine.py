"""The machine as data (hasten/machine.py): the facts gathered or named by HASTEN_MACHINE, the decisions that read
them under every profile, and the meter that tells a busy machine."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
import torch

import hasten
from hasten import machine
from hasten.cli import main
from hasten.engine.distributed import resolve_device
from hasten.engine.optimizers import newton_schulz_dtype
from hasten.tune import autotune, choices, probe_cache, steadiness

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


SPIN = "import time\nend = time.time() + 20\nwhile time.time() < end: pass"  # 20 s at most, killed sooner


def _spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


@pytest.mark.steadiness
def test_the_meter_sees_other_processes_busy_on_the_cores():
    """Other processes spinning on every CPU: their time shows, not this process's (which sleeps)."""
    if machine.read_proc_stat("cpu  1 0 0 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0\n") is None:
        pytest.skip("no /proc/stat here")
    meter = machine.ActivityMeter()
    if meter.read_stat() is None:
        pytest.skip("/proc/stat cannot be read here")
    spinners = _spinners(machine.read_proc_stat(meter.read_stat())[1])
    try:
        time.sleep(0.3)  # they start
        meter.start()
        time.sleep(1.0)
        activity = meter.stop()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert activity is not None and activity.own_seconds < 0.2
    assert activity.others_share > steadiness.BUSY_SHARE, activity


@pytest.mark.steadiness
def test_a_child_waited_for_is_the_meters_own_with_the_children_clock():
    """A benchmark that times a child process: the child's CPU time is its own, not other work's, once the child
    has been waited for (the default clock counts this process alone, so the same child reads as other work)."""
    if machine.read_proc_stat("cpu  1 0 0 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0\n") is None:
        pytest.skip("no /proc/stat here")
    spin_for_a_second = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
    activities = {}
    for name, clock in (("children", machine.with_children_cpu_seconds), ("self", None)):
        meter = machine.ActivityMeter(own_clock=clock)
        if meter.read_stat() is None:
            pytest.skip("/proc/stat cannot be read here")
        meter.start()
        subprocess.run([sys.executable, "-c", spin_for_a_second], check=True)
        activities[name] = meter.stop()
    children, alone = activities["children"], activities["self"]
    assert children.own_seconds >= 0.9, children  # the child's second of CPU time (and its start-up)
    assert alone.own_seconds < 0.5 and alone.others_seconds >= 0.8, alone  # the same child, read as other work
    assert children.others_seconds < alone.others_seconds - 0.5, (children, alone)


@pytest.mark.steadiness
def test_a_real_probe_with_other_processes_busy_says_so_and_keeps_nothing(capsys, monkeypatch):
    """The probe on a loaded machine: re-timed, said busy, nothing cached (the choice serves this run only)."""
    meter = machine.ActivityMeter()
    if meter.read_stat() is None:
        pytest.skip("/proc/stat cannot be read here")
    # steps of tens of milliseconds: /proc/stat counts in ticks of 10 ms, so a tiny net's timing says little
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(32 * 28 * 28, 10))  # fmt: skip
    batch = (torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    options = choices.candidates("fp32", "auto", "cpu", PROFILES["avx2"])
    spinners = _spinners(machine.read_proc_stat(meter.read_stat())[1])
    try:
        time.sleep(0.3)
        result = autotune.cached_probe(model, batch, 10, options, ["train.channels_last"], PROFILES["avx2"])
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    err = capsys.readouterr().err.replace("\n  ", " ")
    assert result.steadiness is not None and result.steadiness.busy and result.steadiness.retimed
    assert "not kept: the machine is busy: other work took" in err
    assert not probe_cache.cache_path(probe_cache.probe_key(model, batch[0], options, PROFILES["avx2"])).exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch sees none on this machine")
def test_the_gathered_gpu_is_the_device_auto_runs_on():
    found = machine.gather()
    assert found.gpu is not None and found.gpu.kind == "cuda" and found.gpu.count == torch.cuda.device_count()
    assert resolve_device("auto", found).type == "cuda"
    assert found.gpu.bf16 == torch.cuda.is_bf16_supported()
