"""The machine as data: the facts hasten decides from, gathered in one place, or named by `HASTEN_MACHINE`.

What hasten decides for a machine (the probe's precision candidates, the evaluation batch, loader workers and
pinned memory, Muon's orthogonalisation dtype, the process group's backend, what `device=auto` means, how the C
library's allocator keeps a CPU run's tensors) is a function of a `Machine`: the CPU's kernel set (sse41, avx2,
avx512, avx512-bf16, amx), its usable cores and memory, the accelerator and what it computes fast, the C library,
and the process count. `current()` gathers them from this machine once
(`gather`), or, with `HASTEN_MACHINE=<profile>` set, takes a profile's (`PROFILES`) instead, so the decisions a
Zen 4, an AMX Xeon or an H100 would make run on any machine. No rule asks the hardware itself; each is given the
Machine.

A profile replaces facts, not hardware: under `amx` on an AVX2 CPU, bf16 becomes a precision candidate and is really
timed (bf16 autocast runs on every CPU, slowly); under `cuda` on a machine without a GPU the accelerator is
described but absent (`Accelerator.present`), so `device=auto` runs on the CPU and says why, and what truly needs
the device is skipped by the tests with that reason, never faked.

The CPU's kernel set is what oneDNN will run: the instruction set the CPU has, capped by ONEDNN_MAX_CPU_ISA when
that is set (a capped process emulates bf16 like a CPU without it).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# the machine's activity (hasten/activity.py, importable before torch is loaded), re-exported: read with its facts
from hasten.activity import (  # noqa: F401
    Activity,
    ActivityMeter,
    _proc_stat,
    read_proc_stat,
    with_children_cpu_seconds,
)
from hasten.errors import HastenError

ENV = "HASTEN_MACHINE"

# smallest first; a CPU runs the largest its instructions (and a cap) allow
KERNEL_SETS = ("sse41", "avx2", "avx512", "avx512-bf16", "amx")
BF16_KERNELS = ("avx512-bf16", "amx")  # native bf16 dot products: elsewhere oneDNN emulates bf16, slower than fp32
# ONEDNN_MAX_CPU_ISA's values (oneDNN's cpu_isa names, upper case) by the kernel set they allow at most
ONEDNN_CAPS = {
    "SSE41": "sse41",
    "AVX": "sse41",
    "AVX2": "avx2",
    "AVX2_VNNI": "avx2",
    "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512-bf16",
    "AVX10_1_512": "avx512-bf16",
    "AVX512_CORE_FP16": "avx512-bf16",
    "AVX512_CORE_AMX": "amx",
    "AVX10_1_512_AMX": "amx",
    "AVX512_CORE_AMX_FP16": "amx",
    "AVX10_1_512_AMX_FP16": "amx",
    "ALL": "amx",
}
GIB = 1 << 30


class MachineError(HastenError):
    """HASTEN_MACHINE names no profile: exit 2, naming the variable and the profiles."""


@dataclass(frozen=True)
class Accelerator:
    """A GPU (or another torch device): its kind (torch's device type), name, count, memory per device, whether it
    multiplies bf16 and fp16 at full speed, and whether this process can really run on it (False where a profile
    describes one the machine lacks)."""

    kind: str
    name: str
    count: int
    memory_bytes: int
    bf16: bool
    fp16: bool
    present: bool = True


@dataclass(frozen=True)
class Machine:
    """What hasten decides from about the machine (module docstring). `profile`: the HASTEN_MACHINE profile these
    facts came from; None when they were gathered from this machine."""

    kernels: str
    cpu: str
    arch: str
    cores: int
    memory_bytes: int
    accelerator: Accelerator | None = None
    processes: int = 1
    profile: str | None = None
    libc: str = ""  # the C library and its version ("glibc 2.36"); "" where Python cannot tell

    @property
    def cpu_bf16(self) -> bool:
        """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX)."""
        return self.kernels in BF16_KERNELS

    @property
    def gpu(self) -> Accelerator | None:
        """The accelerator this process can run on, or None."""
        return self.accelerator if self.accelerator is not None and self.accelerator.present else None

    def identity(self) -> dict[str, Any]:
        """The facts a timing on this machine depends on (the probe cache's key): the CPU and its kernels, the
        cores, the accelerator, and the profile when the facts came from one."""
        found: dict[str, Any] = {"cpu": self.cpu, "arch": self.arch, "kernels": self.kernels, "cores": self.cores}
        if self.accelerator is not None:
            found["accelerator"] = dataclasses.asdict(self.accelerator)
        if self.profile is not None:
            found["profile"] = self.profile
        return found

    def describe(self) -> str:
        """One line for the opening notes and the run's records."""
        accelerator = self.accelerator
        gpu = ""
        if accelerator is not None:
            absent = "" if accelerator.present else ", absent here"
            gpu = f"; {accelerator.count}x {accelerator.name} ({accelerator.memory_bytes / GIB:.0f} GiB{absent})"
        source = f"HASTEN_MACHINE={self.profile}" if self.profile else "gathered"
        return (f"{self.cpu} ({self.kernels} kernels, {self.cores} cores, {self.memory_bytes / GIB:.0f} GiB){gpu}; "
                f"{self.processes} process(es); {source}")  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The facts as JSON-ready data (summary.json's environment)."""
        return dataclasses.asdict(self)


_CPU_PROFILE = dict(arch="x86_64", cores=2, memory_bytes=24 * GIB, libc="glibc")  # the machines this project runs on
H100 = Accelerator(kind="cuda", name="NVIDIA H100 80GB HBM3", count=1, memory_bytes=80 * GIB, bf16=True, fp16=True)
V100 = Accelerator(kind="cuda", name="Tesla V100-SXM2-16GB", count=1, memory_bytes=16 * GIB, bf16=False, fp16=True)

PROFILES: dict[str, Machine] = {
    "sse41": Machine(kernels="sse41", cpu="an x86-64 CPU without AVX", **_CPU_PROFILE),
    "avx2": Machine(kernels="avx2", cpu="AMD EPYC (AVX2 only, Zen 2/3)", **_CPU_PROFILE),
    "avx512": Machine(kernels="avx512", cpu="Intel Xeon (AVX-512 without BF16, Skylake-SP)", **_CPU_PROFILE),
    "avx512-bf16": Machine(kernels="avx512-bf16", cpu="AMD EPYC (Zen 4, AVX512-BF16)", **_CPU_PROFILE),
    "amx": Machine(kernels="amx", cpu="Intel Xeon (Sapphire Rapids, AMX)", **_CPU_PROFILE),
    # a GPU server: an H100/H200-class GPU (bf16 and fp16 tensor cores) on a Zen 4 host
    "cuda": Machine(
        kernels="avx512-bf16",
        cpu="AMD EPYC (Zen 4, AVX512-BF16)",
        arch="x86_64",
        cores=16,
        memory_bytes=128 * GIB,
        accelerator=H100,
        libc="glibc",
    ),  # fmt: skip
    # a GPU without bf16 (Volta, Turing): fp16 with loss scaling is its 16-bit mode
    "cuda-fp16": Machine(
        kernels="avx512",
        cpu="Intel Xeon (AVX-512 without BF16, Skylake-SP)",
        arch="x86_64",
        cores=8,
        memory_bytes=64 * GIB,
        accelerator=V100,
        libc="glibc",
    ),  # fmt: skip
}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo's text (x86 `flags`, ARM `Features`)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def kernel_set(flags: set[str], cap: str | None = None) -> str:
    """The kernel set a CPU with `flags` runs: the largest it has instructions for, no larger than the
    ONEDNN_MAX_CPU_ISA `cap` allows (an unknown cap: no cap)."""
    needs = {"amx": "amx_tile", "avx512-bf16": "avx512_bf16", "avx512": "avx512f", "avx2": "avx2"}
    found = next((name for name in reversed(KERNEL_SETS) if needs.get(name, "") in flags or name == "sse41"), "sse41")
    capped = ONEDNN_CAPS.get((cap or "").strip().upper())
    if capped is not None and KERNEL_SETS.index(capped) < KERNEL_SETS.index(found):
        return capped
    return found


def _cpu_name(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


def _gather_accelerator() -> Accelerator | None:
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        fp16 = props.major >= 7  # tensor cores from Volta on
        return Accelerator(kind="cuda", name=props.name, count=count, memory_bytes=int(props.total_memory),
                           bf16=bool(torch.cuda.is_bf16_supported()), fp16=fp16)  # fmt: skip
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return Accelerator(kind="mps", name="Apple GPU (MPS)", count=1, memory_bytes=_memory_bytes(), bf16=False,
                           fp16=True)  # fmt: skip
    return None


def _processes() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


@functools.cache
def gather() -> Machine:
    """This machine's facts, read once a process: /proc/cpuinfo's CPU and flags (capped by ONEDNN_MAX_CPU_ISA),
    the usable cores, the memory, torch's accelerator."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    flags = cpu_flags(cpuinfo)
    if not flags and torch.cpu._is_avx2_supported():  # no /proc/cpuinfo (macOS, Windows): ask torch
        flags = {"avx2"} | ({"avx512f"} if torch.cpu._is_avx512_supported() else set())
        flags |= {"avx512_bf16"} if torch.cpu._is_avx512_bf16_supported() else set()
        flags |= {"amx_tile"} if torch.cpu._is_amx_tile_supported() else set()
    return Machine(
        kernels=kernel_set(flags, os.environ.get("ONEDNN_MAX_CPU_ISA")),
        cpu=_cpu_name(cpuinfo),
        arch=platform.machine(),
        cores=_usable_cores(),
        memory_bytes=_memory_bytes(),
        accelerator=_gather_accelerator(),
        processes=_processes(),
        libc=" ".join(part for part in platform.libc_ver() if part),
    )


def profile(name: str) -> Machine:
    """The machine profile `name` (PROFILES), as this machine would run it: its accelerator marked absent where
    torch has no such device here, its process count this job's."""
    try:
        found = PROFILES[name]
    except KeyError:
        raise MachineError(
            f"{ENV}: {name!r} is not a machine profile; choose one of {', '.join(PROFILES)} (or unset it)"
        ) from None
    accelerator = found.accelerator
    if accelerator is not None:
        real = gather().accelerator
        present = real is not None and real.kind == accelerator.kind
        accelerator = dataclasses.replace(accelerator, present=present)
    return dataclasses.replace(found, accelerator=accelerator, processes=_processes(), profile=name)


def current() -> Machine:
    """The machine hasten decides for: HASTEN_MACHINE's profile when it is set (and not empty or `native`), else
    this machine's gathered facts."""
    name = os.environ.get(ENV, "").strip()
    return gather() if name in ("", "native") else profile(name)


# ---- decisions that are the machine's alone ------------------------------------------------------------------------


def auto_device(machine: Machine) -> tuple[str, str | None]:
    """What `device=auto` runs on: the accelerator where this process has one, else the CPU; and a note when a
    profile describes an accelerator this machine lacks (the run is on the CPU, not a pretend GPU)."""
    if machine.gpu is not None:
        return machine.gpu.kind, None
    if machine.accelerator is not None:
        return "cpu", (
            f"device=auto -> cpu: {ENV}={machine.profile} describes a {machine.accelerator.kind} device "
            f"({machine.accelerator.name}), but this process has none; its CPU decisions are the profile's"
        )
    return "cpu", None


def loader_workers(machine: Machine) -> int:
    """DataLoader workers when data.workers is unset: one per core of this process's share but one, at most 4
    (benchmarks/imagefolder.py)."""
    share = max(1, machine.cores // max(1, machine.processes))
    return max(min(4, share - 1), 0)


def threads_per_process(machine: Machine, processes: int) -> int:
    """Intra-op threads for each of `processes` workers on this machine's cores."""
    return max(1, machine.cores // max(1, processes))


# glibc's malloc maps every block above its mmap threshold afresh and unmaps it when it is freed, and hands the top of
# its heap back to the system above its trim threshold. A CPU training step frees its activations and allocates
# them again the next step, so with glibc's defaults every step faults their pages in again: fashion-fast's step on
# a Zen 4 took 4,400-7,500 page faults, ~750 with the settings below, and its 5 epochs trained in 89.4 s instead of
# 97.7 s (2 alternated rounds, the same accuracy; docs/results/zen4.md). Page faults are the kernel's work, the same
# on every CPU kernel set.
HEAP_BLOCK_BYTES = 32 << 20  # M_MMAP_THRESHOLD: blocks up to this come from the heap (glibc's largest on 64-bit)
HEAP_KEEP_BYTES = 64 << 20  # M_TRIM_THRESHOLD: free heap kept for the next step, at most this (2x, glibc's own ratio)
MALLOPT = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3}  # glibc's mallopt parameter numbers (malloc.h)


def cpu_allocator(machine: Machine, device_type: str) -> dict[str, int]:
    """The C allocator's settings for a run on `device_type` on this machine: for a CPU run under glibc, tensors
    up to HEAP_BLOCK_BYTES from the heap and up to HEAP_KEEP_BYTES of it kept between steps; none ({}) elsewhere
    (another C library has other defaults and no mallopt; a GPU run's tensors come from torch's caching allocator)."""
    if device_type != "cpu" or not machine.libc.startswith("glibc"):
        return {}
    return {"M_MMAP_THRESHOLD": HEAP_BLOCK_BYTES, "M_TRIM_THRESHOLD": HEAP_KEEP_BYTES}


def apply_cpu_allocator(settings: dict[str, int]) -> bool:
    """Give this process's glibc malloc `settings` (cpu_allocator's); whether it took every one. False, and nothing
    changed, where this process's C library has no mallopt (a profile describing glibc on another system)."""
    import ctypes
    import ctypes.util

    if not settings:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(MALLOPT[name], value) == 1 for name, value in settings.items())


def process_backend(device_type: str) -> str:
    """The process group's backend: NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device_type == "cuda" else "gloo"


def pin_memory(machine: Machine, device_type: str) -> bool:
    """Whether loaders pin host memory: where batches are copied to a GPU this process really has."""
    return device_type == "cuda" and machine.gpu is not None
