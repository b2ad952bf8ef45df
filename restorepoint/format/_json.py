"""Canonical JSON (RFC 8785) for writing, and a strict parser for reading.

The reader accepts a document only if it is the canonical serialisation of what it parses to:
one value has exactly one encoding, so a signature or digest over the bytes is a signature over
the value, and no two readers can disagree about what a document says (duplicate keys, NaN,
number spellings, lone surrogates are all refused on the way). The limits on values and depth
are checked on the bytes, before anything is allocated for them."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import rfc8785

from ..errors import LimitExceeded, MalformedManifest
from .limits import MAX_JSON_DEPTH, MAX_JSON_VALUES, MAX_SAFE_INTEGER


class CanonicalizationError(ValueError):
    """A value JSON (RFC 8785) cannot represent: NaN, infinities, integers beyond 2**53 - 1,
    non-string keys, types outside JSON."""


def canonical_dumps(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 encoding of a JSON value."""
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalizationError(str(exc)) from exc


# -- the strict reader -----------------------------------------------------------------------
#
# Canonical JSON has no white space and exactly one spelling of every string, so the bytes can
# be checked and measured before anything is built: strings are found (and each checked to be
# in canonical form) by one regular expression, and the structure between them is counted with
# bytes.count. Only a document within the limits reaches json.loads,
# whose hooks check what remains of canonical form: member order and number spellings. This
# replaces parsing everything and then re-serialising it in Python (rfc8785) to compare: that
# cost about 40 times the document's size in memory, and a third of a second a MB, before a
# limit could refuse it.

#: A string in canonical form: UTF-8 (checked when decoded) except '"', '\\' and the C0
#: controls, which are escaped, \b \f \n \r \t where they exist and \u00XX (lowercase hex)
#: for the others; no other escape. The unrolled loop backtracks over nothing.
_STRING = re.compile(
    rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f]))[^"\\\x00-\x1f]*)*"'
)
#: What stands for a string in the structure left between strings: not a bracket, comma,
#: quote or white space, so that "[" STRING "]" still shows a non-empty array.
_PLACEHOLDER = b"0"
#: Strings per block of that structure: bounds what is held at once (re.subn would hold about
#: 180 bytes for every string of the document).
_BLOCK = 1 << 16
#: A stretch between two strings this long is counted by itself, never copied into a block.
_BIG_GAP = 1 << 16
#: The structure's brackets, "{" and "}" counted as "[" and "]": enough for the depth.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SPACE = (b" ", b"\t", b"\n", b"\r")


class _NotCanonical(Exception):
    """Raised by the parse hooks: turned into MalformedManifest naming the document."""


def _structure(gaps: list[bytes], what: str) -> tuple[int, int, bytes]:
    """What lies between strings: the values it opens or separates, the object members it
    separates from their values, and its brackets."""
    block = _PLACEHOLDER.join(gaps)
    if b'"' in block or b"\\" in block:
        raise MalformedManifest(f"{what}: a string not in RFC 8785 canonical form (or not JSON)")
    if any(space in block for space in _SPACE):
        raise MalformedManifest(f"{what}: white space outside strings: not in canonical form")
    # With no white space and no strings, every value but the first follows a "," or opens
    # a non-empty container: the exact count for any canonical document.
    values = (
        block.count(b",")
        + block.count(b"[")
        + block.count(b"{")
        - block.count(b"[]")
        - block.count(b"{}")
    )
    return values, block.count(b":"), block.translate(_BRACKETS, _NOT_BRACKETS)


def _measure(data: bytes, what: str) -> int:
    """Refuse, from the bytes alone, a document that is not canonical in its strings or white
    space, holds more than MAX_JSON_VALUES values, or nests deeper than MAX_JSON_DEPTH. Returns
    the number of object members in it."""
    values = 1
    members = 0
    brackets: list[bytes] = []
    gaps: list[bytes] = []

    def count(block: list[bytes]) -> None:
        nonlocal values, members
        counted, separated, nesting = _structure(block, what)
        values += counted
        members += separated
        if values > MAX_JSON_VALUES:
            raise LimitExceeded(f"{what}: more than {MAX_JSON_VALUES} JSON values")
        brackets.append(nesting)

    previous = 0
    for match in _STRING.finditer(data):
        gap = data[previous : match.start()]
        previous = match.end()
        if len(gap) > _BIG_GAP:
            count(gaps)  # what came before, then this one alone: joined, it would be copied
            gaps = [gap]
        else:
            gaps.append(gap)
        if len(gaps) >= _BLOCK or len(gap) > _BIG_GAP:
            count(gaps)
            gaps = []
    count(gaps)
    count([data[previous:]])
    # Each pass removes the innermost pairs (replace does not look again at what its own
    # removals join), so the passes count the nesting depth: at most MAX_JSON_DEPTH + 1 of
    # them, over the brackets alone (at most two for each value counted).
    nesting = b"".join(brackets)
    level = 0
    while nesting:
        shorter = nesting.replace(b"[]", b"")
        if len(shorter) == len(nesting):
            break  # unbalanced: not JSON, which the parser will say
        level += 1
        if level > MAX_JSON_DEPTH:
            raise LimitExceeded(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH}")
        nesting = shorter
    return members


def _canonical_float(value: float, text: str) -> float:
    try:
        spelled = canonical_dumps(value).decode("ascii")
    except CanonicalizationError as exc:
        raise _NotCanonical(f"the number {text[:40]} is not representable ({exc})") from exc
    if spelled != text:
        raise _NotCanonical(f"the number {text[:40]} is not spelled canonically ({spelled[:40]})")
    return value


def _parse_int(text: str) -> int | float:
    # JSON numbers are doubles (RFC 8785, I-JSON): the canonical form of the double 1e20 is the
    # integer literal 100000000000000000000, so a literal beyond 2**53-1 is read as the double
    # it names, and refused unless it is that double's canonical spelling.
    if len(text.lstrip("-")) <= 16:
        value = int(text)
        if abs(value) <= MAX_SAFE_INTEGER:
            if text == "-0":  # the one other spelling of an integer JSON allows
                raise _NotCanonical("the number -0 is not spelled canonically (0)")
            return value
    return _canonical_float(float(text), text)


def _parse_float(text: str) -> float:
    return _canonical_float(float(text), text)


def _in_order(obj: dict[str, Any]) -> dict[str, Any]:
    """Members in RFC 8785 order (by UTF-16 code units), strictly. A duplicate member has left
    the object one member short, which strict_loads sees in the total."""
    for before, after in itertools.pairwise(obj):
        if before.isascii() and after.isascii():
            ordered = before < after
        else:
            # Code point order differs from UTF-16 order only where characters beyond the
            # BMP meet ones from U+E000 on.
            ordered = before.encode("utf-16-be") < after.encode("utf-16-be")
        if not ordered:
            raise _NotCanonical(f"members out of order at {after!a}")
    return obj


def _no_constant(name: str) -> Any:
    raise _NotCanonical(f"JSON constant {name} is not allowed")


def strict_loads(data: bytes, what: str) -> Any:
    """Parse canonical JSON or raise MalformedManifest naming ``what`` (head, index, ...).

    The limits are checked on the bytes before anything is parsed (LimitExceeded): at most
    MAX_JSON_VALUES values and MAX_JSON_DEPTH levels. Peak memory is then a small multiple of
    the document's size, and time about what reading it takes."""
    members = _measure(data, what)
    parsed = 0

    def in_order(obj: dict[str, Any]) -> dict[str, Any]:
        # An object hook rather than a pairs hook: no list of pairs beside every object.
        nonlocal parsed
        parsed += len(obj)
        return _in_order(obj)

    try:
        text = data.decode("utf-8", errors="strict")
        value = json.loads(
            text,
            object_hook=in_order,
            parse_constant=_no_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
        if parsed != members:
            raise _NotCanonical("a duplicate member name")
        return value
    except _NotCanonical as exc:
        raise MalformedManifest(f"{what}: not in RFC 8785 canonical form: {exc}") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedManifest(f"{what}: not valid JSON ({exc})") from exc
