"""Memory: how much a training step takes, the largest batch that fits, and the mechanism of activation
checkpointing.

Two figures, measured the same way for every run so runs can be compared:

- `peak_memory_bytes` (whole run). CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`), reset
  at the start of the run. CPU: the process's resident-set high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`),
  which also counts the dataset, the interpreter and torch's libraries, so it moves little with the batch.
- `peak_step_memory_bytes` (one training step): the peak of tensor bytes allocated during forward, backward and
  the optimizer step, above what was live when the step began (activations, gradients, temporaries). CUDA: the
  allocator's peak during the step minus what was allocated before it. CPU: torch.profiler with
  `profile_memory=True` records every allocation and free of torch's CPU allocator with its size and time; their
  running sum, in time order, is the live-byte curve, and its maximum is the peak. This is the figure that
  precision modes, channels_last, activation checkpointing and the batch size change.

The batch-size finder is a pure search (`search_batch_size`) over a `fits(batch_size) -> bool` callable, so a test
can fake out-of-memory deterministically; hasten/experiments/batch_size.py builds the real `fits`.

Activation checkpointing's mechanism (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016): a
segment keeps only its input for backward and recomputes its activations there, trading one extra forward for
memory (`checkpointed`, with batch-norm statistics updated once); which modules it wraps is the technique's,
hasten/techniques/activation_checkpointing.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import resource
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from hasten.engine.norms import is_batch_norm
from hasten.errors import HastenError
from hasten.machine import current as current_machine

# CUDA: the run's peak seen before `measure_peak` reset the allocator's counter, by device index
_cuda_peak_floor: dict[int, int] = {}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        _cuda_peak_floor.pop(torch.device(device).index or 0, None)


def peak_memory_bytes(device: torch.device) -> int:
    """The whole run's peak: CUDA allocator peak since `reset_peak`; CPU process RSS high-water mark."""
    if device.type == "cuda":
        return max(int(torch.cuda.max_memory_allocated(device)), _cuda_peak_floor.get(device.index or 0, 0))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB, macOS bytes


@dataclass
class StepPeak:
    """Filled in when the `measure_peak` block ends: the peak of bytes allocated above the start level."""

    bytes: int = 0


def _live_bytes_peak(allocations: Sequence[tuple[int, int]]) -> int:
    """Peak of the running sum of (time, +allocated / -freed bytes) events, taken in time order."""
    live = peak = 0
    for _, nbytes in sorted(allocations):
        live += nbytes
        peak = max(peak, live)
    return peak


def _profiler_allocations(prof: torch.profiler.profile) -> list[tuple[int, int]]:
    """(time in ns, signed bytes) of every CPU allocator event the profiler saw."""
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None:
        cpu = torch.autograd.DeviceType.CPU
        return [
            (e.start_ns(), e.nbytes()) for e in results.events() if e.name() == "[memory]" and e.device_type() == cpu
        ]
    # older profilers: per-op net allocations of the top-level ops, plus the frees between ops (coarser)
    return [(int(e.time_range.start * 1000), e.cpu_memory_usage) for e in prof.events() if e.cpu_parent is None]


@contextlib.contextmanager
def _native_stderr_hidden() -> Iterator[None]:
    """Silence file descriptor 2: the profiler's C++ side logs its start and stop, and warns about frees of
    blocks allocated before it started, straight to it. Python exceptions still surface after the block."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def measure_peak(device: torch.device) -> Iterator[StepPeak]:
    """Measure the peak of tensor bytes allocated inside the block, above those live when it began.

    CUDA: allocator statistics (cheap). CPU: the profiler's memory events (slows the block down; measure one
    step, not a run); frees of blocks allocated before the block began are not reported by the profiler, so the
    figure can exceed the true one by what the block frees of older tensors (e.g. the last step's gradients).
    The result is in the yielded object's `bytes` once the block has ended.
    """
    result = StepPeak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        index = device.index or 0
        _cuda_peak_floor[index] = max(_cuda_peak_floor.get(index, 0), int(torch.cuda.max_memory_allocated(device)))
        torch.cuda.reset_peak_memory_stats(device)  # the run's peak so far is kept in the floor above
        yield result
        torch.cuda.synchronize(device)
        result.bytes = int(torch.cuda.max_memory_allocated(device) - before)
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _native_stderr_hidden(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        yield result
    result.bytes = _live_bytes_peak(_profiler_allocations(prof))


def state_bytes(*modules_and_optimizers: nn.Module | torch.optim.Optimizer) -> int:
    """Bytes of the tensors a training run keeps between steps: parameters, buffers, optimizer state."""
    seen: set[int] = set()
    total = 0

    def add(t: Tensor) -> None:
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if t.device.type != "meta" and key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()

    for item in modules_and_optimizers:
        if isinstance(item, nn.Module):
            for t in [*item.parameters(), *item.buffers()]:
                add(t)
        else:
            for group in item.param_groups:
                for p in group["params"]:
                    add(p)
            for state in item.state.values():
                for value in state.values():
                    if isinstance(value, Tensor):
                        add(value)
    return total


UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20}
UNITS |= {"g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def available_memory_bytes() -> int:
    """Physical memory available now (Linux: MemAvailable), else all physical memory; no more than the machine's
    memory (hasten.machine.current(): a HASTEN_MACHINE profile of a smaller machine decides as that machine)."""
    described = current_machine().memory_bytes or math.inf
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(min(int(line.split()[1]) * 1024, described))  # reported in KiB
    except OSError:
        pass
    return int(min(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), described))


def parse_bytes(text: str) -> int:
    """'4GiB' -> 4294967296; accepts B, kB/KiB, MB/MiB, GB/GiB, TB/TiB (case-insensitive), e.g. '512MiB', '1.5GB'."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise HastenError(f"--memory-budget: {text!r} is not a size; write e.g. 4GiB, 512MiB or 2GB")
    value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if value < 1:
        raise HastenError(f"--memory-budget: {text!r} is not a positive size")
    return int(value)


def format_bytes(n: float | None) -> str:
    """A byte count for people: "512 B", "1.5 MiB"; "—" for a number not measured (None). The one formatter."""
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---- batch-size search -------------------------------------------------------------------------------------


class NothingFits(HastenError):
    """Not even a batch of one fits."""


@dataclass
class Search:
    """Result of `search_batch_size`: the largest size that fit, and every (size, fitted) tried, in order."""

    batch_size: int
    tried: list[tuple[int, bool]] = field(default_factory=list)
    capped: bool = False  # the search stopped at `limit`, not at a size that did not fit


def search_batch_size(
    fits: Callable[[int], bool], start: int = 1, limit: int | None = None, tolerance: float = 0.0, smallest: int = 1
) -> Search:
    """The largest batch size for which `fits` is true: doubling from `start`, then bisection.

    Doubling stops at the first size that does not fit (or at `limit`, tried last); bisection then narrows the
    gap between the largest fit and the smallest failure until it is at most max(1, tolerance x the fit), so
    `tolerance=0` is exact. Assumes that a size fits when a larger one does. Errors other than not fitting
    propagate out of `fits` unchanged. Raises NothingFits when even size `smallest` does not fit (2 for a step
    that cannot train on one image: batch norm over a 1 x 1 feature map).
    """
    tried: list[tuple[int, bool]] = []

    def attempt(size: int) -> bool:
        ok = bool(fits(size))
        tried.append((size, ok))
        return ok

    size = max(smallest, start if limit is None else min(start, limit))
    hi: int | None = None  # the smallest size known not to fit
    while not attempt(size):  # `start` too large: halve until something fits
        if size <= smallest:
            raise NothingFits(f"even a batch of {smallest} does not fit")
        hi, size = size, max(smallest, size // 2)
    lo = size  # the largest size known to fit
    if hi is None:  # double until something does not fit
        while True:
            if limit is not None and lo >= limit:
                return Search(lo, tried, capped=True)
            size = lo * 2 if limit is None else min(lo * 2, limit)
            if not attempt(size):
                hi = size
                break
            lo = size
    while hi - lo > max(1, int(lo * tolerance)):
        mid = (lo + hi) // 2
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return Search(lo, tried)


def agree_on_min(value: int) -> int:
    """The smallest `value` over all ranks when a torch.distributed process group is up, else `value`."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    backend = torch.distributed.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN)
    return int(tensor.item())


# ---- activation checkpointing ------------------------------------------------------------------------------


@contextlib.contextmanager
def running_stats_kept(modules: Sequence[nn.Module]) -> Iterator[None]:
    """BatchNorm running statistics inside `modules` are the same after the block as before it.

    Used while checkpointing recomputes a segment in backward: without it, each BN layer would fold the same
    batch into its running mean and variance twice (and count it twice in `num_batches_tracked`). The recompute
    must run the very same ops as the forward pass (checkpoint checks the saved tensors match), so BN runs as
    usual and its buffers are put back afterwards.
    """
    norms = [m for module in modules for m in module.modules() if is_batch_norm(m)]
    saved = [[b.clone() for b in norm.buffers()] for norm in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for norm, values in zip(norms, saved, strict=True):
                for buffer, value in zip(norm.buffers(), values, strict=True):
                    buffer.copy_(value)


def checkpointed(modules: Sequence[nn.Module], x: Tensor) -> Tensor:
    """`modules` applied in turn to `x`, keeping only `x` for backward, which recomputes the rest.

    torch.utils.checkpoint without re-entrant autograd (`use_reentrant=False`: works when `x` needs no grad,
    keeps autocast and the RNG state); BatchNorm statistics are updated once, in the forward pass.
    """

    def run(inputs: Tensor) -> Tensor:
        for module in modules:
            inputs = module(inputs)
        return inputs

    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), running_stats_kept(modules)

    return checkpoint(run, x, use_reentrant=False, context_fn=contexts)
