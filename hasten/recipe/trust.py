"""The trust boundary (the idea of Hugging Face's `trust_remote_code=False`): a recipe read back from a run folder,
checkpoint or export is data, not a program. Code that rebuilds a run from such a recipe does it inside
`embedded_recipe(source, trust)`, and there `import_target` imports nothing the recipe names unless the user
named the same target themselves or passed `--trust-code` (`trust_code=True`): the refusal names the target
and the flag. The gate sits in `import_target`, the one function that turns a recipe's import path into code.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hasten.errors import HastenError, RecipeError, their_error

USER_SOURCES = ("import", "object")  # model.name / data.name values that stand for the user's own objects


class UntrustedCode(HastenError):
    """A run folder, checkpoint or export names code to import, and the user has not said to trust it (exit 2)."""


@dataclass(frozen=True)
class Trust:
    """Which import paths a recipe from a run folder, checkpoint or export may make hasten import: none by default;
    those the user names again (`named`: dotted key -> target, e.g. {"model.target": "pkg.nets:make"}); any with
    `code` (`--trust-code`, `trust_code=True`)."""

    code: bool = False
    named: Mapping[str, str] = field(default_factory=dict)

    def allows(self, key: str, target: str) -> bool:
        return self.code or self.named.get(key) == target


_EMBEDDED: ContextVar[tuple[str, Trust] | None] = ContextVar("hasten_embedded_recipe", default=None)


@contextlib.contextmanager
def embedded_recipe(source: str, trust: Trust) -> Iterator[None]:
    """Inside the block the recipe at work is `source`'s (a run folder, checkpoint or export): `import_target`
    imports only what `trust` allows. Nested blocks keep the outer (stricter or equal) source's name."""
    token = _EMBEDDED.set((source, trust))
    try:
        yield
    finally:
        _EMBEDDED.reset(token)


def check_trusted(path: str, key: str) -> None:
    """UntrustedCode when a recipe from a file (`embedded_recipe`) names `key`=`path` and the user did not trust it."""
    scope = _EMBEDDED.get()
    if scope is None or scope[1].allows(key, path):
        return
    source, _ = scope
    raise UntrustedCode(
        f"{source} names {key}={path}: hasten imports no code that a run folder, checkpoint or export names (it is "
        f"data, not a program). If you trust its author, pass --trust-code (Python: trust_code=True); or give the "
        f"code yourself: from Python, model=YourModel to hasten.load or hasten.use.export.export; on the command "
        f"line, by naming it again: `hasten evaluate SOURCE {key}={path}`"
        + (
            f", `hasten predict SOURCE IMAGE --model {path}`, `hasten export SOURCE OUT --model {path}`"
            if key == "model.target"
            else ""
        )
    )


def _as_module(name: str) -> str:
    """For a file path given where a module's name goes (`models/net.py`), how to write it as one."""
    if not (name.endswith(".py") or "/" in name or "\\" in name):
        return ""
    file = Path(name if name.endswith(".py") else f"{name}.py")
    on_path = f"{file.stem} with {file.parent} on PYTHONPATH"
    if len(file.parts) == 1:
        return f"; give a module's name, not a file's: {file.stem}"
    if file.is_absolute() or ".." in file.parts:
        return f"; give a module's name, not a file's: {on_path}"
    dotted = ".".join(file.with_suffix("").parts)
    return f"; give a module's name, not a file's: {dotted} from the folder holding {file.parts[0]}, or {on_path}"


def import_target(path: str, key: str) -> Any:
    """The object at `path` ("package.module:name" or "package.module.name"), importable from sys.path or the
    current folder; RecipeError naming `key` and `path` otherwise. Inside `embedded_recipe`, UntrustedCode unless
    the user trusted it: checked before anything is imported."""
    check_trusted(path, key)
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise RecipeError(f"{key}={path}: write an import path as package.module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        here = str(Path.cwd())
        if here in sys.path or not isinstance(error, ModuleNotFoundError):
            raise RecipeError(f"{key}={path}: cannot import module {module_name!r} ({error}){_as_module(module_name)}"
                              ) from None  # fmt: skip
        sys.path.append(here)  # the `hasten` script does not look in the current folder; `python -m hasten` does
        return import_target(path, key)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise RecipeError(f"{key}={path}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def call_target(target: Any, args: dict[str, Any], key: str, **shape: Any) -> Any:
    """`target(**args)`, adding each of `shape` that its signature takes and `args` lacks (what the data says a model
    must take in and put out: num_classes, in_channels, image_size). What the call raises is the user's: a
    RecipeError naming `key`, the callable, and where in their code it was raised (hasten.errors.their_error)."""
    if not callable(target):
        raise RecipeError(f"{key}: {target!r} is not callable")
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass args alone
        parameters = {}
    extra = {name: value for name, value in shape.items() if name in parameters and name not in args}
    called = getattr(target, "__qualname__", None) or type(target).__name__
    try:
        return target(**args, **extra)
    except HastenError:
        raise
    except TypeError as error:
        if len(traceback.extract_tb(error.__traceback__)) == 1:  # raised by the call itself: wrong or missing arguments
            needed = [name for name, p in parameters.items() if p.default is p.empty and name not in args
                      and name not in extra and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
            where = key.split("=")[0].removesuffix(".target")  # model.target=pkg:Net -> model
            hint = f"; give it in {where}.args: {where}.args.{needed[0]}=VALUE" if needed else ""
            raise RecipeError(f"{key}: calling {called} failed: {error}{hint}") from None
        raise RecipeError(f"{key}: calling {called} raised {their_error(error)}") from None
    except Exception as error:  # noqa: BLE001 - whatever their function raises is theirs to see
        raise RecipeError(f"{key}: calling {called} raised {their_error(error)}") from None


def describe_class(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
