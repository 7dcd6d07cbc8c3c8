"""Text from a file or folder name as hasten shows it (hasten/text.py): control characters escaped as repr writes
them, everything else kept; error messages and hasten's notes pass through it."""

from __future__ import annotations

import pytest

from hasten.errors import DataError, HastenError, RecipeError
from hasten.progress import say
from hasten.run.plan import Interrupted
from hasten.text import printable


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("plain", "plain"),
        ("café 日本 ✓ 👍", "café 日本 ✓ 👍"),  # ordinary Unicode is kept
        ("esc\x1b[31mred", "esc\\x1b[31mred"),  # a colour
        ("title\x1b]0;pwned\x07", "title\\x1b]0;pwned\\x07"),  # a terminal title (OSC, ended by BEL)
        ("new\nline", "new\\nline"),
        ("over\rwrite\ttab", "over\\rwrite\\ttab"),
        ("nul\x00del\x7fcsi\x9b", "nul\\x00del\\x7fcsi\\x9b"),  # C1 too (0x9b: CSI on some terminals)
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("evil\u202egnp.exe", "evil\\u202egnp.exe"),  # a bidirectional override
        ("caf\udce9", "caf\\udce9"),  # a lone surrogate: a byte of a name that is not UTF-8
        ("back\\slash", "back\\slash"),  # backslashes are not doubled
    ],
)
def test_printable_escapes_control_characters_only(name, shown):
    assert printable(name) == shown
    assert printable(shown) == shown  # applied twice, the same
    if "\\" not in name:  # (repr doubles a backslash; printable leaves it)
        assert printable(name) == repr(name)[1:-1]  # the escapes are repr's


def test_printable_keeps_what_it_is_told_to():
    assert printable("a\x1b\nb\r", keep="\n") == "a\\x1b\nb\\r"


def test_an_errors_message_escapes_control_characters_and_keeps_its_own_line_breaks():
    error = DataError("bad\x1b[2J.png: cannot read\n  - first\r")
    assert str(error) == "bad\\x1b[2J.png: cannot read\n  - first\\r"
    for kind in (HastenError, RecipeError):
        assert str(kind("x\x07")) == "x\\x07"
    assert str(Interrupted(15, None, "during start-up")) == "stopped by SIGTERM during start-up"


def test_say_escapes_control_characters_and_keeps_the_notes_line_breaks(capsys):
    say("run folder: runs/esc\x1b[31m\nsecond line, café")
    assert capsys.readouterr().err == "run folder: runs/esc\\x1b[31m\nsecond line, café\n"
