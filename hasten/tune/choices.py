"""What the start-up probe chooses between: the settings a recipe leaves `auto` (`precision`,
`train.channels_last`), as `Candidate`s, and what timing them found (`Probe`).

Which candidates there are is the machine's (`precision_candidates` of a hasten.machine.Machine): the probe never
asks the hardware which precisions it has, so HASTEN_MACHINE's profiles run every machine's candidates anywhere.
fp16 (no fast CPU kernels, and it needs loss scaling) is a candidate only on a GPU without bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hasten.machine import Machine
from hasten.recipe.schema import PrecisionName
from hasten.tune.steadiness import Steadiness


@dataclass(frozen=True)
class Candidate:
    precision: PrecisionName
    channels_last: bool

    def __str__(self) -> str:
        return f"{self.precision}{' channels_last' if self.channels_last else ''}"


@dataclass
class Probe:
    """What the probe measured: the seconds of one step per candidate (inf: dropped) and the choice."""

    seconds: dict[Candidate, float]
    choice: Candidate
    dropped: dict[Candidate, str]
    steadiness: Steadiness | None = None  # None: read from the cache (it repeated when it was kept)

    def describe(self, batch: int) -> str:
        timed = ", ".join(f"{c} {batch / s:,.0f}" for c, s in sorted(self.seconds.items(), key=lambda kv: kv[1])
                          if math.isfinite(s))  # fmt: skip
        dropped = "".join(f"; {c} left out: {why}" for c, why in self.dropped.items())
        return f"probe (images/s of the training step): {timed}{dropped}"


def precision_candidates(machine: Machine, device_type: str) -> list[PrecisionName]:
    """The precisions worth timing on `machine`'s `device_type`: on a CPU, fp32 and bf16 where it computes bf16
    natively (AVX512-BF16 or AMX; elsewhere oneDNN emulates bf16, slower than fp32 on every net measured: an
    AVX2-only EPYC ran the default net's step at 10 images/s in bf16, 125 in fp32), else fp32 alone; on a GPU, fp32
    and bf16, or fp16 where it has no bf16 (fp16 has no fast CPU kernels and needs loss scaling)."""
    if device_type == "cpu":
        return ["fp32", "bf16"] if machine.cpu_bf16 else ["fp32"]
    accelerator = machine.accelerator
    if accelerator is None or accelerator.kind != device_type:
        return ["fp32"]
    return ["fp32", "bf16"] if accelerator.bf16 else ["fp32", "fp16"] if accelerator.fp16 else ["fp32"]


def slow_precision(precision: str, machine: Machine, device_type: str) -> str | None:
    """Why `precision`, given rather than left `auto`, trains slower than fp32 on `machine`'s `device_type`, or None:
    a 16-bit mode the device has no fast arithmetic for. On a CPU without bf16 instructions oneDNN emulates bf16
    (seed-cnn-32, whose recipe gives bf16, on a 2-core AVX2-only EPYC: 348 images/s in bf16, 1,234 in fp32), and a
    CPU has no fast fp16 kernels at all; a GPU without bf16 (or fp16) arithmetic emulates that mode likewise."""
    half = "bf16" if precision == "bf16" else "fp16" if precision in ("fp16", "fp16-master") else None
    if half is None:
        return None
    if device_type == "cpu":
        if half == "bf16" and machine.cpu_bf16:
            return None
        has = f"no {half} instructions ({machine.kernels} kernels)" if half == "bf16" else "no fast fp16 kernels"
        return f"the CPU has {has}, so {half} is emulated, slower than fp32"
    accelerator = machine.accelerator
    if accelerator is None or accelerator.kind != device_type or getattr(accelerator, half):
        return None  # (a device the facts do not describe: nothing known to say)
    return f"the {device_type} device has no fast {half} arithmetic, so {half} is slower than fp32"


def given_precision_notes(precision: str, machine: Machine, device_type: str) -> list[str]:
    """The line a run says at start when its `precision`, given, is slow on `machine` (`slow_precision`); else none."""
    slow = slow_precision(precision, machine, device_type)
    return [f"precision={precision} as given: {slow}; precision=auto trains in what is fast here"] if slow else []


def why_one_precision(machine: Machine, device_type: str) -> str:
    """Why `precision_candidates` offers fp32 alone here (for the opening line that says so)."""
    if device_type == "cpu":  # the same fact a bf16 given is told (slow_precision)
        return f"{slow_precision('bf16', machine, device_type)}: nothing to time"
    return f"the {device_type} device has no fast 16-bit arithmetic: nothing to time"


def candidates(precision: str, channels_last: bool | str, device_type: str, machine: Machine) -> list[Candidate]:
    """Every combination the recipe leaves open (`auto`) on `machine`'s `device_type`, the fixed values as given."""
    precisions = precision_candidates(machine, device_type) if precision == "auto" else [precision]
    layouts = [False, True] if channels_last == "auto" else [bool(channels_last)]
    return [Candidate(p, c) for p in precisions for c in layouts]
