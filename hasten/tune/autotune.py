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

Numerically safe: fp16 (no fast CPU kernels, and it needs loss scaling) is a candidate only on a GPU without
bf16; a 16-bit candidate whose loss on the probe batch is not finite, or differs from fp32's by more than
LOSS_TOLERANCE, is dropped. Under several processes the ranks add up their timings, so all choose alike.

The probe takes seconds a user waits for, and its answer holds as long as what it measured does: so its result
is kept in the cache folder (`$HASTEN_CACHE/probe`, else `~/.cache/hasten/probe`), one JSON file per key, the key
being everything the timing depends on (`probe_key`: the machine's CPU model and instruction-set flags or its GPU
and capability, torch's thread count, the model's class and a digest of its parameter and buffer shapes, the
batch and image shape, the candidates, the torch and hasten versions, the process count); any change of those is
another key, another file. A cached file is data: it is read as JSON of at most MAX_CACHE_BYTES, checked field by
field against the key and the candidates, and a file that fails any check is ignored with a note and probed over.
Delete the file (its path is printed) to probe again.
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
from hasten.progress import say
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
TIE = 0.05  # candidates within this fraction of the fastest count as tied: the first of them in `candidates` order wins
LOSS_TOLERANCE = 0.05  # largest |16-bit loss - fp32 loss| on the probe batch, relative to the fp32 loss (and 0.05)
# the layout of a cached probe result; another value is not read. 2: results timed before the probe's inputs took
# their layout's strides (format 1) could compare one layout with itself, so they are probed again
CACHE_FORMAT = 2
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

    def describe(self, batch: int) -> str:
        timed = ", ".join(f"{c} {batch / s:,.0f}" for c, s in sorted(self.seconds.items(), key=lambda kv: kv[1])
                          if math.isfinite(s))  # fmt: skip
        dropped = "".join(f"; {c} left out: {why}" for c, why in self.dropped.items())
        return f"probe (images/s of the training step): {timed}{dropped}"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX): elsewhere oneDNN emulates it, slower than
    fp32 on every net measured (an AVX2-only EPYC: bf16 at 10 images/s of the default net's step, fp32 at 125)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def precision_candidates(device: torch.device) -> list[PrecisionName]:
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


def time_limit(run_images: int | None, seconds_per_image: float) -> float:
    """How long a probe may go on after its second timed round: MAX_PROBE_SECONDS, or PROBE_SHARE of the run it
    serves (`run_images` images at the fastest `seconds_per_image` timed) if that is less; None: the run's length
    is not known."""
    if run_images is None:
        return MAX_PROBE_SECONDS
    return min(MAX_PROBE_SECONDS, PROBE_SHARE * run_images * seconds_per_image)


def probe(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    options: Sequence[Candidate],
    loss_fn=None,
    run_images: int | None = None,
) -> Probe:
    """Time one training step of a copy of `model` on `batch` for each of `options`; the fastest safe one wins.
    `model` itself is never touched (its weights, buffers and memory format stay as they were). `run_images`: the
    images the run will train on, which bounds the probe's time (`time_limit`)."""
    images, labels = batch
    device = images.device
    losses: dict[Candidate, float] = {}
    steps = {option: _step_on_copy(model, option, device, num_classes, loss_fn) for option in options}
    layout = {False: in_layout(images, False), True: in_layout(images, True)}
    few = max(SCREEN_MIN, len(labels) // SCREEN_SHARE)  # a look at a small batch: below some images it says little
    screen = {c: (x[:few], labels[:few]) for c, x in layout.items()}
    # the first look is for a 16-bit candidate that may be hopeless; layouts of one precision are not 3x apart
    mixed = len({option.precision for option in options}) > 1
    dropped = _screen(steps, screen, device) if few < len(labels) and mixed else {}
    screened, best = dict(dropped), {option: math.inf for option in options}
    outpaced: set[Candidate] = set()
    started = time.perf_counter()
    for round_ in range(ROUNDS + 1):  # round 0 warms each candidate up (kernel selection, allocations)
        for option in options:
            if option in dropped or option in outpaced:
                continue
            seconds, loss = _timed_step(steps[option], (layout[option.channels_last], labels), device)
            if round_ == 0:
                losses[option] = loss
            else:
                best[option] = min(best[option], seconds)
        per_image = min(best.values()) / len(labels)
        if round_ >= 2 and time.perf_counter() - started > time_limit(run_images, per_image):
            break
        if round_ == 0:
            dropped = screened | _unsafe(losses)
        if round_ == 1:
            fastest = min(best.values())
            outpaced = {o for o in options if best[o] > OUTPACED * fastest}
    # summed over the ranks, with how many left each candidate out: one left out anywhere is left out everywhere
    sums = all_reduce_sum([best[o] if o not in dropped else 0.0 for o in options] + [o in dropped for o in options],
                          device)  # fmt: skip
    totals, left_out = sums[: len(options)], sums[len(options) :]
    seconds = {o: (t if not out else math.inf) for o, t, out in zip(options, totals, left_out, strict=True)}
    fastest = min(seconds.values())
    choice = next(o for o in options if seconds[o] <= fastest * (1 + TIE))  # near-ties: the same choice every run
    return Probe(seconds, choice, dropped)


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
) -> dict[int, float]:
    """Seconds of one training step of a copy of `model` in `option` at each batch size of `sizes` (the first
    images of `batch`, which holds at least the largest), interleaved over rounds, the minimum kept; under several
    processes the ranks' times are summed, so every rank sees the same. `model` is never touched. `run_images`
    bounds its time as `probe`'s."""
    images, labels = batch
    device = images.device
    images = in_layout(images, option.channels_last)
    step = _step_on_copy(model, option, device, num_classes)
    best = {size: math.inf for size in sizes}
    started = time.perf_counter()
    for round_ in range(ROUNDS + 1):  # round 0 warms each size up (kernel selection, allocations)
        for size in sizes:
            seconds, _ = _timed_step(step, (images[:size], labels[:size]), device)
            if round_:
                best[size] = min(best[size], seconds)
        per_image = min(best[size] / size for size in sizes)
        if round_ >= 2 and time.perf_counter() - started > time_limit(run_images, per_image):
            break
    totals = all_reduce_sum([best[size] for size in sizes], device)
    return dict(zip(sizes, totals, strict=True))


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


def machine_identity(device: torch.device) -> dict[str, Any]:
    """What the probe's timings depend on of the machine: the GPU (name, capability, CUDA version) or the CPU
    (model, instruction-set flags), and torch's intra-op thread count."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        found = {"gpu": torch.cuda.get_device_name(index), "capability": list(torch.cuda.get_device_capability(index)),
                 "cuda": torch.version.cuda}  # fmt: skip
    else:
        found = {"device": device.type, **_cpu_identity()}
    return found | {"threads": torch.get_num_threads()}


def model_digest(model: nn.Module) -> str:
    """The model's class and the names, shapes, dtypes and trainability of its parameters and buffers, hashed."""
    kind = type(model)
    parts = [f"{kind.__module__}.{kind.__qualname__}"]
    parts += [f"p {name} {tuple(p.shape)} {p.dtype} {p.requires_grad}" for name, p in model.named_parameters()]
    parts += [f"b {name} {tuple(b.shape)} {b.dtype}" for name, b in model.named_buffers()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def probe_key(model: nn.Module, images: Tensor, options: Sequence[Candidate]) -> dict[str, Any]:
    """Everything the probe's result depends on (module docstring); a cached result is used for this key only."""
    return {
        "machine": machine_identity(images.device),
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
    run_images: int | None = None,
) -> Probe:
    """`probe`'s result for this machine, model and batch: from the cache when it holds a valid one for the key,
    else measured and cached; said in the opening lines (the choice, the timings, the key and the cache file).
    Under several processes rank 0 reads the cache and tells the others; a miss is probed by all together."""
    images = batch[0]
    key = probe_key(model, images, options)
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
    result = probe(model, batch, num_classes, options, run_images=run_images)
    if is_main():
        announce(result, len(images), asked)
        failed = write_cached(path, key, result)
        say(f"probe cache key {digest}: " + (f"not kept ({failed})" if failed else f"kept in {path}"))
    return result


def batch_key(model: nn.Module, images: Tensor, option: Candidate, sizes: Sequence[int]) -> dict[str, Any]:
    """What `time_batches`'s timings depend on: the probe's key for `option` alone, at the batch sizes timed."""
    return probe_key(model, images[:1], [option]) | {"batch": None, "sizes": [int(size) for size in sizes]}


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


def cached_batch_times(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    num_classes: int,
    option: Candidate,
    sizes: Sequence[int],
    run_images: int | None = None,
) -> tuple[dict[int, float], str]:
    """`time_batches`'s seconds per step at each of `sizes`, from the cache when it holds them for this machine,
    model, image shape, option and sizes (a cached file is data, checked field by field like the probe's), else
    timed and kept; with a line saying which. Under several processes rank 0 reads and tells the others."""
    key = batch_key(model, batch[0], option, sizes)
    path = cache_folder("probe") / f"batch-{key_digest(key)}.json"
    found, problem = _read_parsed(path, lambda saved: _parse_batch_times(saved, key)) if is_main() else (None, None)
    found = broadcast_object(found)
    if found is not None:
        return found, f"timed on this machine before ({path}; delete it to time again)"
    if problem and is_main():
        say(f"batch timing cache {path} ignored ({problem}); timing again")
    measured = time_batches(model, batch, num_classes, option, sizes, run_images)
    failed = None
    if is_main():
        when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        timings = {str(size): seconds for size, seconds in measured.items()}
        record = {"format": CACHE_FORMAT, "what": "batch", "key": key, "seconds": timings, "measured": when}
        failed = _write_json(path, record)
    return measured, (f"timing not kept ({failed})" if failed else f"kept in {path}")
