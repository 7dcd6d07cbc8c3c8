"""Errors that the CLI turns into exit code 2 with a message naming the field, file or value at fault."""

from __future__ import annotations


class HastenError(Exception):
    """A problem with the user's input (recipe, data, checkpoint): shown without a traceback, exit code 2."""

    exit_code = 2


class RecipeError(HastenError):
    """The recipe or its overrides are invalid; the message lists every problem, each naming its field."""


class DataError(HastenError):
    """A dataset is missing, corrupt or does not match its pinned hash; the message names the file."""


class CheckpointError(HastenError):
    """A checkpoint is missing, corrupt, unsafe or does not fit the model; the message names the file."""
