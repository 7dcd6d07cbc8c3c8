"""Whether the machine is busy: the CPU time other processes (and a hypervisor's other guests) spent while
something was timed or is about to be, read from /proc/stat and this process's own clock.

It imports nothing heavy: the `hasten` command reads it before torch is loaded (hasten/threads.py), and the
start-up probe through hasten.machine, which re-exports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Activity:
    """The CPU time spent on the machine over `wall_seconds`: this process's (`own_seconds`), and everyone else's
    (`others_seconds`: other processes, and time a hypervisor gave other machines, its steal), on `cpus` CPUs."""

    wall_seconds: float
    own_seconds: float
    others_seconds: float
    cpus: int

    @property
    def others_cpus(self) -> float:
        """Others' CPU time over the interval: how many CPUs' worth of work they did meanwhile."""
        return max(0.0, self.others_seconds) / max(1e-9, self.wall_seconds)

    @property
    def others_share(self) -> float:
        """Others' CPU time as a share of all the machine's CPU time in the interval (0: idle but for us)."""
        return max(0.0, self.others_seconds) / max(1e-9, self.wall_seconds * self.cpus)

    def describe(self) -> str:
        return f"other work took {self.others_cpus:.1f} of {self.cpus} CPUs"

    def __add__(self, other: Activity) -> Activity:
        """The activity over both intervals."""
        return Activity(self.wall_seconds + other.wall_seconds, self.own_seconds + other.own_seconds,
                        self.others_seconds + other.others_seconds, max(self.cpus, other.cpus))  # fmt: skip


def read_proc_stat(text: str) -> tuple[float, int] | None:
    """From /proc/stat's text: the CPU-seconds every CPU spent busy (user, nice, system, irq, softirq, steal) since
    boot, and the number of CPUs; None when the text has no such line."""
    lines = text.splitlines()
    total = next((line.split() for line in lines if line.startswith("cpu ")), None)
    if total is None or len(total) < 9:
        return None
    try:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in total[1:9])
    except ValueError:
        return None
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (user + nice + system + irq + softirq + steal) / ticks, max(1, cpus)


def _proc_stat() -> str | None:
    try:
        return Path("/proc/stat").read_text()
    except OSError:
        return None


def with_children_cpu_seconds() -> float:
    """This process's CPU seconds (all its threads) and those of its children that have ended and been waited for:
    a benchmark's own clock when what it times runs as child processes."""
    import resource
    import time

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class ActivityMeter:
    """Measures `Activity` between `start()` and `stop()`, from /proc/stat and this process's CPU clock (all its
    threads; `own_clock=with_children_cpu_seconds` counts child processes waited for before `stop()` as its own).
    `stop()` is None where the machine's CPU time cannot be read (not Linux): nothing is then known. `read_stat`,
    `own_clock` and `wall_clock` are where the readings come from (/proc/stat, time.process_time and
    time.perf_counter unless given)."""

    def __init__(self, read_stat=_proc_stat, own_clock=None, wall_clock=None):
        import time

        self.read_stat = read_stat
        self.own_clock = own_clock or time.process_time
        self.wall_clock = wall_clock or time.perf_counter
        self._start: tuple[float, float, tuple[float, int] | None] | None = None

    def _sample(self) -> tuple[float, float, tuple[float, int] | None]:
        text = self.read_stat()
        return self.wall_clock(), self.own_clock(), read_proc_stat(text) if text else None

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> Activity | None:
        if self._start is None:
            return None
        (wall0, own0, stat0), (wall1, own1, stat1) = self._start, self._sample()
        if stat0 is None or stat1 is None:
            return None
        own = own1 - own0
        return Activity(wall1 - wall0, own, (stat1[0] - stat0[0]) - own, stat1[1])
