"""Data-parallel training on torch.distributed: torchrun's environment, the process group, DDP, rank helpers.

One process per device (TensorFlow's "mirrored strategy" in PyTorch terms): each holds a full model copy,
takes its share of every batch, and DDP all-reduces gradients during backward. NCCL on CUDA, gloo on CPU.
`hasten train --devices N` starts N workers through torchrun's own launcher (`torch.distributed.run`), so a
job started from the CLI behaves exactly like `torchrun --nproc-per-node N -m hasten train ...`: the elastic
agent watches the workers and stops the whole job, non-zero, when one fails.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hasten.engine.norms import is_batch_norm
from hasten.errors import RecipeError
from hasten.machine import ENV, Machine, auto_device, process_backend, threads_per_process
from hasten.machine import current as current_machine
from hasten.progress import say
from hasten.recipe.root import DEVICE

# how long a collective may wait for a missing peer before the job fails instead of hanging
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=int(os.environ.get("HASTEN_DIST_TIMEOUT_MIN", "10")))


@dataclass(frozen=True)
class DistEnv:
    """The process's place in the job, from torchrun's environment variables (single process without them)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    restart_count: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: > 0 after an elastic restart

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> DistEnv:
        env = os.environ if environ is None else environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_said: set[str] = set()


def _say_once(note: str) -> bool:
    """Whether `note` is this process's to say now: the main process's (torchrun's RANK 0, or no RANK), once."""
    if os.environ.get("RANK", "0") != "0" or note in _said:
        return False
    _said.add(note)
    return True


def checked_device(device: str | torch.device) -> torch.device:
    """A device given outside a recipe (`hasten.load`'s), checked as a recipe's `device` is: RecipeError naming it
    when it is no device name, or one this machine lacks (with the devices it has); "auto" as training decides it."""
    name = str(device) if isinstance(device, (str, torch.device)) else None
    if name is None or not DEVICE.fullmatch(name):
        raise RecipeError(f"device: {device!r} is not auto, cpu, cuda, cuda:N or mps")
    return resolve_device(name)


def resolve_device(name: str, machine: Machine | None = None) -> torch.device:
    """The recipe's `device`: "auto" is the machine's accelerator where this process has one, else the CPU
    (hasten.machine.auto_device, which says so when a HASTEN_MACHINE profile describes a GPU this machine lacks);
    anything else as torch reads it. The one place "auto" is decided."""
    machine = machine or current_machine()
    if name == "auto":
        requested, note = auto_device(machine)
        if note and _say_once(note):
            say(note)
    else:
        requested = name
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = ["this PyTorch build has no CUDA support"] if torch.version.cuda is None else []
        if machine.accelerator is not None and machine.accelerator.kind == "cuda":
            why.append(f"{ENV}={machine.profile} describes one, but a profile replaces facts, not hardware")
        said = f" ({'; '.join(why)})" if why else ""
        raise RecipeError(f"device: {requested} asked for, but this machine has no CUDA device{said}; available "
                          f"here: {available_devices()}")  # fmt: skip
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RecipeError(f"device: {requested}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                          f"available here: {available_devices()}")  # fmt: skip
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise RecipeError(f"device: {requested} asked for, but MPS is not available here; available here: "
                          f"{available_devices()}")  # fmt: skip
    return device


def available_devices() -> str:
    """The `device` values this process can run on, for an error that refuses another: auto, cpu, and each CUDA
    device (cuda: each process its own, by local rank) or mps where there is one."""
    names = ["auto", "cpu"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        names += ["cuda", *(f"cuda:{i}" for i in range(count))] if count <= 8 else ["cuda", f"cuda:0..cuda:{count - 1}"]
    if torch.backends.mps.is_available():
        names.append("mps")
    return ", ".join(names)


def device_for(env: DistEnv, requested: str, machine: Machine | None = None) -> torch.device:
    """The device of this process: its own GPU (by local rank) under CUDA, else the CPU."""
    device = resolve_device(requested, machine)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", env.local_rank % max(torch.cuda.device_count(), 1))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init(env: DistEnv, device: torch.device) -> None:
    """Join the process group torchrun described (no-op for a single process)."""
    if not env.is_distributed or dist.is_initialized():
        return
    backend = process_backend(device.type)
    # torchrun's store outlives an elastic restart, and the process group's keys (each rank's address) would be
    # read back from the failed attempt; a prefix per attempt keeps the restarted workers to their own keys
    store, _, _ = next(dist.rendezvous("env://", env.rank, env.world_size, timeout=COLLECTIVE_TIMEOUT))
    store = dist.PrefixStore(f"hasten/attempt-{env.restart_count}", store)
    pinned = device if device.type == "cuda" else None
    dist.init_process_group(
        backend, store=store, rank=env.rank, world_size=env.world_size, timeout=COLLECTIVE_TIMEOUT, device_id=pinned
    )


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Processes in the job: the process group's size when one is up, else 1."""
    return dist.get_world_size() if _initialized() else 1


def rank() -> int:
    return dist.get_rank() if _initialized() else 0


def is_main() -> bool:
    return rank() == 0


def wrap(model: nn.Module, device: torch.device, find_unused: bool = False) -> nn.Module:
    """The model wrapped in DistributedDataParallel when there are several processes, else unchanged (build
    converts to SyncBatchNorm before, when train.sync_batchnorm asks). `find_unused`: parameters the loss may not
    reach (a user's model: an auxiliary head left out of the loss, a layer its forward skips), which DDP otherwise
    refuses at the second step; it costs a walk of the autograd graph a step."""
    if world_size() == 1:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP (or torch.compile) wrapper, whose state_dict has the plain keys."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


@contextmanager
def no_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce inside (accumulation micro-steps that do not step; hasten.engine.step)."""
    if skip and isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over all processes (identity for one process)."""
    if world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    """Element-wise maximum over all processes (identity for one process)."""
    if world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


@torch.no_grad()
def average_batch_norm_statistics(model: nn.Module) -> None:
    """Replace every batch-norm layer's running mean and variance by their average over the ranks."""
    world = world_size()
    for module in model.modules():
        if is_batch_norm(module) and module.running_mean is not None:
            for buffer in (module.running_mean, module.running_var):
                dist.all_reduce(buffer)
                buffer.div_(world)


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when `flag` is true on any rank (e.g. a stop signal seen by one)."""
    return agree([flag], device)[0]


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on every rank when it is true on any rank: one all-reduce for several decisions."""
    if world_size() == 1:
        return list(flags)
    tensor = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


def gather_objects(value: Any) -> list[Any]:
    """`value` of every rank, in rank order, on every rank (a one-item list for one process)."""
    if world_size() == 1:
        return [value]
    values: list[Any] = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def broadcast_object(value: Any, src: int = 0) -> Any:
    """`value` from rank `src` on every rank."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


LAUNCHER_PID = "HASTEN_LAUNCHER_PID"  # set by `launch` for its workers: the process they must not outlive
PEER_LOST_EXIT = 75  # a worker's exit code when another rank vanished under it: a consequence, not a cause
LAUNCHER_GONE_GRACE_SECONDS = 60  # after the launcher died: time to checkpoint and stop before exiting regardless


def die_with_launcher(launcher: int) -> None:
    """In a worker of `launch`: end when the launcher process `launcher` dies, however it dies (SIGKILL
    included), instead of living on as an orphan holding memory and cores. Linux's PR_SET_PDEATHSIG delivers
    SIGTERM at once (the run checkpoints and stops as after any SIGTERM); elsewhere, and as a backstop, a thread
    watches the parent pid and sends SIGTERM itself, then exits after LAUNCHER_GONE_GRACE_SECONDS."""
    import signal
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(LAUNCHER_GONE_GRACE_SECONDS)
        os._exit(128 + int(signal.SIGTERM))

    threading.Thread(target=watch, name="hasten-launcher-watch", daemon=True).start()


def launch(nproc: int, args: list[str], *, max_restarts: int = 0, script: str | None = None) -> int:
    """Run `python -m hasten ARGS` (or `python SCRIPT ARGS`) in `nproc` worker processes through torchrun's
    launcher, on this machine, with a free rendezvous port.

    Returns the job's exit code. A worker that fails makes torchrun stop the others (SIGTERM, then SIGKILL
    after its grace period) and the job exit with the failed worker's code, after a line naming its rank;
    with `max_restarts`, torchrun first restarts all workers that many times (they resume from the last
    checkpoint). SIGINT/SIGTERM to this process are passed on to the workers, which checkpoint and stop.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    target = [script] if script else ["-m", "hasten"]
    # torchrun would set 1 thread per worker and warn; share the cores instead (a GPU worker needs few)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(current_machine(), nproc)))
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the workers end with this process (die_with_launcher)
    # the elastic agent logs each failure at length (and a summary block); the lines below say it in one each
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    options = ["--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}", "--monitor-interval=0.5"]
    try:
        run(get_args_parser().parse_args([*options, *target, *args]))
    except ChildFailedError as error:
        codes = {rank_id: failure.exitcode for rank_id, failure in sorted(error.failures.items())}
        recorded = {rank_id: own for rank_id, failure in error.failures.items() if (own := recorded_failure(failure))}
        print(f"hasten: {describe_failures(codes, recorded)}", file=sys.stderr)
        return job_exit_code(codes, recorded)
    except SignalException as stop:
        print(f"hasten: stopped by {stop.sigval.name}; the workers were asked to checkpoint and stop", file=sys.stderr)
        return 128 + int(stop.sigval)
    return 0


FAILURE_FILE = "TORCHELASTIC_ERROR_FILE"  # torchrun gives each worker a file of its own for its failure's record


def record_failure(exit_code: int, message: str) -> None:
    """In a worker of a job: leave the record of a failure of its own (the exit code it leaves with, its one line,
    when) in the file torchrun's agent reads back for it (torch.distributed.elastic's error-file format, hasten's
    fields beside). Written before the worker leaves the process group, which may end a peer first (gloo aborts a
    rank whose peer's connection closed) and let the agent see that peer's death before this one's: the record
    says which rank failed of its own. Best effort: where it cannot be written, nothing else changes."""
    path = os.environ.get(FAILURE_FILE)
    if not path or world_size_from_env() < 2:
        return
    now = time.time()
    record = {
        "message": {"message": message, "extraInfo": {"py_callstack": "", "timestamp": str(int(now))}},
        "hasten": {"exit_code": int(exit_code), "time": now},
    }
    try:
        with open(f"{path}.partial", "w") as out:
            json.dump(record, out)
        os.replace(f"{path}.partial", path)  # the agent reads a whole record or none
    except OSError:
        pass


def recorded_failure(failure: Any) -> tuple[float, int] | None:
    """(when, exit code) of the failure a worker recorded as its own (`failure`: torch's ProcessFailure, which
    reads the worker's error file), or None where it recorded none."""
    own = failure.error_file_data.get("hasten") if isinstance(failure.error_file_data, dict) else None
    try:
        return (float(own["time"]), int(own["exit_code"])) if isinstance(own, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _consequence(code: int) -> bool:
    """A worker's exit that follows from another's failure: it lost its peer, or torchrun stopped it (SIGTERM)."""
    import signal

    return code in (PEER_LOST_EXIT, -int(signal.SIGTERM), 128 + int(signal.SIGTERM))


def _causes(codes: dict[int, int], recorded: dict[int, tuple[float, int]]) -> list[tuple[int, int]]:
    """The ranks that failed of their own, each with the exit it left with, from each rank's exit (`codes`:
    negative, killed by that signal) and the failures ranks recorded (`recorded`: rank -> (when, exit code)): those
    that recorded one, earliest first, with the recorded code; then those whose exit is no consequence of another's.
    A SIGABRT is gloo ending a rank whose peer vanished under it (std::terminate) where another rank failed of its
    own; it is the cause only where nothing else is."""
    import signal

    own = sorted(recorded, key=lambda rank_id: recorded[rank_id])
    rest = [rank_id for rank_id, code in codes.items() if rank_id not in recorded and not _consequence(code)]
    aborted = [rank_id for rank_id in rest if codes[rank_id] == -int(signal.SIGABRT)]
    if own or len(aborted) < len(rest):
        rest = [rank_id for rank_id in rest if rank_id not in aborted]
    causes = own + rest or list(codes)
    return [(rank_id, recorded[rank_id][1] if rank_id in recorded else codes[rank_id]) for rank_id in causes]


def describe_failures(codes: dict[int, int], recorded: dict[int, tuple[float, int]] | None = None) -> str:
    """One line for a failed job: each rank that failed of its own (the exit code it left with, or the signal that
    killed it; see `_causes`), then the ranks that were only stopped with it."""
    causes = _causes(codes, recorded or {})
    parts = []
    for rank_id, code in causes:
        if code < 0:
            parts.append(f"worker rank {rank_id} was killed by signal {-code} ({_signal_name(-code)})")
        elif code == PEER_LOST_EXIT:
            parts.append(f"worker rank {rank_id} stopped: another rank vanished under it")
        else:
            parts.append(f"worker rank {rank_id} failed with exit code {code}")
    named = {rank_id for rank_id, _ in causes}
    stopped = [str(rank_id) for rank_id in codes if rank_id not in named]
    if stopped:
        parts.append(f"rank {', '.join(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped with it")
    return "; ".join(parts)


def job_exit_code(codes: dict[int, int], recorded: dict[int, tuple[float, int]] | None = None) -> int:
    """The exit code of a job whose workers ended with `codes` (rank -> exit; negative: killed by that signal),
    `recorded` as for `_causes`. The cause wins over its consequences: the earliest failure a rank recorded as its
    own; else a worker's own exit code (> 0), else the signal that killed it, before a rank that only lost its peer
    (PEER_LOST_EXIT) or was stopped by torchrun."""
    exits = [code for _, code in _causes(codes, recorded or {}) if code] or [1]
    first = next((code for code in exits if code > 0 and code != PEER_LOST_EXIT), exits[0])
    return first if first > 0 else 128 - first  # a signal's death as the shell reports it


def lost_peer(error: BaseException) -> bool:
    """Whether `error`, raised in a worker of a job with several processes, says another rank vanished (its
    process died, its connection closed) rather than what went wrong here."""
    if world_size_from_env() < 2:
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    markers = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo", "NCCL", "ProcessGroup")
    return isinstance(error, RuntimeError) and any(marker in text for marker in markers)


def world_size_from_env() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1
