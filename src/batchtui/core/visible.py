"""Texts made safe for a terminal: control characters never reach it, they are shown as escapes.

A text may hold ESC, OSC, BEL or C1 controls (a hostile file, a paste): written raw, they would retitle
the terminal or worse. `literal` is the one-way form for display; `to_editable` / `from_editable` are the
reversible form the editor holds, so that what is shown is safe and what is run is the text byte for byte.
"""

from __future__ import annotations

import re
import unicodedata

# Bidirectional overrides and isolates reorder what the terminal shows around them.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def literal(text: str, width: int | None = None) -> str:
    """`text` made safe for one line of a terminal: control and format characters shown as escapes; with
    `width`, cut to at most that many terminal columns (wide characters take two, combining marks none).
    Cutting reads only as much of `text` as the width holds: a 10 MB text costs what its first line does."""
    if width is None:
        return "".join(_shown_characters(text))
    fitting, used = [], 0  # the longest start taking at most `width` columns
    for ch in _shown_characters(text):
        used += _char_columns(ch)
        if used > width:
            break
        fitting.append(ch)
    else:
        return "".join(fitting)
    kept, used = [], 0
    for ch in fitting:
        used += _char_columns(ch)
        if used > width - 1:
            break
        kept.append(ch)
    return "".join(kept) + "…"


def _shown_characters(text: str):
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            yield from repr(ch)[1:-1]
        else:
            yield ch


def _char_columns(ch: str) -> int:
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def columns(text: str) -> int:
    """How many terminal columns `text` takes: East Asian wide and full-width characters two, combining
    marks none."""
    return sum(_char_columns(ch) for ch in text)


def shown_token(token: str, width: int | None = None) -> str:
    """One token for a table cell or an axis label: whitespace visible (`␣` for a space, `\\n` for a
    newline), so ' the' and 'the' differ on screen; an empty token as `∅`."""
    return literal(token.replace(" ", "␣"), width) if token else "∅"


def literal_lines(text: str) -> str:
    """Like `literal`, keeping the line breaks (for multi-line messages)."""
    return "\n".join(literal(line) for line in text.split("\n"))


def _unsafe_in_editor(ch: str) -> bool:
    """Characters the editor shows escaped: controls (a tab stays a tab), line and paragraph separators
    (the editor would split lines on them), lone surrogates (no terminal can print them) and bidi controls."""
    if ch == "\t":
        return False
    return unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ch in _BIDI_CONTROLS


_ESCAPE = re.compile(r"\\(?:\\|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4})")


def _decoded(match: re.Match) -> str:
    """What `from_editable` makes of one escape: a backslash pair is one backslash; `\\xHH` / `\\uHHHH`
    is its character when that character is one the editor escapes (but never a line break)."""
    escape = match.group()
    if escape == "\\\\":
        return "\\"
    ch = chr(int(escape[2:], 16))
    return ch if ch != "\n" and _unsafe_in_editor(ch) else escape


def to_editable(text: str) -> str:
    """One text (no line break) as the editor shows it; `from_editable` gives it back exactly.

    A backslash is doubled only where it would otherwise read as an escape, so ordinary texts with
    backslashes look as typed.
    """
    out = []
    for i, ch in enumerate(text):
        if _unsafe_in_editor(ch):
            out.append(_escape(ch))
        elif ch == "\\" and _backslash_needs_doubling(text, i):
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out)


def _backslash_needs_doubling(text: str, i: int) -> bool:
    following = text[i + 1 : i + 2]
    if following == "\\" or (following and _unsafe_in_editor(following)):
        return True  # the next character's own escape also starts with a backslash
    match = _ESCAPE.match(text, i)
    return match is not None and _decoded(match) != match.group()


def from_editable(line: str) -> str:
    """The text an editor line stands for."""
    return _ESCAPE.sub(_decoded, line)


def packed(items: list[str], width: int, separator: str = "  ") -> list[list[int]]:
    """`items` laid out left to right in lines of at most `width` columns, `separator` between two on a
    line, an item never split (one wider than `width` gets a line of its own): each line's item indices."""
    lines: list[list[int]] = []
    used = 0
    for index, item in enumerate(items):
        size = columns(item)
        if lines and used + columns(separator) + size <= width:
            lines[-1].append(index)
            used += columns(separator) + size
        else:
            lines.append([index])
            used = size
    return lines
