"""A layout that stays held: no module of the package grows past 600 lines (a module that does is split by
concept, as the recipe schema, the trainer, the probe and the command line were)."""

from __future__ import annotations

from pathlib import Path

import hasten

MAX_LINES = 600


def test_no_module_is_over_600_lines():
    package = Path(hasten.__file__).parent
    sizes = {str(path.relative_to(package)): len(path.read_text(encoding="utf-8").splitlines())
             for path in package.rglob("*.py")}  # fmt: skip
    assert len(sizes) > 50  # the whole package was read
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}
