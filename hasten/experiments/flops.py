"""Arithmetic accounting for benchmarks: the FLOPs of one training step, and a matmul peak to hold them to.

The FLOPs of a step are counted by `torch.utils.flop_counter.FlopCounterMode` over one forward and backward
pass (matmuls and convolutions, the work that dominates a CNN; elementwise ops and BN are not counted). The
peak is what a plain `torch.matmul` of two large square matrices reaches on the same machine, in the same
process, for the same dtype: the ceiling a training step could approach, measured rather than taken from a
datasheet. Achieved FLOP/s over the peak says how much of a run is arithmetic and how much is everything
around it (Python, data movement, evaluation, logging).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hasten.models.copying import copy_model


def train_step_flops(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch: int = 4) -> float:
    """FLOPs of one forward and backward pass per image, for images of `input_shape` (C, H, W).

    Counted on a copy of `model` (its weights, gradients and BN statistics stay untouched) with a random batch
    of `batch` images; conv and matmul FLOPs grow linearly with the batch, so the count is divided by it.
    """
    probe = copy_model(model).float().train()
    device = next(probe.parameters()).device
    images = torch.randn(batch, *input_shape, device=device)
    labels = torch.arange(batch, device=device) % num_classes
    with FlopCounterMode(display=False) as counter:
        loss = nn.functional.cross_entropy(probe(images), labels)
        loss.backward()
    return counter.get_total_flops() / batch


def _timer(device: torch.device) -> Callable[[], float]:
    """A stopwatch for work queued on `device` (CUDA events on a GPU, perf_counter on a CPU): seconds so far."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop() -> float:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000  # ms -> s

        return stop
    started = time.perf_counter()
    return lambda: time.perf_counter() - started


def matmul_peak(
    dtype: torch.dtype, device: torch.device, size: int | None = None, min_seconds: float = 1.0
) -> tuple[float, int]:
    """FLOP/s of `size` x `size` matrix products in `dtype` on `device`, the best of four timed rounds, and
    the size used.

    `size` defaults to 2048 on a CPU and 8192 on a GPU (large enough to be compute-bound, small enough to
    take well under a second a product); it is halved while a product would take over `min_seconds`, as
    timed on a 512 x 512 probe. Each round runs products for at least `min_seconds` / 4; the best round is
    reported, since interference from other processes only ever slows a round down. On a GPU, fp32 is
    measured as TF32 when cuDNN runs fp32 convolutions as TF32 (torch's default).
    """
    tf32 = torch.backends.cuda.matmul
    if device.type == "cuda" and dtype == torch.float32 and torch.backends.cudnn.allow_tf32 and not tf32.allow_tf32:
        # fp32 convolutions run as TF32 on the GPU by default (cudnn.allow_tf32): hold them to the TF32 peak
        tf32.allow_tf32 = True
        try:
            return matmul_peak(dtype, device, size, min_seconds)
        finally:
            tf32.allow_tf32 = False
    size = size or (8192 if device.type == "cuda" else 2048)
    probe = min(size, 512)
    a, b = (torch.randn(probe, probe, device=device).to(dtype) for _ in range(2))
    torch.matmul(a, b)  # warm-up: thread pools, kernel selection, clocks
    stop = _timer(device)
    torch.matmul(a, b)
    probe_seconds = stop()
    # a dtype without fast kernels (fp16 on most CPUs) gets a smaller product, so the measurement stays short
    while size > probe and probe_seconds * (size / probe) ** 3 > min_seconds:
        size //= 2
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    torch.matmul(a, b)
    flops_per_product = 2 * size**3  # a multiply and an add per term
    per_check = 16 if device.type == "cuda" else 1  # products between clock reads (a read syncs a GPU)
    best = 0.0
    for _ in range(4):
        stop, products = _timer(device), 0
        while True:
            for _ in range(per_check):
                torch.matmul(a, b)
            products += per_check
            seconds = stop()
            if seconds >= min_seconds / 4:
                break
        best = max(best, products * flops_per_product / seconds)
    return best, size
