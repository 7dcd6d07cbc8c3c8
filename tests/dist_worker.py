"""`hasten ARGS` in 2 processes through torchrun's launcher, with faults injected, for the distributed tests.

    python tests/dist_worker.py train RECIPE key=value ...

Run without torchrun's variables it is the launcher (hasten.engine.distributed.launch, with itself as the script);
each worker then runs `hasten.cli.main(ARGS)`. The environment says what to inject, on the first attempt only
(torchrun's TORCHELASTIC_RESTART_COUNT = 0), so an elastic restart runs clean:

    HASTEN_TEST_FAULT=raise:R:S     rank R raises after its S-th optimizer step
    HASTEN_TEST_FAULT=raise-slow:R:S  as raise, and rank R's exit closes its sockets and then takes 60 s more
                                    (torch's teardown on a busy machine), so the peer it left ends first
    HASTEN_TEST_FAULT=sigterm:R:S   rank R alone gets SIGTERM after its S-th optimizer step
    HASTEN_TEST_FAULT=kill:R:S      rank R is SIGKILLed after its S-th optimizer step (a crash, an OOM kill)
    HASTEN_TEST_RESTARTS=K          torchrun's --max-restarts
    HASTEN_TEST_AUDIT=DIR           each rank lists every file it opened for writing, renamed, created or
                                    removed in DIR/rank-R.txt (Python's audit hooks see every such call)

Fault injection lives here, in the test, rather than in hasten.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path
from typing import Any


def audit_writes(folder: Path, rank: int) -> None:
    touched: list[str] = []
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & write_flags)
            if writing:
                touched.append(os.fsdecode(args[0]))
        elif event in ("os.rename", "os.replace"):  # both ends: an atomic write lands by renaming its temporary
            touched.extend((os.fsdecode(args[0]), os.fsdecode(args[1])))
        elif event in ("os.mkdir", "os.remove", "os.unlink", "os.rmdir", "shutil.rmtree"):
            touched.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)
    atexit.register(lambda: (folder / f"rank-{rank}.txt").write_text("".join(f"{p}\n" for p in touched)))


def slow_teardown() -> None:
    """At exit after an uncaught error: close the process's connections (the process group's among them), as the
    interpreter's teardown may before it ends, then take the seconds torch's teardown can take on a busy machine."""
    import time

    for name in os.listdir("/proc/self/fd"):  # Linux: the test that injects this runs there only
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                os.close(int(name))
        except OSError:
            pass
    time.sleep(60)


def inject(fault: str, rank: int) -> None:
    from hasten.run.trainer import Trainer

    kind, fault_rank, fault_step = fault.split(":")
    if rank != int(fault_rank) or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    finish_once = Trainer._finish_step  # the update and what follows it

    def finish_step(self: Trainer, result: Any) -> None:
        finish_once(self, result)
        if self.state.step == int(fault_step):
            if kind == "raise-slow":
                atexit.register(slow_teardown)
            if kind.startswith("raise"):
                raise RuntimeError(f"injected failure on rank {rank} at step {fault_step}")
            os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGTERM)

    Trainer._finish_step = finish_step


def main() -> int:
    if "LOCAL_RANK" not in os.environ:  # the launcher
        from hasten.engine.distributed import launch

        restarts = int(os.environ.get("HASTEN_TEST_RESTARTS", "0"))
        return launch(2, sys.argv[1:], max_restarts=restarts, script=os.path.abspath(__file__))
    rank = int(os.environ["RANK"])
    if os.environ.get("HASTEN_TEST_AUDIT"):
        audit_writes(Path(os.environ["HASTEN_TEST_AUDIT"]), rank)
    if os.environ.get("HASTEN_TEST_FAULT"):
        inject(os.environ["HASTEN_TEST_FAULT"], rank)
    from hasten.cli import main as hasten_main

    return hasten_main(sys.argv[1:])


if __name__ == "__main__":
    from hasten.cli import end

    # as `python -m hasten` ends: without the interpreter's teardown of torch, which the workers of
    # `hasten train --devices N` never run either
    end(main())
