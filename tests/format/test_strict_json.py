"""The strict reader of canonical JSON (spec section 10) against its definition: a document is
accepted exactly when re-serialising what it parses to gives back the very same bytes. The
reader no longer re-serialises (that cost 40 times a document's size before a limit could
refuse it), so these properties compare it with the definition, run here as the reference."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from restorepoint import LimitExceeded, MalformedManifest
from restorepoint.format import canonical_dumps, strict_loads
from restorepoint.format.limits import MAX_JSON_DEPTH, MAX_JSON_VALUES, MAX_SAFE_INTEGER

SETTINGS = settings(max_examples=300, deadline=None)


def reference(data: bytes) -> Any:
    """The definition: parse (no duplicates, no constants), then the canonical round trip.
    Raises ValueError for anything the reader must refuse."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            raise ValueError("duplicate")
        return out

    def constant(name: str) -> Any:
        raise ValueError(name)

    def integer(text: str) -> int | float:
        if len(text.lstrip("-")) <= 16 and abs(int(text)) <= MAX_SAFE_INTEGER:
            return int(text)
        return float(text)

    value = json.loads(
        data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant, parse_int=integer
    )
    if canonical_dumps(value) != data:
        raise ValueError("not canonical")
    return value


def outcome(function: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", function(data)
    except (ValueError, RecursionError):  # MalformedManifest is no ValueError
        return "refused", None
    except MalformedManifest:
        return "refused", None


# Strings that exercise every escape rule: controls, quotes, backslashes, DEL, C1, the line
# separators, characters beyond the BMP and from U+E000 on (where UTF-16 order and code point
# order part), and plain ASCII.
characters = st.sampled_from(
    [
        *("a", "Z", "0", " ", '"', "\\", "/", "\x00", "\x07", "\x08", "\t", "\n", "\x0b"),
        *("\x0c", "\r", "\x1b", "\x1f", "\x7f", "\x85", "\u2028", "\u00e9", "\ue000", "\uffff"),
        "\U0001f600",
    ]
)
strings = st.lists(characters, max_size=6).map("".join)
numbers = (
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 1e20, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 0.1])
)
scalars = st.none() | st.booleans() | numbers | strings
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(strings, inner, max_size=4),
    max_leaves=20,
)

# What a hostile writer changes in a canonical document: one byte, or a spelling that parses
# to the same value.
respellings = [
    (b",", b", "),
    (b":", b": "),
    (b"{", b"{ "),
    (b"1", b"1.0"),
    (b"1", b"1e0"),
    (b"0", b"-0"),
    (b"\\n", b"\\u000a"),
    (b"\\u001b", b"\\u001B"),
    (b"/", b"\\/"),
    (b'"a"', b'"\\u0061"'),
    (b"\xc3\xa9", b"\\u00e9"),
    (b"\xf0\x9f\x98\x80", b"\\ud83d\\ude00"),
    (b"}", b"}\n"),
    (b"true", b"True"),
    (b"null", b"NaN"),
]


@SETTINGS
@given(value=values)
def test_every_canonical_document_is_read_back(value: Any) -> None:
    data = canonical_dumps(value)
    assert strict_loads(data, "doc") == reference(data) == value


@SETTINGS
@given(value=values, where=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_a_changed_byte_is_refused_exactly_when_the_definition_refuses_it(
    value: Any, where: int, byte: int
) -> None:
    data = bytearray(canonical_dumps(value))
    data[where % len(data)] = byte
    assert outcome(lambda d: strict_loads(d, "doc"), bytes(data)) == outcome(reference, bytes(data))


@SETTINGS
@given(value=values, respelling=st.sampled_from(respellings), nth=st.integers(0, 5))
def test_a_respelling_is_refused_exactly_when_the_definition_refuses_it(
    value: Any, respelling: tuple[bytes, bytes], nth: int
) -> None:
    data = canonical_dumps(value)
    old, new = respelling
    positions = [i for i in range(len(data)) if data.startswith(old, i)]
    if positions:
        at = positions[nth % len(positions)]
        data = data[:at] + new + data[at + len(old) :]
    assert outcome(lambda d: strict_loads(d, "doc"), data) == outcome(reference, data)


@pytest.mark.parametrize(
    "data",
    [
        b"[-0]",
        b"[0]",
        b"[-0.0]",
        b'{"a":1.0}',
        b"[1e3]",
        b"[1000]",
        b"[100000000000000000000]",  # 1e20 as a double: canonical
        b"[99999999999999999999]",  # not a double's spelling
        b"[1e400]",
        b"[0.1]",
        b"[1e-7]",
        b"[1e-07]",
        b"[NaN]",
        b"[Infinity]",
        b'["\\\\/"]',
        b'["\\/"]',
        b'["/"]',
        b'["\\u0061"]',
        b'["\\u001b"]',
        b'["\\u001B"]',
        b'["\\u000a"]',
        b'["\\n"]',
        b'["\\u007f"]',
        b'["\x7f"]',
        b'["\xc2\x85"]',
        b'["\\u2028"]',
        b'["\xe2\x80\xa8"]',
        b'["\\ud800"]',
        b'["\\ud83d\\ude00"]',
        b'["\xf0\x9f\x98\x80"]',
        b'["\xed\xa0\x80"]',  # an encoded surrogate: not UTF-8
        b'["\xff"]',
        b'\xef\xbb\xbf{"a":1}',  # a byte order mark
        b'{"a":1,"a":1}',
        b'{"b":1,"a":2}',
        b'{"a":1,"b":2}',
        b"[1 ]",
        b"[1]\n",
        b" [1]",
        b'["a b"]',
        b'["tab\\there"]',
        b'["tab\there"]',
        b"[",
        b"]",
        b'"',
        b'"\\"',
        b"",
        b"[1,]",
        b"[01]",
        b"[true,false,null]",
        b"[True]",
        b'{"":0}',
        b'[[],{},""]',
    ],
)
def test_hostile_spellings_are_judged_as_the_definition_judges_them(data: bytes) -> None:
    assert outcome(lambda d: strict_loads(d, "doc"), data) == outcome(reference, data)


@pytest.mark.parametrize(
    ("names", "ordered"),
    [
        (["a", "b"], True),
        (["b", "a"], False),
        (["a", "a"], False),
        # UTF-16 order: U+E000 sorts after the surrogates of U+1F600, unlike in code points
        (["\U0001f600", "\ue000"], True),
        (["\ue000", "\U0001f600"], False),
        (["z", "\u00e9"], True),
    ],
)
def test_member_order_is_utf16_order(names: list[str], ordered: bool) -> None:
    body = ",".join(json.dumps(n, ensure_ascii=False) + ":0" for n in names)
    data = ("{" + body + "}").encode()
    if ordered:
        assert list(strict_loads(data, "doc")) == names
    else:
        with pytest.raises(MalformedManifest):
            strict_loads(data, "doc")


def test_values_are_counted_exactly_before_parsing() -> None:
    # [0,...] with MAX_JSON_VALUES - 1 elements is MAX_JSON_VALUES values with the array itself
    at_limit = b"[" + b",".join([b"0"] * (MAX_JSON_VALUES - 1)) + b"]"
    assert len(strict_loads(at_limit, "doc")) == MAX_JSON_VALUES - 1
    with pytest.raises(LimitExceeded, match="JSON values"):
        strict_loads(at_limit[:-1] + b",0]", "doc")
    # empty containers, strings holding commas and brackets, member names: counted right
    doc = {"a": [], "b": {}, "c": "[,{,]", "d": [[], {}, [1, "x"]]}
    data = canonical_dumps(doc)
    assert strict_loads(data, "doc") == doc


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 400_000])
def test_depth_is_measured_before_parsing(depth: int) -> None:
    for opening, closing in ((b"[", b"]"), (b'{"a":', b"}")):
        at_limit = opening * MAX_JSON_DEPTH + b"1" + closing * MAX_JSON_DEPTH
        assert strict_loads(at_limit, "doc") is not None
        with pytest.raises(LimitExceeded, match="nested deeper"):
            strict_loads(opening * depth + b"1" + closing * depth, "doc")
    # alternating kinds nest as deep as one kind
    mixed = (b'[{"a":' * 32) + b"1" + (b"}]" * 32)
    with pytest.raises(LimitExceeded):
        strict_loads((b'[{"a":' * 33) + b"1" + (b"}]" * 33), "doc")
    assert strict_loads(mixed, "doc") is not None
