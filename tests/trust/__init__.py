"""Tests of signed and encrypted restore points. The helpers here do surgery on real objects:
they find and replace the regions a test attacks and fix up the footer, nothing else, so the
attack is the only change."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import restorepoint

FOOTER = struct.Struct("<QQ32sQ8s")
#: Small chunks, so that a payload of a few chunks has boundaries to attack.
CHUNK = 65536


def pack(source: Path, dest: Path, **options: Any) -> restorepoint.PackResult:
    """restorepoint.pack with the small chunks and the defaults these tests share."""
    options.setdefault("position", 7)
    options.setdefault("chunk_size", CHUNK)
    options.setdefault("threads", 2)
    options.setdefault("terms", {"torch": "2.13.0"})
    return restorepoint.pack(source, str(dest), **options)


@dataclass(frozen=True)
class Regions:
    """Where the regions of an object lie (offsets into its bytes)."""

    head_length: int
    data_start: int
    index_offset: int
    index_length: int
    signature_length: int

    @property
    def signature_start(self) -> int:
        return self.index_offset + self.index_length

    @property
    def footer_start(self) -> int:
        return self.signature_start + self.signature_length


def regions(data: bytes) -> Regions:
    (head_length,) = struct.unpack_from("<I", data, 12)
    index_offset, index_length, _, sig_length, _ = FOOTER.unpack(data[-64:])
    return Regions(head_length, 16 + head_length + 32, index_offset, index_length, sig_length)


def head_bytes(data: bytes) -> bytes:
    r = regions(data)
    return data[16 : 16 + r.head_length]


def index_bytes(data: bytes) -> bytes:
    r = regions(data)
    return data[r.index_offset : r.index_offset + r.index_length]


def signature_of(data: bytes) -> bytes:
    r = regions(data)
    return data[r.signature_start : r.footer_start]


def digests(data: bytes) -> tuple[str, str]:
    """The head's and the index's sha256, as a reader computes them (what a statement names)."""
    return (
        hashlib.sha256(head_bytes(data)).hexdigest(),
        hashlib.sha256(index_bytes(data)).hexdigest(),
    )


def with_signature(data: bytes, block: bytes) -> bytes:
    """``data`` with its signature block replaced by ``block`` (b"": unsigned)."""
    r = regions(data)
    index_offset, index_length, index_sha, _, end = FOOTER.unpack(data[-64:])
    footer = FOOTER.pack(index_offset, index_length, index_sha, len(block), end)
    return data[: r.signature_start] + block + footer


def with_head(data: bytes, head: bytes) -> bytes:
    """``data`` with a head of the same length in place of its own, the head digest
    recomputed (so that only what the head says differs)."""
    r = regions(data)
    assert len(head) == r.head_length
    return data[:16] + head + hashlib.sha256(head).digest() + data[r.data_start :]


class Bytes:
    """A RangeSource over bytes in memory."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    @property
    def size(self) -> int:
        return len(self._data)

    def read_range(self, start: int, end: int) -> bytes:
        return self._data[start:end]
