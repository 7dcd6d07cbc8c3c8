"""SIGINT and SIGTERM as a request to stop a run at its next step boundary, after a checkpoint; a second SIGINT
aborts at once, even in the middle of a long step.

Python runs signal handlers only between bytecodes, so a step inside one long native call would keep a second
Ctrl-C waiting: a watcher thread reads the signals from a wakeup pipe (written by the C-level handler) and ends the
process with 130 itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator


def asked_to_stop(pending: int | None, signum: int) -> int:
    """The stop signal a run acts on once `signum` came, `pending` the one already asked for (None: none yet):
    `signum`; a second SIGINT while a stop waits raises KeyboardInterrupt (the watcher thread ends the process too)."""
    if pending is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt
    return signum


class StopRequest:
    """What SIGINT/SIGTERM asked of a run that is not the trainer's loop (`hasten gan`): `signum`, the stop signal
    (None until one came), which the run acts on at its next step boundary; `request` is the handler to give
    `handling_stop_signals`."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def request(self, signum: int, frame: object) -> None:
        self.signum = asked_to_stop(self.signum, signum)


def _abort_on_second_sigint(read_end: int, stderr_fd: int) -> None:
    """Watcher thread: read signal numbers from the wakeup pipe until it closes; on the second SIGINT, end the
    process at once with 130 (the last checkpoint stays; the step in progress is lost). The message goes to
    `stderr_fd`, a copy of the original stderr: sys.stderr's lock may be held by the interrupted main thread,
    and fd 2 may be pointed at /dev/null for the moment (hasten.engine.memory hides the profiler's native output)."""
    interrupts = 0
    try:
        while chunk := os.read(read_end, 64):
            interrupts += chunk.count(signal.SIGINT)
            if interrupts >= 2:
                os.write(stderr_fd, b"interrupted: second Ctrl-C, aborting without a checkpoint\n")
                os._exit(130)
    finally:
        os.close(read_end)
        os.close(stderr_fd)


@contextlib.contextmanager
def handling_stop_signals(request: Callable[[int, object], None]) -> Iterator[None]:
    """While the block runs, `request` handles SIGINT and SIGTERM (the loop's stop request) and the watcher ends
    the process at a second SIGINT; the previous handlers come back after. Outside the main thread, where Python
    cannot install handlers: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        stderr_fd = os.dup(2)
    except OSError:  # no stderr (a detached service): the abort is silent
        stderr_fd = os.open(os.devnull, os.O_WRONLY)
    watcher = threading.Thread(target=_abort_on_second_sigint, args=(read_end, stderr_fd), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        os.close(write_end)  # the watcher reads end-of-file and returns
        watcher.join(timeout=1)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
