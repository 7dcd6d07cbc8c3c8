"""Whether the start-up probe's timings are facts, and how long timing may take.

A timing is a fact only when it repeats on a machine not busy with other work (`Steadiness`). While the probe
times, an ActivityMeter (hasten/machine.py) reads the CPU time other processes and a hypervisor's other guests
took; if that was more than BUSY_SHARE of the machine, or a candidate's two fastest steps are more than REPEAT
apart, the contenders are timed RETIME_ROUNDS rounds more (`steadied`), and if they still do not repeat the choice
serves this run alone: it is said, with why, and not cached (hasten/tune/probe_cache.py).

Timing is not spent out of proportion to the run it serves: the rounds are interleaved over the candidates
(`interleaved`), so drift of a shared machine hits every one alike, and after two timed rounds they stop at
MAX_PROBE_SECONDS, or at PROBE_SHARE of the run's predicted training time if that is less (`time_limit`). The
probe of settings and the timing of batch sizes (hasten/tune/autotune.py) both time this way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hasten.machine import Activity, ActivityMeter

MAX_PROBE_SECONDS = 8.0  # after two rounds, stop early once the probe has taken this long
# ... or this share of the run it serves (its images times the fastest seconds per image timed so far), if less:
# a 4-epoch run of 500 115-pixel photos (~25 s of training on 2 cores) spent 9 s of its start-up in the probe
PROBE_SHARE = 0.05
# a candidate's two fastest timed steps further apart than this (relative) do not repeat: such timings, or those
# taken while other work used more than BUSY_SHARE of the machine's CPU time, are timed again, RETIME_ROUNDS rounds
# more, and if they still do not repeat, used for the run at hand but never cached
REPEAT = 0.10
BUSY_SHARE = 0.25
RETIME_ROUNDS = 4


def time_limit(run_images: int | None, seconds_per_image: float) -> float:
    """How long a probe may go on after its second timed round: MAX_PROBE_SECONDS, or PROBE_SHARE of the run it
    serves (`run_images` images at the fastest `seconds_per_image` timed) if that is less; None: the run's length
    is not known."""
    if run_images is None:
        return MAX_PROBE_SECONDS
    return min(MAX_PROBE_SECONDS, PROBE_SHARE * run_images * seconds_per_image)


@dataclass(frozen=True)
class Steadiness:
    """Whether a probe's timings are facts: `spread`, the largest gap between a contender's two fastest timed steps
    (relative to the faster; one timing alone: inf); `activity`, the CPU time other work took while they were timed
    (None: not measurable here); `retimed`, whether a first unsteady measurement was timed again."""

    spread: float
    activity: Activity | None = None
    retimed: bool = False
    busy: bool = False  # other work took more than BUSY_SHARE of the machine's CPU time (on some rank)

    @classmethod
    def of(cls, spread: float, activity: Activity | None, retimed: bool = False) -> Steadiness:
        return cls(spread, activity, retimed, activity is not None and activity.others_share > BUSY_SHARE)

    @property
    def repeats(self) -> bool:
        """The timings repeat within REPEAT on a machine not busy with other work: worth caching."""
        return self.spread <= REPEAT and not self.busy

    def problem(self) -> str:
        """Why the timings are not kept (empty when they repeat)."""
        if self.repeats:
            return ""
        why = []
        if self.busy:
            seen = f": {self.activity.describe()} while timing" if self.activity is not None else " (on another rank)"
            why.append(f"the machine is busy{seen}")
        if self.spread > REPEAT:
            shown = "did not repeat" if math.isinf(self.spread) else f"differed by up to {self.spread:.0%}"
            why.append(f"a candidate's timings {shown} (tolerance {REPEAT:.0%})")
        again = ", even timed again" if self.retimed else ""
        return "; ".join(why) + again


def spread(timings: Sequence[float]) -> float:
    """The gap between the two fastest of `timings`, relative to the fastest (inf with fewer than two)."""
    finite = sorted(t for t in timings if math.isfinite(t))
    if len(finite) < 2 or finite[0] <= 0:
        return math.inf
    return (finite[1] - finite[0]) / finite[0]


def interleaved(
    run_one: Callable[[Any], float],
    keys: Sequence[Any],
    rounds: int,
    limit: Callable[[float], float],
    timings: dict[Any, list[float]],
    narrow: Callable[[list[Any]], list[Any]] | None = None,
) -> list[Any]:
    """Up to `rounds` rounds over `keys`, each timed by `run_one(key)` and appended to `timings[key]`; after the
    first round `narrow` may leave some keys out; after the second, it stops once `limit(fastest seconds)` seconds
    have passed. Returns the keys timed last."""
    started, keys = time.perf_counter(), list(keys)
    for round_ in range(rounds):
        for key in keys:
            timings[key].append(run_one(key))
        if not keys:
            break
        fastest = min(min(timings[key]) for key in keys)
        if round_ >= 1 and time.perf_counter() - started > limit(fastest):
            break
        if round_ == 0 and narrow is not None:
            keys = narrow(keys)
    return keys


def steadied(
    run_one: Callable[[Any], float],
    keys: Sequence[Any],
    timings: dict[Any, list[float]],
    limit: Callable[[float], float],
    meter: ActivityMeter,
    activity: Activity | None,
) -> Steadiness:
    """The steadiness of `timings` over `keys` (measured while `activity`); when they do not repeat, or other work
    was busy on the machine, `keys` are timed again for up to RETIME_ROUNDS more rounds (within `limit`), added to
    their timings, and the steadiness of all of them returned, busy if the machine was busy while timing again."""
    first = Steadiness.of(max((spread(timings[k]) for k in keys), default=0.0), activity)
    if first.repeats or not keys:
        return first
    meter.start()
    interleaved(run_one, keys, RETIME_ROUNDS, limit, timings)
    again = meter.stop()
    # the busy verdict over both timings together: a short re-timing alone is a few clock ticks of /proc/stat
    both = again if activity is None or again is None else activity + again
    return Steadiness.of(max(spread(timings[k]) for k in keys), both, retimed=True)


def bound_text() -> str:
    """How long timing may take, for the line said before it starts."""
    return f"at most about {MAX_PROBE_SECONDS:g} s after two rounds, twice that if they must be timed again"
