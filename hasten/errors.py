"""Errors that the CLI turns into exit code 2 with a message naming the field, file or value at fault."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from hasten.text import printable

DEBUG_ENV = "HASTEN_DEBUG"  # set (to anything but 0 or empty): a failure in the user's code carries its traceback


class HastenError(Exception):
    """A problem with the user's input (recipe, data, checkpoint): shown without a traceback, exit code 2. Its
    message is shown text: the control characters of a name in it (a file's, a class folder's) are escaped
    (`printable`), its own line breaks kept."""

    exit_code = 2

    def __init__(self, *args: object):
        super().__init__(*(printable(a, keep="\n") if isinstance(a, str) else a for a in args))


class RecipeError(HastenError):
    """The recipe or its overrides are invalid; the message lists every problem, each naming its field."""


class DataError(HastenError):
    """A dataset is missing, corrupt or does not match its pinned hash; the message names the file."""


class CheckpointError(HastenError):
    """A checkpoint is missing, corrupt, unsafe or does not fit the model; the message names the file."""


def schema_problems(error: Any, prefix: str = "") -> str:
    """A pydantic ValidationError as '; '-joined 'field: message (got value)' items, at most 5."""
    items = []
    for item in error.errors()[:5]:
        field = prefix + ".".join(str(part) for part in item["loc"]) or "the whole file"
        message = item["msg"].removeprefix("Value error, ")
        shown = repr(item.get("input"))
        items.append(f"{field}: {message}" + (f" (got {shown[:60]})" if item["type"] != "value_error" else ""))
    return "; ".join(items)


def debugging() -> bool:
    """Whether HASTEN_DEBUG asks for the user's own tracebacks (1, true, yes: anything but empty or 0)."""
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


@functools.cache
def _not_theirs() -> tuple[str, ...]:
    """The folders of code that is not the user's: hasten's, Python's and installed libraries' (torch, numpy, PIL).
    Read when first needed: every command imports this module, few ever meet the user's exception."""
    import sysconfig

    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)]
    return tuple(str(Path(path).resolve()) + os.sep for path in [str(Path(__file__).parent), *found])


def _theirs(filename: str) -> bool:
    """Whether a traceback frame's file is the user's code."""
    if filename.startswith("<"):  # <frozen importlib>: Python's; <stdin>, <string>, a notebook's cell: theirs
        return not filename.startswith("<frozen")
    return not str(Path(filename).resolve()).startswith(_not_theirs())


# what torch's allocators say when a request cannot be met (CPU, CUDA, MPS)
OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "not enough memory", "Cannot allocate memory")


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is memory that could not be had (Python's MemoryError, or what torch's allocators raise):
    the machine's failure, said as such, whoever's code asked."""
    return isinstance(error, MemoryError) or any(marker in str(error) for marker in OUT_OF_MEMORY)


def raised_in_their_code(error: BaseException) -> bool:
    """Whether any frame of `error`'s traceback is the user's code (their model's forward, a hook of theirs):
    the failure is theirs to see as one line (`their_error`), not as hasten's traceback."""
    import traceback

    return any(_theirs(frame.filename) for frame in traceback.extract_tb(error.__traceback__))


def first_line(error: BaseException, limit: int | None = None) -> str:
    """`RuntimeError: view size is not compatible ...`: the error's type and the first line of its message (at
    most `limit` characters of it), for a note that names a failure without its traceback."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:limit]}" if text else type(error).__name__


def their_error(error: BaseException) -> str:
    """An exception raised in the user's own code (a Dataset's item, a model's forward, a loss, a model or data
    target function) as a line that says what it was and where in their code: `ValueError: bad file (at
    my_data.py:41, in __getitem__)`, at the deepest frame of theirs. The one line is what a run
    prints (the error is theirs to fix, and hasten's internals around it are noise); with HASTEN_DEBUG=1 their
    whole traceback follows it, for the failure the one line does not explain. Text, not an exception chain, so it
    also crosses from a DataLoader worker process."""
    import traceback  # here: a few milliseconds every command would pay at start-up for a path few take

    lines = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines() or [type(error).__name__]
    said = lines[0] if len(lines[0]) <= 300 else lines[0][:297] + "..."
    frame = next((f for f in reversed(traceback.extract_tb(error.__traceback__)) if _theirs(f.filename)), None)
    if frame is not None:  # else raised where no frame is theirs (in C, or a library): hasten's would mislead
        said += f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
    if debugging():
        return said + "\n" + "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    return said + f"; {DEBUG_ENV}=1 shows its traceback"
