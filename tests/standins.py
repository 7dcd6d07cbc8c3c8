"""Stand-ins keep the signature of what they stand in for.

A test that replaces one of hasten's functions (`monkeypatch.setattr(autotune, "probe", fake)`) is checked when it
installs the stand-in, on every machine, not when a line that only some machines reach calls it: the stand-in must
accept every parameter of the real function (by name, or through *args/**kwargs) and require none the real one does
not have. A changed signature then fails the tests that replace it everywhere, at once (tests/conftest.py wraps
pytest's `monkeypatch` with this check).
"""

from __future__ import annotations

import inspect
import pkgutil
from typing import Any

import pytest

OWN = ("hasten.", "benchmarks.")  # whose functions are checked: the project's own


def _signature(function: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def mismatch(real: Any, stand_in: Any) -> str | None:
    """Why `stand_in` cannot take the calls `real` takes (None: it can)."""
    real_sig, fake_sig = _signature(real), _signature(stand_in)
    if real_sig is None or fake_sig is None:
        return None
    fake = fake_sig.parameters
    kinds = {p.kind for p in fake.values()}
    var_args, var_kwargs = inspect.Parameter.VAR_POSITIONAL in kinds, inspect.Parameter.VAR_KEYWORD in kinds
    for name, param in real_sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name in fake:
            continue
        by_keyword = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
        if (by_keyword and var_kwargs) or (param.kind == param.POSITIONAL_ONLY and var_args):
            continue
        return f"it has no parameter {name!r}"
    for name, param in fake.items():
        required = param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        if required and name not in real_sig.parameters:
            return f"it requires {name!r}, which the real one does not take"
    return None


def check(real: Any, stand_in: Any, where: str) -> None:
    """A TypeError when `stand_in` replaces one of the project's functions `real` without its signature."""
    if not (inspect.isfunction(real) and str(getattr(real, "__module__", "")).startswith(OWN)):
        return
    if not callable(stand_in) or stand_in is real:
        return
    why = mismatch(real, stand_in)
    if why:
        raise TypeError(
            f"stand-in for {real.__module__}.{real.__qualname__} ({where}) does not take its signature "
            f"{inspect.signature(real)}: {why}"
        )


NOTSET = pytest.MonkeyPatch.setattr.__defaults__[0]  # pytest's marker for "no value given"


class SignatureCheckingMonkeyPatch(pytest.MonkeyPatch):
    """pytest's MonkeyPatch whose setattr refuses a stand-in without the signature of the function it replaces."""

    def setattr(self, target: Any, name: Any, value: Any = NOTSET, raising: bool = True) -> None:
        if isinstance(target, str) and value is NOTSET:
            old = pkgutil.resolve_name(target) if "." in target else None
            where, new = target, name
        else:
            old = getattr(target, name, None) if isinstance(name, str) else None
            where, new = f"{getattr(target, '__name__', type(target).__name__)}.{name}", value
        check(old, new, where)
        return super().setattr(target, name, value, raising=raising)
