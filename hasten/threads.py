"""How torch's CPU threads wait for one another: set by the `hasten` command before torch is loaded.

torch runs a CPU op's work on its intra-op threads (GNU OpenMP in the PyPI wheels), which meet at a barrier at the
end of every parallel region: hundreds of times in a training step of a small network. Where OMP_WAIT_POLICY is not
set, a thread that reaches the barrier first spins for GOMP_SPINCOUNT=300,000 iterations (about 3 ms) before it
sleeps. On an idle machine the others arrive within microseconds and the spin saves a wake-up; while another process
holds a core, the thread being waited for is off the CPU, and the spinner takes the core it needs. Measured on a
2-core AVX2 EPYC beside one busy process (benchmarks/contention.py, docs/results/contention.md): the default recipe's
step on 28 px images took about 1 s instead of 0.07 s with the threads sleeping at once. The `hasten` command
therefore sets OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps at once; libgomp, and Intel's OpenMP, read it when
torch loads them) unless the environment says how to wait itself: OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME
set by the user is left as it is. Processes it starts (the workers of `--devices N`, data loader workers) inherit it.

`hasten.train()` from Python runs in a process that has usually loaded torch already, so its threads wait as that
process's environment said when torch loaded; the run records which (`threads_wait` in summary.json).

This module imports nothing heavy: the command calls it before anything imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")  # a user's own say over how threads wait
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def wait_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the `hasten` command adds to `environ` before torch loads: PASSIVE, or none ({}) where
    `environ` already sets any of WAIT_KEYS (to anything but blank)."""
    if any(environ.get(key, "").strip() for key in WAIT_KEYS):
        return {}
    return dict(PASSIVE)


def set_wait(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Add `wait_settings` to `environ` (default: this process's, where torch will read them); what was added."""
    environ = os.environ if environ is None else environ
    added = wait_settings(environ)
    environ.update(added)
    return added


def waiting(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """How this process's threads were told to wait, for the run's record: the WAIT_KEYS its environment sets
    ({}: none, OpenMP's own default: spin, then sleep)."""
    environ = os.environ if environ is None else environ
    return {key: environ[key] for key in WAIT_KEYS if environ.get(key, "").strip()}
