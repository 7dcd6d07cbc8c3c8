"""Settings that depend on the machine, chosen on the machine: `precision: auto` and `train.channels_last: auto`.

Which is fastest differs from machine to machine, and not in a way a table could hold: on an AMD Zen 4 with
AVX512-BF16 the default net's step runs at ~45% of the bf16 matmul peak and channels_last helps; on an Intel Xeon
with AMX the same net is ~1.4x faster in bf16 than in fp32 and channels_last is ~10% slower; on a GPU bf16 and
channels_last both win for convolutions. So before training, a probe times the run's own training step
(hasten.engine.step.TrainStep: the user's model, a real batch, the run's loss) on a copy of the model, for each
setting (hasten/tune/choices.py), interleaved over a few rounds so drift of a shared machine hits every candidate
alike, and keeps the fastest per-step time (the minimum over rounds: noise only ever adds time). Time is not spent
on hopeless candidates: where precisions are mixed, a first look at an eighth of the batch leaves out those
SCREENED_OUT (3x) slower than the fastest (a 16-bit mode where the CPU emulates it: 5-10x), and after the first
full round those OUTPACED (1.5x) slower are timed no more; neither could come within TIE of the fastest. Nor is it
spent out of proportion to the run (`time_limit`, hasten/tune/steadiness.py). Candidates within TIE (5%) of the
fastest count as tied and the first in a fixed order wins (fp32 before bf16, contiguous before channels_last), so
two runs on one machine choose alike unless a candidate really is faster: what is not worth 5% is not worth the
16-bit rounding or a second layout.

Timings that do not repeat, or were taken on a machine busy with other work, are timed again, and if they still
do not repeat the choice serves this run alone (`Steadiness`, hasten/tune/steadiness.py); gaps smaller than the
timings' spread count as ties too (up to MAX_TIE).

Numerically safe: a 16-bit candidate whose loss on the probe batch is not finite, or differs from fp32's by more
than LOSS_TOLERANCE, is dropped. So is a candidate whose step raises while another's does not: a user's model that
flattens with `x.view(...)` cannot run channels_last, and trains in the layout it was written for. Under several
processes the ranks add up their timings, so all choose alike.

A probe's result, and the batch rule's timings, are kept on disk per machine, model and batch and read back by the
next run (`cached_probe`, `cached_batch_times`; the cache itself: hasten/tune/probe_cache.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hasten.data.loader import in_layout
from hasten.engine.distributed import all_reduce_sum, broadcast_object, is_main, world_size
from hasten.engine.precision import make_precision
from hasten.engine.step import TrainStep
from hasten.errors import first_line
from hasten.machine import ActivityMeter, Machine
from hasten.models.copying import copy_model
from hasten.progress import say, step_shown
from hasten.tune import rules
from hasten.tune.choices import Candidate, Probe
from hasten.tune.probe_cache import (
    batch_cache_path,
    batch_key,
    cache_path,
    kept,
    key_digest,
    probe_key,
    read_batch_times,
    read_cached,
    write_batch_times,
    write_cached,
)
from hasten.tune.steadiness import Steadiness, bound_text, interleaved, steadied, time_limit

ROUNDS = 4  # timed steps per candidate, interleaved: the minimum over them is kept
# after the first timed round, a batch size whose predicted time to the result (rules.predicted_cost) is this many
# times the least is timed no more: it cannot come within rules.MAX_BATCH_TIE of it, and on a CPU the largest batch's
# steps are most of the timing (256 images: 80% of the rounds of 16, 64 and 256 for a GroupNorm CNN at 28 pixels)
BATCH_OUTPACED = 2.0
# after the first timed round, a candidate this many times slower than the fastest is timed no more: it cannot come
# within TIE of it
OUTPACED = 1.5
# before the full-batch rounds, a first look times each candidate's step on 1/SCREEN_SHARE of the batch; one this
# many times slower than the fastest there is left out (bf16 where the CPU has no bf16 instructions runs 5-10x
# slower than fp32, and each of its full-batch steps cost seconds of start-up for nothing)
SCREEN_SHARE = 8
SCREEN_MIN = 16  # images: the first look's least batch (a batch that small is timed in full rounds only)
SCREENED_OUT = 3.0
MAX_TIE = 0.5  # gaps within the timings' spread count as ties, up to this: beyond it the fastest still wins
TIE = 0.05  # candidates within this fraction of the fastest count as tied: the first of them in `candidates` order wins
LOSS_TOLERANCE = 0.05  # largest |16-bit loss - fp32 loss| on the probe batch, relative to the fp32 loss (and 0.05)


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
    copy_ = copy_model(model).to(device)
    if option.channels_last:
        copy_ = copy_.to(memory_format=torch.channels_last)
    precision = make_precision(option.precision, device)
    copy_ = precision.prepare(copy_).train()
    trainable = [{"params": [p for p in copy_.parameters() if p.requires_grad]}]
    optimizer = torch.optim.SGD(precision.optimizer_groups(trainable), lr=0.0, momentum=0.9)  # fp16-master: masters
    kwargs = {"loss": loss_fn} if loss_fn is not None else {}
    # local: each rank times as many steps as its own clock allows; the ranks meet once, to sum their timings
    return TrainStep(copy_, optimizer, precision, num_classes, local=True, **kwargs)


def probe(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    options: Sequence[Candidate],
    loss_fn=None,
    run_images: int | None = None,
    meter: ActivityMeter | None = None,
) -> Probe:
    """Time one training step of a copy of `model` on `batch` for each of `options`; the fastest safe one wins.
    `model` itself is never touched (its weights, buffers and memory format stay as they were). `run_images`: the
    images the run will train on, which bounds the probe's time (`time_limit`). `meter` tells whether other work
    was busy on the machine while timing (`Steadiness`); candidates closer than the timings' own spread count as
    tied, so noise does not pick between them."""
    images, labels = batch
    device = images.device
    meter = meter or ActivityMeter()
    losses: dict[Candidate, float] = {}
    steps = {option: _step_on_copy(model, option, device, num_classes, loss_fn) for option in options}
    layout = {False: in_layout(images, False), True: in_layout(images, True)}
    few = max(SCREEN_MIN, len(labels) // SCREEN_SHARE)  # a look at a small batch: below some images it says little
    screen = {c: (x[:few], labels[:few]) for c, x in layout.items()}
    # the first look is for a 16-bit candidate that may be hopeless; layouts of one precision are not 3x apart
    mixed = len({option.precision for option in options}) > 1
    dropped = _screen(steps, screen, device) if few < len(labels) and mixed else {}
    failed: dict[Candidate, Exception] = {}
    for option in options:  # round 0 warms each candidate up (kernel selection, allocations) and checks its loss
        if option not in dropped:
            try:
                losses[option] = _timed_step(steps[option], (layout[option.channels_last], labels), device)[1]
            except Exception as error:  # noqa: BLE001 - this precision or layout is one the model cannot run in
                failed[option] = error
    if failed and not losses:
        raise next(iter(failed.values()))  # no candidate runs: the model's own error, as training would meet it
    dropped = dropped | {
        option: f"its step raised {first_line(error, 160).rstrip('.')}" for option, error in failed.items()
    }
    dropped = dropped | _unsafe(losses)
    timings: dict[Candidate, list[float]] = {option: [] for option in options}

    def run_one(option: Candidate) -> float:
        return _timed_step(steps[option], (layout[option.channels_last], labels), device)[0]

    def limit(fastest: float) -> float:
        return time_limit(run_images, fastest / len(labels))

    def not_outpaced(keys: list[Candidate]) -> list[Candidate]:  # they cannot come within TIE of the fastest
        fastest = min(timings[o][0] for o in keys)
        return [o for o in keys if timings[o][0] <= OUTPACED * fastest]

    meter.start()
    contenders = [option for option in options if option not in dropped]
    contenders = interleaved(run_one, contenders, ROUNDS, limit, timings, not_outpaced)
    steadiness = steadied(run_one, contenders, timings, limit, meter, meter.stop())
    best = {o: min(timings[o], default=math.inf) for o in options}
    # summed over the ranks, with how many left each candidate out: one left out anywhere is left out everywhere;
    # the ranks' spreads and busy verdicts too, so all decide alike
    own = [best[o] if o not in dropped else 0.0 for o in options] + [o in dropped for o in options]
    sums = all_reduce_sum([*own, min(steadiness.spread, 1e9), steadiness.busy], device)
    totals, left_out = sums[: len(options)], sums[len(options) : 2 * len(options)]
    world = world_size()
    if world > 1:
        steadiness = Steadiness(sums[-2] / world, steadiness.activity, steadiness.retimed, bool(sums[-1]))
    seconds = {o: (t if not out else math.inf) for o, t, out in zip(options, totals, left_out, strict=True)}
    fastest = min(seconds.values())
    # near-ties, or gaps smaller than the timings' own noise: the first in order, the same choice every run
    tie = max(TIE, min(steadiness.spread, MAX_TIE))
    choice = next(o for o in options if seconds[o] <= fastest * (1 + tie))
    return Probe(seconds, choice, dropped, steadiness)


def _screen(
    steps: dict[Candidate, TrainStep], small: dict[bool, tuple[Tensor, Tensor]], device: torch.device
) -> dict[Candidate, str]:
    """The first look: each candidate's step twice on a small batch (the second timed); those SCREENED_OUT times
    slower than the fastest, with the reason. Nothing when there is one candidate or nothing to screen out."""
    if len(steps) < 2:
        return {}
    timed: dict[Candidate, float] = {}
    for _ in range(2):
        for option, step in steps.items():
            try:
                timed[option] = _timed_step(step, small[option.channels_last], device)[0]
            except Exception:  # noqa: BLE001 - not timed: the full round says why, when another candidate runs
                pass
    if not timed:
        return {}
    fastest = min(timed, key=timed.__getitem__)
    images = len(small[False][0])
    return {
        option: f"{seconds / timed[fastest]:.1f}x slower than {fastest} on a first look ({images} images)"
        for option, seconds in timed.items()
        if seconds > SCREENED_OUT * timed[fastest]
    }


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
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    option: Candidate,
    sizes: Sequence[int],
    run_images: int | None = None,
    meter: ActivityMeter | None = None,
) -> tuple[dict[int, float], Steadiness]:
    """Seconds of one training step of a copy of `model` in `option` at each batch size of `sizes` (the first
    images of `batch`, which holds at least the largest), interleaved over rounds, the minimum kept, and whether
    they repeat (`steadied`: timed again when not); a size whose first timed step predicts BATCH_OUTPACED times the
    least time to the result keeps that one timing. Under several processes the ranks' times are summed, so every
    rank sees the same. `model` is never touched. `run_images` bounds its time as `probe`'s."""
    images, labels = batch
    device = images.device
    images = in_layout(images, option.channels_last)
    step = _step_on_copy(model, option, device, num_classes)
    meter = meter or ActivityMeter()

    def run_one(size: int) -> float:
        return _timed_step(step, (images[:size], labels[:size]), device)[0]

    def limit(_: float) -> float:  # the fastest seconds per image of any size timed so far
        return time_limit(run_images, min(min(timings[size], default=math.inf) / size for size in sizes))

    def not_outpaced(keys: list[int]) -> list[int]:  # those whose predicted time can still come within a tie
        costs = {size: rules.predicted_cost(size, timings[size][0]) for size in keys}
        return [size for size in keys if costs[size] <= BATCH_OUTPACED * min(costs.values())]

    for size in sizes:  # round 0 warms each size up (kernel selection, allocations)
        run_one(size)
    timings: dict[int, list[float]] = {size: [] for size in sizes}
    meter.start()
    contenders = interleaved(run_one, sizes, ROUNDS, limit, timings, not_outpaced)
    steadiness = steadied(run_one, contenders, timings, limit, meter, meter.stop())
    sums = all_reduce_sum([min(timings[size]) for size in sizes] + [min(steadiness.spread, 1e9), steadiness.busy],
                          device)  # fmt: skip
    world = world_size()
    if world > 1:
        steadiness = Steadiness(sums[-2] / world, steadiness.activity, steadiness.retimed, bool(sums[-1]))
    return dict(zip(sizes, sums[: len(sizes)], strict=True)), steadiness


def announce(result: Probe, batch: int, asked: Sequence[str]) -> None:
    say(f"{', '.join(asked)}=auto -> {result.choice}; {result.describe(batch)}")


def cached_probe(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    options: Sequence[Candidate],
    asked: Sequence[str],
    machine: Machine,
    run_images: int | None = None,
    live: bool = False,
) -> Probe:
    """`probe`'s result for this machine, model and batch: from the cache when it holds a valid one for the key,
    else measured, said, and cached if its timings repeat (`Steadiness`; a result timed on a busy machine, or whose
    timings did not repeat, serves this run and is not kept). Said in the opening lines: that it is timing, and for
    how long at most, before (a live step where `live`); then the choice, the timings, the key and the cache file.
    Under several processes rank 0 reads the cache and tells the others; a miss is probed by all together."""
    images = batch[0]
    key = probe_key(model, images, options, machine)
    path, digest = cache_path(key), key_digest(key)
    found, problem = read_cached(path, key, options) if is_main() else (None, None)
    found = broadcast_object(found)
    what = f"{', '.join(asked)}=auto"
    if found is not None:
        if is_main():
            say(f"{what} -> {found.choice}, as probed on this machine before (probe cache key {digest}: {path}; "
                "delete it to probe again)")  # fmt: skip
        return found
    if problem and is_main():
        say(f"probe cache {path} ignored ({problem}); probing again")
    timing = f"{what}: timing the training step in {len(options)} settings ({bound_text()})"
    if is_main():
        say(timing)
    with step_shown(timing, live and is_main()):
        result = probe(model, batch, num_classes, options, run_images=run_images)
    if is_main():
        announce(result, len(images), asked)
        say(f"probe cache key {digest}: {kept(path, result.steadiness, lambda: write_cached(path, key, result))}")
    return result


@dataclass
class BatchTimes:
    """`time_batches`'s seconds per step at each batch size, and how steady they were (None: from the cache)."""

    seconds: dict[int, float]
    steadiness: Steadiness | None = None


def cached_batch_times(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    option: Candidate,
    sizes: Sequence[int],
    machine: Machine,
    run_images: int | None = None,
    live: bool = False,
) -> tuple[BatchTimes, str]:
    """`time_batches`'s seconds per step at each of `sizes`, from the cache when it holds them for this machine,
    model, image shape, option and sizes (a cached file is data, checked field by field like the probe's), else
    timed, and kept if they repeat (as `cached_probe`); with a line saying which. Under several processes rank 0
    reads and tells the others."""
    key = batch_key(model, batch[0], option, sizes, machine)
    path = batch_cache_path(key)
    found, problem = read_batch_times(path, key) if is_main() else (None, None)
    found = broadcast_object(found)
    if found is not None:
        return BatchTimes(found), f"timed on this machine before ({path}; delete it to time again)"
    if problem and is_main():
        say(f"batch timing cache {path} ignored ({problem}); timing again")
    timing = f"train.batch_size=auto: timing the training step at batches {', '.join(map(str, sizes))} ({bound_text()})"
    if is_main():
        say(timing)
    with step_shown(timing, live and is_main()):
        measured = BatchTimes(*time_batches(model, batch, num_classes, option, sizes, run_images))
    where = kept(path, measured.steadiness, lambda: write_batch_times(path, key, measured.seconds)) if is_main() else ""
    return measured, where
