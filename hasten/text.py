"""Text that came from a file or folder name (a class name, a recipe's name, a path, an export's metadata), as
hasten shows it: `printable` escapes its control characters, so a name cannot colour, move, retitle or rewrite the
terminal it is printed on, nor start a line of its own. The lowest module: error messages (hasten/errors.py) and
hasten's notes (hasten/progress.py's `say`) both pass through it.
"""

from __future__ import annotations

import unicodedata

# characters that reorder the text around them on a terminal (Unicode's bidirectional controls): shown escaped,
# as control characters are, so a name cannot make what follows it read otherwise
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _control(char: str) -> bool:
    """A character that acts on a terminal instead of showing: C0 and C1 controls and DEL (ESC starts colour,
    cursor and title sequences; CR rewrites the line; LF starts another), the line and paragraph separators, a
    lone surrogate (a byte of a file name that is not UTF-8), a bidirectional control."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs") or char in BIDI_CONTROLS


def _escaped(char: str) -> str:
    """`char` as Python's repr writes it: \\n, \\r, \\t, \\xNN, \\uNNNN."""
    code = ord(char)
    return SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, keep: str = "") -> str:
    """`text`, which came from a file or folder name (a class name, a recipe's name, a path), as it may be shown:
    each control character escaped as Python's repr writes it (ESC as `\\x1b`, a newline as `\\n`), so none
    reaches the terminal; every other character, é and 日本 included, is kept as it is, and so are backslashes.
    `keep`: characters left as they are (a message's own line breaks, "\\n"). Applying it twice changes nothing."""
    if text.isprintable():  # (no control character: the common case, at once)
        return text
    return "".join(_escaped(c) if _control(c) and c not in keep else c for c in text)


def listed(items: list[str], shown: int = 4) -> str:
    """The first `shown` of `items`, comma-separated, and how many more there are."""
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")
