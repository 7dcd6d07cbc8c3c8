"""How torch's CPU threads wait for one another: decided by the `hasten` command before torch is loaded.

torch runs a CPU op's work on its intra-op threads (GNU OpenMP in the PyPI wheels), which meet at a barrier at the
end of every parallel region: hundreds of times in a training step of a small network. Where OMP_WAIT_POLICY is not
set, a thread that reaches the barrier first spins for GOMP_SPINCOUNT=300,000 iterations (about 3 ms) before it
sleeps. On an idle machine the others arrive within microseconds and the spin saves a wake-up: a small network's
steps ran 1.4-1.9x as long with the threads sleeping at once (OMP_WAIT_POLICY=PASSIVE), fashion-fast's 1.6x. While
another process holds a core, the thread being waited for is off the CPU and the spinner takes the core it needs:
there the passive wait was 1.75-2.84x faster beside one busy process (and 7-20x in single runs beside several), and
a short spin (GOMP_SPINCOUNT=10000) no better than the default (benchmarks/contention.py,
docs/results/contention.md, a 2-core AVX2 EPYC).

So the `hasten` command, for the commands that train, looks at the machine for BUSY_SAMPLE seconds before torch is
loaded (how much CPU time other processes took: hasten/activity.py) and sets OMP_WAIT_POLICY=PASSIVE where they
kept at least BUSY_CORES of a core busy, and leaves OpenMP's default otherwise; nothing where the environment says
how to wait itself (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set by the user). libgomp reads the setting
once, when torch loads it, so the choice holds for the whole run: a machine that becomes busy later keeps the
spin. Processes it starts (the workers of `--devices N`, data loader workers) inherit it. The run says the choice
at start and records it (`threads_wait` in summary.json).

`hasten.train()` from Python runs in a process that has usually loaded torch already: its threads wait as that
process's environment said when torch loaded, and the run records which.

This module imports nothing heavy: the command calls it before anything imports torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from hasten.activity import ActivityMeter

WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")  # a user's own say over how threads wait
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
BUSY_SAMPLE = 0.1  # seconds the command watches the machine for before torch loads
# other processes' CPUs' worth of work at which the threads sleep when they wait: half a core, between an idle machine
# (0.0-0.1 here) and one busy process (1.0), where the passive wait was measured to win
BUSY_CORES = 0.5


@dataclass(frozen=True)
class Decision:
    """What the command set (`settings`, added to the environment) and why (`others_cpus`: the other processes'
    CPUs' worth of work while it looked, of `cpus`; None where it did not look)."""

    settings: dict[str, str]
    others_cpus: float | None = None
    cpus: int | None = None

    def describe(self) -> str | None:
        """The start-up's line, or None when the command set nothing."""
        if not self.settings:
            return None
        seen = f": other processes kept {self.others_cpus:.1f} of {self.cpus} CPUs busy at start" if self.cpus else ""
        return (f"CPU threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE){seen}, where spinning threads would "
                "stall every step on the cores they hold")  # fmt: skip


DECIDED: Decision | None = None  # this process's decision (set_wait), for the run's start-up line


def wait_settings(environ: Mapping[str, str], others_cpus: float | None) -> dict[str, str]:
    """The variables to add to `environ` before torch loads: PASSIVE where other processes kept at least BUSY_CORES
    busy (`others_cpus`; None: not measured, nothing set), none ({}) otherwise or where `environ` already sets any
    of WAIT_KEYS (to anything but blank)."""
    if waiting(environ) or others_cpus is None or others_cpus < BUSY_CORES:
        return {}
    return dict(PASSIVE)


def others_busy(seconds: float = BUSY_SAMPLE, meter: ActivityMeter | None = None) -> tuple[float, int] | None:
    """Other processes' CPUs' worth of work over `seconds` (this process sleeps meanwhile), and the CPUs; None
    where the machine's CPU time cannot be read."""
    meter = meter or ActivityMeter()
    meter.start()
    time.sleep(seconds)
    activity = meter.stop()
    return None if activity is None else (activity.others_cpus, activity.cpus)


def set_wait(environ: MutableMapping[str, str] | None = None, look: bool = True) -> Decision:
    """Decide how this process's threads will wait and add it to `environ` (default: this process's, where torch
    will read it); `look`: watch the machine first (the commands that train), else set nothing."""
    global DECIDED
    environ = os.environ if environ is None else environ
    if waiting(environ) or not look:
        DECIDED = Decision({})
        return DECIDED
    seen = others_busy()
    others, cpus = seen if seen is not None else (None, None)
    DECIDED = Decision(wait_settings(environ, others), others, cpus)
    environ.update(DECIDED.settings)
    return DECIDED


def waiting(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """How this process's threads were told to wait, for the run's record: the WAIT_KEYS its environment sets
    ({}: none, OpenMP's own default: spin, then sleep)."""
    environ = os.environ if environ is None else environ
    return {key: environ[key] for key in WAIT_KEYS if environ.get(key, "").strip()}


def record() -> dict[str, object]:
    """The run's record of its threads' wait: the WAIT_KEYS its environment sets (`environment`; {}: OpenMP's
    default, spin then sleep) and, where this process's command looked, the other processes' CPUs' worth of work
    it saw (`others_cpus`, of `cpus`; None: it did not look)."""
    looked = DECIDED is not None and DECIDED.others_cpus is not None
    others = round(DECIDED.others_cpus, 2) if looked else None  # type: ignore[union-attr]
    return {"environment": waiting(), "others_cpus": others, "cpus": DECIDED.cpus if looked else None}  # type: ignore[union-attr]
