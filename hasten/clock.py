"""The clock a user waits on: seconds since the command started, and where the start-up went.

Time to accuracy is quoted on this clock (MLPerf's rule: the clock never stops), training seconds beside it. For
the `hasten` command the clock starts when its process did (read from the operating system, so the interpreter's
start and every import count); a worker started by `hasten train --devices N` starts from the command the user
typed (`HASTEN_COMMAND_STARTED`, set by the launcher); a call of `hasten.train()` from Python starts it at the call.

Readings are `time.perf_counter()` values, so a change of the system clock during a run does not move them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

COMMAND_STARTED_ENV = "HASTEN_COMMAND_STARTED"  # the launcher's process start, seconds since the epoch
MAX_INHERITED_AGE = 24 * 3600.0  # an inherited start older than this (or in the future) is not believed


def _process_age(stat: str = "/proc/self/stat") -> float | None:
    """Seconds since this process started, from /proc (Linux; 10 ms resolution); None where unknown."""
    try:
        with open(stat, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        started_ticks = int(fields[19])  # field 22 of proc(5): start time in clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0 <= age < MAX_INHERITED_AGE else None


def _inherited_age() -> float | None:
    """Seconds since the launching command started, when a launcher passed its start on; None otherwise."""
    value = os.environ.get(COMMAND_STARTED_ENV)
    try:
        age = time.time() - float(value) if value else None
    except ValueError:
        return None
    return age if age is not None and 0 <= age < MAX_INHERITED_AGE else None


def command_started() -> float:
    """The perf_counter reading at the start of the command this process serves: the launcher's when one passed
    it on, else this process's own start (the time of this call where the system does not say)."""
    age = _inherited_age()
    if age is None:
        age = _process_age() or 0.0
    return time.perf_counter() - age


def started_epoch(started: float) -> float:
    """A perf_counter reading as seconds since the epoch, for a launcher to pass on in `COMMAND_STARTED_ENV`."""
    return time.time() - (time.perf_counter() - started)


@dataclass
class Clock:
    """Seconds on the wall since `started` (a perf_counter reading), and named marks of the start-up: each mark
    holds the seconds since the one before, so they add up to the start-up."""

    started: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)
    _last: float | None = None

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def mark(self, name: str) -> None:
        """The seconds since the previous mark (or the start) are `name`'s; a second mark of a name adds to it."""
        now = time.perf_counter()
        since = self.started if self._last is None else self._last
        self.marks[name] = round(self.marks.get(name, 0.0) + now - since, 3)
        self._last = now
