"""Canonical JSON (RFC 8785) for writing, and a strict parser for reading.

The reader accepts a document only if re-canonicalising what it parsed gives back the very same
bytes: one value has exactly one encoding, so a signature or digest over the bytes is a
signature over the value, and no two readers can disagree about what a document says
(duplicate keys, NaN, number spellings, lone surrogates are all refused on the way)."""

from __future__ import annotations

import json
from typing import Any

import rfc8785

from ..errors import LimitExceeded, MalformedManifest
from .limits import MAX_JSON_DEPTH, MAX_SAFE_INTEGER


class CanonicalizationError(ValueError):
    """A value JSON (RFC 8785) cannot represent: NaN, infinities, integers beyond 2**53 - 1,
    non-string keys, types outside JSON."""


def canonical_dumps(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 encoding of a JSON value."""
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalizationError(str(exc)) from exc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MalformedManifest(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise MalformedManifest(f"JSON constant {name} is not allowed")


def depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def _parse_int(text: str) -> int | float:
    # JSON numbers are doubles (RFC 8785, I-JSON): the canonical form of the double 1e20 is the
    # integer literal 100000000000000000000, so a literal beyond 2**53-1 is read as the double
    # it names. A literal that is not exactly a double then fails the canonical round trip.
    if len(text.lstrip("-")) <= 16:
        value = int(text)
        if abs(value) <= MAX_SAFE_INTEGER:
            return value
    return float(text)


def strict_loads(data: bytes, what: str) -> Any:
    """Parse canonical JSON or raise MalformedManifest naming ``what`` (head, index, ...)."""
    try:
        text = data.decode("utf-8", errors="strict")
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_int=_parse_int,
        )
    except MalformedManifest as exc:
        raise MalformedManifest(f"{what}: {exc.message}") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # CPython's json parser raises RecursionError on a nesting bomb rather than crash.
        raise MalformedManifest(f"{what}: not valid JSON ({exc})") from exc
    if depth(value) > MAX_JSON_DEPTH:
        raise LimitExceeded(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH}")
    try:
        again = canonical_dumps(value)
    except CanonicalizationError as exc:
        raise MalformedManifest(f"{what}: not representable as canonical JSON ({exc})") from exc
    if again != data:
        raise MalformedManifest(f"{what}: not in RFC 8785 canonical form")
    return value
