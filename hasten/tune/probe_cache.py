"""The start-up probe's results kept on disk, so a machine times a model once.

The probe takes seconds a user waits for, and its answer holds as long as what it measured does: so its result
is kept in the cache folder (`$HASTEN_CACHE/probe`, else `~/.cache/hasten/probe`), one JSON file per key, the key
being everything the timing depends on (`probe_key`: the machine's CPU model and instruction-set flags or its GPU
and capability, the Machine facts the candidates came from, torch's thread count, the model's class and a digest
of its parameter and buffer shapes, the batch and image shape, the candidates, the torch and hasten versions, the
process count); any change of those is another key, another file. The batch rule's timings at several batch sizes
are kept the same way (`batch_key`). Only timings that repeat are kept (`kept`; hasten/tune/steadiness.py).

A cached file is data: it is read as JSON of at most MAX_CACHE_BYTES, checked field by field against the key and
the candidates, and a file that fails any check is ignored with a note and probed over. Delete the file (its path
is printed) to probe again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.data.sources import cache_folder
from hasten.engine.distributed import world_size
from hasten.files import write_atomic_text
from hasten.machine import Machine
from hasten.threads import waiting
from hasten.tune.choices import Candidate, Probe
from hasten.tune.steadiness import Steadiness
from hasten.version import __version__

# the layout of a cached probe result; another value is not read. 2: results timed before the probe's inputs took
# their layout's strides (format 1) could compare one layout with itself, so they are probed again; 3: results kept
# before a probe checked that its timings repeat on a machine not busy with other work (format 2) may be noise
CACHE_FORMAT = 3
MAX_CACHE_BYTES = 64 * 1024  # a cached result is a few hundred bytes: a larger file is not one


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
    its kernel set, cores, accelerator, and the HASTEN_MACHINE profile, if any), and torch's intra-op threads and
    how they wait (hasten/threads.py: sleeping at once or spinning first times a step differently)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = list(torch.cuda.get_device_capability(index))
        hardware = {"gpu": torch.cuda.get_device_name(index), "capability": capability, "cuda": torch.version.cuda}
    else:
        hardware = _cpu_identity()
    return {"device": device.type, "hardware": hardware, "described": machine.identity(),
            "threads": torch.get_num_threads(), "threads_wait": waiting()}  # fmt: skip


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


def batch_cache_path(key: dict[str, Any]) -> Path:
    return cache_folder("probe") / f"batch-{key_digest(key)}.json"


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
    """`record` as JSON at `path`, whole or not at all (not fsynced: a torn file fails its checks when read, and is
    probed over); the reason when it could not be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_text(path, json.dumps(record, indent=2) + "\n", durable=False)
    except OSError as error:
        return f"{error.strerror or error}"
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


def read_batch_times(path: Path, key: dict[str, Any]) -> tuple[dict[int, float] | None, str | None]:
    """The batch timings cached at `path` for `key`, as `read_cached` reads a probe's: (seconds by size, None);
    (None, None) when there is no file; (None, why) when it cannot be used."""
    return _read_parsed(path, lambda saved: _parse_batch_times(saved, key))


def write_batch_times(path: Path, key: dict[str, Any], seconds: dict[int, float]) -> str | None:
    """Keep the batch timings `seconds` for `key` at `path`; the reason when they could not be written."""
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timings = {str(size): value for size, value in seconds.items()}
    return _write_json(path, {"format": CACHE_FORMAT, "what": "batch", "key": key, "seconds": timings,
                              "measured": when})  # fmt: skip


def kept(path: Path, steadiness: Steadiness | None, write: Callable[[], str | None]) -> str:
    """Writes a steady result to the cache (`steadiness` None: read from it, so it repeated when it was kept); the
    line that says what became of it."""
    if steadiness is not None and not steadiness.repeats:
        return f"not kept: {steadiness.problem()}; this run uses it, the next one times again"
    failed = write()
    return f"not kept ({failed})" if failed else f"kept in {path}"
