"""Text from a restore point or a store is data, never terminal control: ``printable`` escapes
what a terminal would act on before such text is printed (spec section 24)."""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 and C1 controls, DEL, and the bidirectional overrides and isolates (which reorder what a
# terminal shows): an ESC sequence can retitle a window or clear the screen, a CR overwrite the
# line, a bidi override make "gnp.exe" look like "exe.png".
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\u202e``);
    a backslash stays as it is, so plain text is unchanged."""
    return _UNPRINTABLE.sub(_escape, text)
