"""Errors that the CLI turns into exit code 2 with a message naming the field, file or value at fault."""

from __future__ import annotations

from typing import Any

from hasten.text import printable


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
