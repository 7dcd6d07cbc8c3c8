"""Peak-memory measurement.

CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`), reset at the start of a run.
CPU: the process's resident-set high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`), which includes the
dataset, the model and the Python interpreter, not only activations: a number to compare runs by, measured
the same way for each.
"""

from __future__ import annotations

import resource
import sys

import torch


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB, macOS bytes
