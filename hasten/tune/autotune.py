"""Settings that depend on the machine, chosen on the machine: `precision: auto` and `train.channels_last: auto`.

Which is fastest differs from machine to machine, and not in a way a table could hold: on an AMD Zen 4 with
AVX512-BF16 the default net's step runs at ~45% of the bf16 matmul peak and channels_last helps; on an Intel Xeon
with AMX the same net is ~1.4x faster in bf16 than in fp32 and channels_last is ~10% slower; on a GPU bf16 and
channels_last both win for convolutions. So before training, a probe times the run's own training step
(hasten.engine.step.TrainStep: the user's model, a real batch, the run's loss) on a copy of the model, for each
setting, interleaved over a few rounds so drift of a shared machine hits every candidate alike, and keeps the
fastest per-step time (the minimum over rounds: noise only ever adds time). Time is not spent on hopeless
candidates: where precisions are mixed, a first look at an eighth of the batch leaves out those SCREENED_OUT (3x)
slower than the fastest (a 16-bit mode where the CPU emulates it: 5-10x), and after the first full round those
OUTPACED (1.5x) slower are timed no more; neither could come within TIE of the fastest. Nor is it spent out of
proportion to the run: after two timed rounds the probe stops at MAX_PROBE_SECONDS, or at PROBE_SHARE of the run's
predicted training time if that is less (`time_limit`). Candidates within TIE (5%) of the
fastest count as tied and the first in a fixed order wins (fp32 before bf16, contiguous before channels_last), so
two runs on one machine choose alike unless a candidate really is faster: what is not worth 5% is not worth the
16-bit rounding or a second layout.

A timing is a fact only when it repeats on a machine not busy with other work (`Steadiness`). While it times, an
ActivityMeter (hasten/machine.py) reads the CPU time other processes and a hypervisor's other guests took; if
that was more than BUSY_SHARE of the machine, or a candidate's two fastest steps are more than REPEAT apart, the
contenders are timed RETIME_ROUNDS rounds more, and if they still do not repeat the choice serves this run alone:
it is said, with why, and not cached. Gaps smaller than the timings' spread count as ties too (up to MAX_TIE).

Which candidates there are is the machine's (`precision_candidates` of a hasten.machine.Machine): the probe never
asks the hardware which precisions it has, so HASTEN_MACHINE's profiles run every machine's candidates anywhere.

Numerically safe: fp16 (no fast CPU kernels, and it needs loss scaling) is a candidate only on a GPU without
bf16; a 16-bit candidate whose loss on the probe batch is not finite, or differs from fp32's by more than
LOSS_TOLERANCE, is dropped. Under several processes the ranks add up their timings, so all choose alike.

The probe takes seconds a user waits for, and its answer holds as long as what it measured does: so its result
is kept in the cache folder (`$HASTEN_CACHE/probe`, else `~/.cache/hasten/probe`), one JSON file per key, the key
being everything the timing depends on (`probe_key`: the machine's CPU model and instruction-set flags or its GPU
and capability, the Machine facts the candidates came from, torch's thread count, the model's class and a digest
of its parameter and buffer shapes, the batch and image shape, the candidates, the torch and hasten versions, the
process count); any change of those is another key, another file. A cached file is data: it is read as JSON of
at most MAX_CACHE_BYTES, checked field by field against the key and the candidates, and a file that fails any
check is ignored with a note and probed over. Delete the file (its path is printed) to probe again.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.data.loader import in_layout
from hasten.data.sources import cache_folder
from hasten.engine.distributed import all_reduce_sum, broadcast_object, is_main, world_size
from hasten.engine.precision import make_precision
from hasten.engine.step import TrainStep
from hasten.machine import Activity, ActivityMeter, Machine
from hasten.progress import say, step_shown
from hasten.recipe.schema import PrecisionName
from hasten.version import __version__

ROUNDS = 4  # timed steps per candidate, interleaved: the minimum over them is kept
MAX_PROBE_SECONDS = 8.0  # after two rounds, stop early once the probe has taken this long
# ... or this share of the run it serves (its images times the fastest seconds per image timed so far), if less:
# a 4-epoch run of 500 115-pixel photos (~25 s of training on 2 cores) spent 9 s of its start-up in the probe
PROBE_SHARE = 0.05
# after the first timed round, a candidate this many times slower than the fastest is timed no more: it cannot come
# within TIE of it
OUTPACED = 1.5
# before the full-batch rounds, a first look times each candidate's step on 1/SCREEN_SHARE of the batch; one this
# many times slower than the fastest there is left out (bf16 where the CPU has no bf16 instructions runs 5-10x
# slower than fp32, and each of its full-batch steps cost seconds of start-up for nothing)
SCREEN_SHARE = 8
SCREEN_MIN = 16  # images: the first look's least batch (a batch that small is timed in full rounds only)
SCREENED_OUT = 3.0
# a candidate's two fastest timed steps further apart than this (relative) do not repeat: such timings, or those
# taken while other work used more than BUSY_SHARE of the machine's CPU time, are timed again, RETIME_ROUNDS rounds
# more, and if they still do not repeat, used for the run at hand but never cached
REPEAT = 0.10
BUSY_SHARE = 0.25
RETIME_ROUNDS = 4
MAX_TIE = 0.5  # gaps within the timings' spread count as ties, up to this: beyond it the fastest still wins
TIE = 0.05  # candidates within this fraction of the fastest count as tied: the first of them in `candidates` order wins
LOSS_TOLERANCE = 0.05  # largest |16-bit loss - fp32 loss| on the probe batch, relative to the fp32 loss (and 0.05)
# the layout of a cached probe result; another value is not read. 2: results timed before the probe's inputs took
# their layout's strides (format 1) could compare one layout with itself, so they are probed again; 3: results kept
# before a probe checked that its timings repeat on a machine not busy with other work (format 2) may be noise
CACHE_FORMAT = 3
MAX_CACHE_BYTES = 64 * 1024  # a cached result is a few hundred bytes: a larger file is not one


@dataclass(frozen=True)
class Candidate:
    precision: PrecisionName
    channels_last: bool

    def __str__(self) -> str:
        return f"{self.precision}{' channels_last' if self.channels_last else ''}"


@dataclass
class Probe:
    """What the probe measured: the seconds of one step per candidate (inf: dropped) and the choice."""

    seconds: dict[Candidate, float]
    choice: Candidate
    dropped: dict[Candidate, str]
    steadiness: Steadiness | None = None  # None: read from the cache (it repeated when it was kept)

    def describe(self, batch: int) -> str:
        timed = ", ".join(f"{c} {batch / s:,.0f}" for c, s in sorted(self.seconds.items(), key=lambda kv: kv[1])
                          if math.isfinite(s))  # fmt: skip
        dropped = "".join(f"; {c} left out: {why}" for c, why in self.dropped.items())
        return f"probe (images/s of the training step): {timed}{dropped}"


def precision_candidates(machine: Machine, device_type: str) -> list[PrecisionName]:
    """The precisions worth timing on `machine`'s `device_type`: on a CPU, fp32 and bf16 where it computes bf16
    natively (AVX512-BF16 or AMX; elsewhere oneDNN emulates bf16, slower than fp32 on every net measured: an
    AVX2-only EPYC ran the default net's step at 10 images/s in bf16, 125 in fp32), else fp32 alone; on a GPU, fp32
    and bf16, or fp16 where it has no bf16 (fp16 has no fast CPU kernels and needs loss scaling)."""
    if device_type == "cpu":
        return ["fp32", "bf16"] if machine.cpu_bf16 else ["fp32"]
    accelerator = machine.accelerator
    if accelerator is None or accelerator.kind != device_type:
        return ["fp32"]
    return ["fp32", "bf16"] if accelerator.bf16 else ["fp32", "fp16"] if accelerator.fp16 else ["fp32"]


def why_one_precision(machine: Machine, device_type: str) -> str:
    """Why `precision_candidates` offers fp32 alone here (for the opening line that says so)."""
    if device_type == "cpu":
        return (f"the CPU has no bf16 instructions ({machine.kernels} kernels; bf16 would be emulated, slower than "
                "fp32): nothing to time")  # fmt: skip
    return f"the {device_type} device has no fast 16-bit arithmetic: nothing to time"


def candidates(precision: str, channels_last: bool | str, device_type: str, machine: Machine) -> list[Candidate]:
    """Every combination the recipe leaves open (`auto`) on `machine`'s `device_type`, the fixed values as given."""
    precisions = precision_candidates(machine, device_type) if precision == "auto" else [precision]
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


def _interleaved(
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
    _interleaved(run_one, keys, RETIME_ROUNDS, limit, timings)
    again = meter.stop()
    # the busy verdict over both timings together: a short re-timing alone is a few clock ticks of /proc/stat
    both = again if activity is None or again is None else activity + again
    return Steadiness.of(max(spread(timings[k]) for k in keys), both, retimed=True)


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
    for option in options:  # round 0 warms each candidate up (kernel selection, allocations) and checks its loss
        if option not in dropped:
            losses[option] = _timed_step(steps[option], (layout[option.channels_last], labels), device)[1]
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
    contenders = _interleaved(run_one, contenders, ROUNDS, limit, timings, not_outpaced)
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
            timed[option] = _timed_step(step, small[option.channels_last], device)[0]
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
    they repeat (`steadied`: timed again when not); under several processes the ranks' times are summed, so every
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

    for size in sizes:  # round 0 warms each size up (kernel selection, allocations)
        run_one(size)
    timings: dict[int, list[float]] = {size: [] for size in sizes}
    meter.start()
    _interleaved(run_one, sizes, ROUNDS, limit, timings)
    steadiness = steadied(run_one, sizes, timings, limit, meter, meter.stop())
    sums = all_reduce_sum([min(timings[size]) for size in sizes] + [min(steadiness.spread, 1e9), steadiness.busy],
                          device)  # fmt: skip
    world = world_size()
    if world > 1:
        steadiness = Steadiness(sums[-2] / world, steadiness.activity, steadiness.retimed, bool(sums[-1]))
    return dict(zip(sizes, sums[: len(sizes)], strict=True)), steadiness


def announce(result: Probe, batch: int, asked: Sequence[str]) -> None:
    say(f"{', '.join(asked)}=auto -> {result.choice}; {result.describe(batch)}")


# ---- the cache of probe results -------------------------------------------------------------------------------


def _cpu_identity() -> dict[str, str]:
    """The CPU's model name and a digest of its instruction-set flags (what decides oneDNN's kernels)."""
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():  # Linux; elsewhere: platform
            name, _, value = line.partition(":")
            field = {"model name": "cpu", "flags": "flags", "Features": "flags"}.get(name.strip())  # x86, ARM
            if field and field not in found:
                found[field] = value.strip() if field == "cpu" else " ".join(sorted(value.split()))
    except OSError:
        pass
    flags = hashlib.sha256(found.get("flags", "").encode()).hexdigest()[:16]
    return {"cpu": found.get("cpu") or platform.processor() or platform.machine(), "arch": platform.machine(),
            "flags": flags}  # fmt: skip


def machine_identity(device: torch.device, machine: Machine) -> dict[str, Any]:
    """What the probe's timings depend on of the machine: the hardware they were taken on (the GPU's name,
    capability and CUDA version, or the CPU's model and instruction-set flags), the facts decided from (`machine`:
    its kernel set, cores, accelerator, and the HASTEN_MACHINE profile, if any), and torch's intra-op threads."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = list(torch.cuda.get_device_capability(index))
        hardware = {"gpu": torch.cuda.get_device_name(index), "capability": capability, "cuda": torch.version.cuda}
    else:
        hardware = _cpu_identity()
    return {"device": device.type, "hardware": hardware, "described": machine.identity(),
            "threads": torch.get_num_threads()}  # fmt: skip


def model_digest(model: nn.Module) -> str:
    """The model's class and the names, shapes, dtypes and trainability of its parameters and buffers, hashed."""
    kind = type(model)
    parts = [f"{kind.__module__}.{kind.__qualname__}"]
    parts += [f"p {name} {tuple(p.shape)} {p.dtype} {p.requires_grad}" for name, p in model.named_parameters()]
    parts += [f"b {name} {tuple(b.shape)} {b.dtype}" for name, b in model.named_buffers()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def probe_key(model: nn.Module, images: Tensor, options: Sequence[Candidate], machine: Machine) -> dict[str, Any]:
    """Everything the probe's result depends on (module docstring); a cached result is used for this key only."""
    return {
        "machine": machine_identity(images.device, machine),
        "model": model_digest(model),
        "batch": int(images.shape[0]),
        "input_shape": [int(n) for n in images.shape[1:]],
        "input_dtype": str(images.dtype),
        "candidates": [str(option) for option in options],
        "torch": torch.__version__,
        "hasten": __version__,
        "processes": world_size(),
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(key: dict[str, Any]) -> Path:
    return cache_folder("probe") / f"{key_digest(key)}.json"


def read_cached(path: Path, key: dict[str, Any], options: Sequence[Candidate]) -> tuple[Probe | None, str | None]:
    """The probe result cached at `path` for `key`: (result, None); (None, None) when there is no file; (None, why)
    when the file cannot be used (unreadable, too large, not JSON, another format, another key, a choice that is
    not a candidate, malformed timings). Only JSON is read; nothing in the file is executed or followed."""
    return _read_parsed(path, lambda saved: _parse_cached(saved, key, options))


def _read_parsed(path: Path, parse: Callable[[Any], Any]) -> tuple[Any, str | None]:
    """`parse` of the JSON at `path`: (value, None); (None, None) when there is no file; (None, why) when it cannot
    be read or `parse` refuses it (TypeError, ValueError, KeyError: the reason)."""
    saved, problem = _read_json(path)
    if saved is None:
        return None, problem
    try:
        return parse(saved), None
    except (TypeError, ValueError, KeyError) as error:
        return None, str(error) or type(error).__name__


def _parse_cached(saved: Any, key: dict[str, Any], options: Sequence[Candidate]) -> Probe:
    if not isinstance(saved, dict) or saved.get("format") != CACHE_FORMAT:
        raise ValueError(f"not a format-{CACHE_FORMAT} probe result")
    if saved.get("key") != key:
        raise ValueError("written for another key")
    by_name = {str(option): option for option in options}
    choice = saved.get("choice")
    if not isinstance(choice, str) or choice not in by_name:
        raise ValueError(f"its choice {str(choice)[:40]!r} is not one of the candidates")
    seconds, dropped = saved.get("seconds"), saved.get("dropped")
    if not isinstance(seconds, dict) or set(seconds) != set(by_name):
        raise ValueError("its timings do not name the candidates")
    if not isinstance(dropped, dict) or not set(dropped) <= set(by_name):
        raise ValueError("its dropped candidates are not candidates")
    timed: dict[Candidate, float] = {}
    for name, value in seconds.items():
        valid_number = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
        if not (value is None or valid_number):
            raise ValueError(f"its timing of {name} is not a number of seconds")
        timed[by_name[name]] = math.inf if value is None else float(value)
    if any(not isinstance(why, str) or len(why) > 500 for why in dropped.values()):
        raise ValueError("its reasons for dropped candidates are not short texts")
    if not math.isfinite(timed[by_name[choice]]):
        raise ValueError("its choice has no timing")
    return Probe(timed, by_name[choice], {by_name[name]: why for name, why in dropped.items()})


def write_cached(path: Path, key: dict[str, Any], result: Probe) -> str | None:
    """Keep `result` for `key` at `path` (written to a temporary file and renamed); the reason when it could not
    be written (the run goes on without the cache)."""
    record = {
        "format": CACHE_FORMAT,
        "key": key,
        "choice": str(result.choice),
        "seconds": {str(c): (s if math.isfinite(s) else None) for c, s in result.seconds.items()},
        "dropped": {str(c): why for c, why in result.dropped.items()},
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return _write_json(path, record)


def _write_json(path: Path, record: dict[str, Any]) -> str | None:
    """`record` as JSON at `path` (a temporary file renamed); the reason when it could not be written."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        return f"{error.strerror or error}"
    finally:
        temporary.unlink(missing_ok=True)
    return None


def _read_json(path: Path) -> tuple[Any, str | None]:
    """The JSON at `path` (at most MAX_CACHE_BYTES): (value, None); (None, None) when there is no file; (None, why)
    when it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CACHE_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, f"unreadable: {error.strerror or error}"
    if len(raw) > MAX_CACHE_BYTES:
        return None, f"larger than {MAX_CACHE_BYTES:,} bytes"
    try:
        return json.loads(raw.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as error:
        return None, f"not JSON ({type(error).__name__})"


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
        say(f"probe cache key {digest}: {_kept(path, key, result, lambda: write_cached(path, key, result))}")
    return result


def bound_text() -> str:
    return f"at most about {MAX_PROBE_SECONDS:g} s after two rounds, twice that if they must be timed again"


def _kept(path: Path, key: dict[str, Any], result: Any, write: Callable[[], str | None]) -> str:
    """Writes a steady result to the cache; the line that says what became of it."""
    steadiness: Steadiness | None = result.steadiness
    if steadiness is not None and not steadiness.repeats:
        return f"not kept: {steadiness.problem()}; this run uses it, the next one times again"
    failed = write()
    return f"not kept ({failed})" if failed else f"kept in {path}"


def batch_key(
    model: nn.Module, images: Tensor, option: Candidate, sizes: Sequence[int], machine: Machine
) -> dict[str, Any]:
    """What `time_batches`'s timings depend on: the probe's key for `option` alone, at the batch sizes timed."""
    return probe_key(model, images[:1], [option], machine) | {"batch": None, "sizes": [int(size) for size in sizes]}


def _parse_batch_times(saved: Any, key: dict[str, Any]) -> dict[int, float]:
    if not isinstance(saved, dict) or saved.get("format") != CACHE_FORMAT or saved.get("what") != "batch":
        raise ValueError(f"not a format-{CACHE_FORMAT} batch timing")
    if saved.get("key") != key:
        raise ValueError("written for another key")
    seconds = saved.get("seconds")
    if not isinstance(seconds, dict) or set(seconds) != {str(size) for size in key["sizes"]}:
        raise ValueError("its timings do not name the batch sizes")
    found = {}
    for size, value in seconds.items():
        if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf):
            raise ValueError(f"its timing of batch {size} is not a number of seconds")
        found[int(size)] = float(value)
    return found


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
    path = cache_folder("probe") / f"batch-{key_digest(key)}.json"
    found, problem = _read_parsed(path, lambda saved: _parse_batch_times(saved, key)) if is_main() else (None, None)
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

    def write() -> str | None:
        when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        timings = {str(size): seconds for size, seconds in measured.seconds.items()}
        return _write_json(path, {"format": CACHE_FORMAT, "what": "batch", "key": key, "seconds": timings,
                                  "measured": when})  # fmt: skip

    return measured, (_kept(path, key, measured, write) if is_main() else "")
