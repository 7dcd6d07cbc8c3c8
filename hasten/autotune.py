"""Settings that depend on the machine, chosen on the machine: `precision: auto` and `train.channels_last: auto`.

Which is fastest differs from machine to machine, and not in a way a table could hold: on an AMD Zen 4 with
AVX512-BF16 the default net's step runs at ~45% of the bf16 matmul peak and channels_last helps; on an Intel Xeon
with AMX the same net is ~1.4x faster in bf16 than in fp32 and channels_last is ~10% slower; on a GPU bf16 and
channels_last both win for convolutions. So before training, a probe times the run's own training step
(hasten.step.TrainStep: the user's model, a real batch, the run's loss) on a copy of the model, for each candidate
setting, interleaved over a few rounds so drift of a shared machine hits every candidate alike, and keeps the
fastest per-step time (the minimum over rounds: noise only ever adds time). Candidates within TIE (5%) of the
fastest count as tied and the first in a fixed order wins (fp32 before bf16, contiguous before channels_last), so
two runs on one machine choose alike unless a candidate really is faster: what is not worth 5% is not worth the
16-bit rounding or a second layout.

Numerically safe: fp16 (no fast CPU kernels, and it needs loss scaling) is a candidate only on a GPU without
bf16; a 16-bit candidate whose loss on the probe batch is not finite, or differs from fp32's by more than
LOSS_TOLERANCE, is dropped. Under several processes the ranks add up their timings, so all choose alike.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hasten.distributed import all_reduce_sum
from hasten.precision import make_precision
from hasten.step import TrainStep

ROUNDS = 4  # timed steps per candidate, interleaved: the minimum over them is kept
MAX_PROBE_SECONDS = 8.0  # after two rounds, stop early once the probe has taken this long
TIE = 0.05  # candidates within this fraction of the fastest count as tied: the first of them in `candidates` order wins
LOSS_TOLERANCE = 0.05  # largest |16-bit loss - fp32 loss| on the probe batch, relative to the fp32 loss (and 0.05)


@dataclass(frozen=True)
class Candidate:
    precision: str
    channels_last: bool

    def __str__(self) -> str:
        return f"{self.precision}{' channels_last' if self.channels_last else ''}"


@dataclass
class Probe:
    """What the probe measured: the seconds of one step per candidate (inf: dropped) and the choice."""

    seconds: dict[Candidate, float]
    choice: Candidate
    dropped: dict[Candidate, str]

    def describe(self, batch: int) -> str:
        timed = ", ".join(f"{c} {batch / s:,.0f}" for c, s in sorted(self.seconds.items(), key=lambda kv: kv[1])
                          if math.isfinite(s))  # fmt: skip
        dropped = "".join(f"; {c} left out: {why}" for c, why in self.dropped.items())
        return f"probe (images/s of the training step): {timed}{dropped}"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX): elsewhere oneDNN emulates it, slower than
    fp32 on every net measured (an AVX2-only EPYC: bf16 at 10 images/s of the default net's step, fp32 at 125)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def precision_candidates(device: torch.device) -> list[str]:
    """The precisions worth timing on `device`: fp32 and bf16 where it runs natively (a CPU without bf16
    instructions: fp32 alone, nothing to time); on a GPU without bf16, fp16."""
    if device.type == "cuda":
        return ["fp32", "bf16"] if torch.cuda.is_bf16_supported() else ["fp32", "fp16"]
    return ["fp32", "bf16"] if cpu_has_bf16() else ["fp32"]


def candidates(precision: str, channels_last: bool | str, device: torch.device) -> list[Candidate]:
    """Every combination the recipe leaves open (`auto`), the fixed values as given."""
    precisions = precision_candidates(device) if precision == "auto" else [precision]
    layouts = [False, True] if channels_last == "auto" else [bool(channels_last)]
    return [Candidate(p, c) for p in precisions for c in layouts]


def _timed_step(step: TrainStep, batch: tuple[Tensor, Tensor], device: torch.device) -> tuple[float, float]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    result = step([batch])
    sync()
    return time.perf_counter() - started, result.loss


def _step_on_copy(model: nn.Module, option: Candidate, device: torch.device, num_classes: int, loss_fn=None
                  ) -> TrainStep:  # fmt: skip
    """The run's training step on a copy of `model` in `option`'s precision and layout, at LR 0 (nothing moves)."""
    copy_ = copy.deepcopy(model).to(device)
    if option.channels_last:
        copy_ = copy_.to(memory_format=torch.channels_last)
    precision = make_precision(option.precision, device)
    copy_ = precision.prepare(copy_).train()
    trainable = [{"params": [p for p in copy_.parameters() if p.requires_grad]}]
    optimizer = torch.optim.SGD(precision.optimizer_groups(trainable), lr=0.0, momentum=0.9)  # fp16-master: masters
    kwargs = {"loss": loss_fn} if loss_fn is not None else {}
    return TrainStep(copy_, optimizer, precision, num_classes, **kwargs)


def probe(
    model: nn.Module, batch: tuple[Tensor, Tensor], num_classes: int, options: Sequence[Candidate], loss_fn=None
) -> Probe:
    """Time one training step of a copy of `model` on `batch` for each of `options`; the fastest safe one wins.
    `model` itself is never touched (its weights, buffers and memory format stay as they were)."""
    images, labels = batch
    device = images.device
    losses, dropped = {}, {}
    steps = {option: _step_on_copy(model, option, device, num_classes, loss_fn) for option in options}
    layout = {False: images.contiguous(), True: images.contiguous(memory_format=torch.channels_last)}
    best = {option: math.inf for option in options}
    started = time.perf_counter()
    for round_ in range(ROUNDS + 1):  # round 0 warms each candidate up (kernel selection, allocations)
        for option in options:
            if option in dropped:
                continue
            seconds, loss = _timed_step(steps[option], (layout[option.channels_last], labels), device)
            if round_ == 0:
                losses[option] = loss
            else:
                best[option] = min(best[option], seconds)
        if round_ >= 2 and time.perf_counter() - started > MAX_PROBE_SECONDS:
            break
        if round_ == 0:
            dropped = _unsafe(losses)
    totals = all_reduce_sum([best[o] if o not in dropped else 0.0 for o in options], device)
    seconds = {o: (t if o not in dropped else math.inf) for o, t in zip(options, totals, strict=True)}
    fastest = min(seconds.values())
    choice = next(o for o in options if seconds[o] <= fastest * (1 + TIE))  # near-ties: the same choice every run
    return Probe(seconds, choice, dropped)


def _unsafe(losses: dict[Candidate, float]) -> dict[Candidate, str]:
    """16-bit candidates whose first loss is not finite or strays from fp32's (same layout, else any fp32)."""
    reference = [loss for c, loss in losses.items() if c.precision == "fp32" and math.isfinite(loss)]
    dropped = {}
    for option, loss in losses.items():
        if option.precision == "fp32":
            if not math.isfinite(loss):
                dropped[option] = f"loss {loss} on the probe batch"
            continue
        if not math.isfinite(loss):
            dropped[option] = f"loss {loss} on the probe batch"
        elif reference and abs(loss - reference[0]) > LOSS_TOLERANCE * max(abs(reference[0]), 1.0):
            dropped[option] = f"loss {loss:.4f} vs fp32's {reference[0]:.4f} on the probe batch"
    if len(dropped) == len(losses):  # nothing trains: leave the choice to the run, which will say why
        return {}
    return dropped


def time_batches(
    model: nn.Module, batch: tuple[Tensor, Tensor], num_classes: int, option: Candidate, sizes: Sequence[int]
) -> dict[int, float]:
    """Seconds of one training step of a copy of `model` in `option` at each batch size of `sizes` (the first
    images of `batch`, which holds at least the largest), interleaved over rounds, the minimum kept; under several
    processes the ranks' times are summed, so every rank sees the same. `model` is never touched."""
    images, labels = batch
    device = images.device
    if option.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    step = _step_on_copy(model, option, device, num_classes)
    best = {size: math.inf for size in sizes}
    started = time.perf_counter()
    for round_ in range(ROUNDS + 1):  # round 0 warms each size up (kernel selection, allocations)
        for size in sizes:
            seconds, _ = _timed_step(step, (images[:size], labels[:size]), device)
            if round_:
                best[size] = min(best[size], seconds)
        if round_ >= 2 and time.perf_counter() - started > MAX_PROBE_SECONDS:
            break
    totals = all_reduce_sum([best[size] for size in sizes], device)
    return dict(zip(sizes, totals, strict=True))


def announce(result: Probe, batch: int, asked: Sequence[str]) -> None:
    print(f"{', '.join(asked)}=auto -> {result.choice}; {result.describe(batch)}", file=sys.stderr)
