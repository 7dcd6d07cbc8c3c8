"""The order a benchmark runs its variants in: every variant once per repeat, the order rotated by one place each
repeat, so drift of a shared machine (clock speeds, other load, a warming cache) falls on every variant alike and
none always runs first or last (the airbench discipline, docs/DESIGN.md "Tests and benchmarks")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], repeat: int) -> list[T]:
    """`items` in the order repeat number `repeat` (0, 1, ...) runs them: rotated left by `repeat` places."""
    if not items:
        return []
    turn = repeat % len(items)
    return [*items[turn:], *items[:turn]]
