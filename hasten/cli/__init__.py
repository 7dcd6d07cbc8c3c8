"""The `hasten` command: the only package that knows about argv.

Each command is declared once, beside the function that runs it (hasten/cli/command.py says what a declaration
holds; hasten/cli/parser.py builds the parser from them). Here: the process around a command, which turns what
goes wrong into one line and an exit code. Options may stand before or after the recipe and the `key=value`
overrides, as with git and torchrun. Exit codes: 0 success; 2 usage, recipe, data or checkpoint error (message
names the field or file); 130 after SIGINT.
"""

from __future__ import annotations

import atexit
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from rich.markup import escape

from hasten.cli.command import console
from hasten.cli.parser import UsageError, build, parse
from hasten.errors import HastenError, out_of_memory
from hasten.text import printable


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """The command with `argv`; its wall-clock times count from `started` (a perf_counter reading; by default
    this call)."""
    started = time.perf_counter() if started is None else started
    from hasten.progress import quiet_third_party

    quiet_third_party()  # torch's notices about its own internals are not the user's business
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # a name that is not UTF-8 (a file, a class folder) prints escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if not argv:  # bare `hasten`: what to type, not argparse's internals
        build()[0].print_help(sys.stderr)
        console.print("[red]error:[/red] give a COMMAND, e.g. 'hasten train fashion-fast'", highlight=False)
        return 2
    try:
        command, ns = parse(argv)
    except UsageError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 2
    # the command line as given, which reports record: rebuilt from parsed options it would drop any new one
    ns.command_line = shlex.join(["hasten", *argv])
    ns.started = started
    # a worker of a job with several processes names its rank in what it prints on the way out
    who = f"rank {os.environ.get('RANK', '?')}: " if _world_size() > 1 else ""
    if os.environ.get("HASTEN_LAUNCHER_PID", "").isdigit() and _world_size() > 1:  # a worker of --devices N
        from hasten.engine.distributed import die_with_launcher

        die_with_launcher(int(os.environ["HASTEN_LAUNCHER_PID"]))
    try:
        from hasten.machine import current

        current()  # a HASTEN_MACHINE that names no profile is refused before any work, whatever the command
        return command.run(ns)
    except HastenError as error:
        if getattr(error, "resumable", False):  # a signal stopped a run after its checkpoint: no error
            again = resume_command(ns.command_line) if command.resumable else ""
            told = f"; resume with: {again}" if again else ""
            console.print(f"[yellow]{who}stopped:[/yellow] {escape(str(error))}{escape(told)}", highlight=False,
                          soft_wrap=True)  # fmt: skip
            return error.exit_code
        return _error(who, str(error), error.exit_code)
    except OSError as error:
        if not error.filename:
            _record_bug(error)
            raise
        # a file or folder the user named that the system refuses (permissions, a vanished disk): exit 2 naming it
        return _error(who, printable(f"{error.filename}: {error.strerror or error}"), 2)  # a file's name: printable
    except KeyboardInterrupt:
        console.print(f"[yellow]{who}interrupted[/yellow]")
        return 130
    except (MemoryError, RuntimeError) as error:
        return _resource_failure(error, who)
    except Exception as error:  # a bug: raised with its traceback
        _record_bug(error)
        raise
    finally:
        if "hasten.engine.distributed" in sys.modules:  # leave the process group cleanly (no-op when none is up)
            sys.modules["hasten.engine.distributed"].shutdown()


def _error(who: str, message: str, code: int) -> int:
    """Print a failure's one line (`message`: plain text; printed escaped) and return its exit `code`. In a worker
    of several, the failure is this rank's own: recorded for the launcher first (`_record`)."""
    _record(code, message)
    console.print(f"[red]{who}error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return code


def _record_bug(error: BaseException) -> None:
    """A bug about to be raised with its traceback (Python then exits 1): recorded as `_error`'s failures are."""
    _record(1, printable(f"{type(error).__name__}: {error}"))


def _record(code: int, message: str) -> None:
    """In a worker of several: record this rank's own failure where the launcher reads it, before the process
    group is left (main's `finally`): leaving it may end a peer first (gloo aborts a rank whose peer closed under
    it), and the record still names this rank (hasten/engine/distributed.py, `record_failure`)."""
    if _world_size() > 1:
        from hasten.engine.distributed import record_failure

        record_failure(code, message)


def resume_command(command_line: str) -> str:
    """The command that continues a stopped run: `command_line` with resume=auto in place of any resume=... (and
    without run.overwrite, which would move the stopped run's files aside)."""
    words = [w for w in shlex.split(command_line) if not w.startswith(("resume=", "run.overwrite="))]
    return shlex.join([*words, "resume=auto"])


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _resource_failure(error: BaseException, who: str) -> int:
    """The one line for a failure that is not hasten's input check but the machine's: memory that cannot be had, or
    (in a worker of several) another rank that vanished. Anything else is a bug, raised with its traceback."""
    from hasten.engine.distributed import PEER_LOST_EXIT, lost_peer

    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    if out_of_memory(error):
        return _error(
            who,
            f"out of memory ({first}): the sizes asked for are too large for this machine (in a recipe: "
            "train.batch_size, train.eval_batch_size, model.width, data.size), or free memory",
            2,
        )
    if lost_peer(error):
        if not os.environ.get("HASTEN_LAUNCHER_PID"):  # under hasten's launcher, its one line says it all
            console.print(
                f"[red]{who}error:[/red] another rank of this job vanished ({escape(first)}); the launcher names it",
                highlight=False,
                soft_wrap=True,
            )
        return PEER_LOST_EXIT
    _record_bug(error)
    raise error


TRAINING = ("train", "lr-find", "batch-size", "bench", "sweep", "transfer", "gan")  # commands whose steps are timed


def run() -> NoReturn:
    """The `hasten` command's process: `main`, then exit at once. Everything is written and closed by then, and
    the interpreter's teardown of torch alone takes seconds (3-6 s measured on a busy 2-core machine) after a
    run's last line; so exit handlers run, output is flushed, and the process ends without the teardown."""
    from hasten.clock import command_started
    from hasten.threads import set_wait

    words = sys.argv[1:]  # the commands that train look at the machine before torch loads (hasten/threads.py)
    set_wait(look=bool(words) and words[0] in TRAINING and not {"-h", "--help"} & set(words))
    end(main(started=command_started()))  # the process's start (or the launching command's): imports count


def end(code: int) -> NoReturn:
    """End the process with `code` as the `hasten` command does: exit handlers, output flushed, no teardown."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
