"""Text from a restore point or a store is data, never terminal control: ``printable`` escapes
what a terminal would act on before such text is printed (spec sections 23 and 24). The one
rule, for the CLI and the runtime alike."""

from __future__ import annotations

__all__ = ["plural", "printable"]


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character Python does not count as printable written as an escape
    (``\\x1b``, ``\\u202e``, ``\\U000e0001``): the C0 and C1 controls and DEL (an ESC sequence
    can retitle a window or clear the screen, a CR overwrite the line), format characters such
    as the bidirectional overrides and isolates and zero-width ones (which reorder or hide what
    a terminal shows: "gnp.exe" looks like "exe.png"), line and paragraph separators,
    unassigned code points, spaces other than " ". A backslash stays as it is, and so do
    accented and CJK letters: plain text is unchanged."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 file``, ``2 files``, ``0 files``: every count a message prints (never ``file(s)``).
    ``words`` for a plural that is not ``word`` + s."""
    return f"{n} {word if n == 1 else (words or word + 's')}"
