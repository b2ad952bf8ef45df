"""The reader's algorithm (spec section "Reading"). No storage of its own: it reads through a
``RangeSource`` (an object's size and byte ranges) and a sequential stream, both supplied by
the caller, and trusts nothing it has not checked.

- ``read_head``: the identity part, from a bounded prefix (at most GATE_PREFIX_MAX bytes).
- ``read_manifest``: head, footer and index, with every structural check that can be made
  without reading the payload.

The payload frames are decoded by ``decoder.PayloadDecoder``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from ..errors import (
    DigestMismatch,
    FramingError,
    LimitExceeded,
    MalformedManifest,
    NotARestorePoint,
    TrailingBytes,
    TruncatedRestorePoint,
    UnsupportedFormat,
)
from ._json import strict_loads
from .delta import chunk_lengths
from .layout import CHUNK_HEADER, DIGEST_SIZE, END_MAGIC, FOOTER, FORMAT_MAJOR, MAGIC, PREAMBLE
from .limits import GATE_PREFIX_MAX, MAX_HEAD_BYTES, MAX_INDEX_BYTES, MAX_SIGNATURE_BYTES
from .manifest import Entry, Manifest
from .references import BaseRegion, Bases

__all__ = [
    "BaseRegion",
    "Bases",
    "ChunkCipher",
    "Head",
    "Prefix",
    "RangeSource",
    "Tail",
    "parse_head",
    "parse_index",
    "read_head",
    "read_index",
    "read_manifest",
    "read_prefix",
    "read_tail",
]

#: First read of an object: most heads are a few KiB, so one request usually suffices.
FIRST_READ = 64 << 10
#: Last read of an object: footer and, for most restore points, the whole index.
TAIL_READ = 256 << 10


class ChunkCipher(Protocol):
    """Seals and opens the stored bytes of one chunk (restorepoint.trust implements it): the
    entry's path, size, position and the entry count, the chunk's index and whether it is the
    last are all bound to it."""

    overhead: int

    def seal(  # noqa: PLR0913, PLR0917 - the AEAD's parameters, as trust.encryption takes them
        self, path: str, size: int, entry: int, entries: int, index: int, last: bool, data: bytes
    ) -> bytes: ...

    def open(  # noqa: PLR0913, PLR0917 - the AEAD's parameters, as trust.encryption takes them
        self, path: str, size: int, entry: int, entries: int, index: int, last: bool, data: bytes
    ) -> bytes: ...


class RangeSource(Protocol):
    """An object's size and byte ranges; ``read_range`` returns ``data[start:end]``."""

    @property
    def size(self) -> int: ...

    def read_range(self, start: int, end: int) -> bytes: ...


@dataclass(frozen=True)
class Head:
    """What the bounded prefix says: the head-only manifest and where the payload starts."""

    manifest: Manifest
    head_sha256: str
    data_start: int
    major: int
    minor: int


@dataclass(frozen=True)
class Prefix:
    """The bounded prefix, framing and digest checked, not yet parsed."""

    head_bytes: bytes
    head_sha256: str
    data_start: int
    major: int
    minor: int


@dataclass(frozen=True)
class Tail:
    """The footer and the signature block, framing checked; the index not yet read."""

    index_offset: int
    index_length: int
    index_sha256: str
    signature: bytes | None
    tail: bytes
    tail_start: int


def read_prefix(source: RangeSource) -> Prefix:
    """Reader steps R1-R3: preamble, head, head digest. Reads at most GATE_PREFIX_MAX bytes
    from the start of the object, and parses nothing of the head."""
    size = source.size
    first = source.read_range(0, min(size, FIRST_READ))
    if len(first) < len(MAGIC) or first[: len(MAGIC)] != MAGIC:
        if len(first) < len(MAGIC) and MAGIC.startswith(first):
            raise TruncatedRestorePoint(
                f"the object ends at byte {size}, inside the magic", offset=size
            )
        raise NotARestorePoint("not a restore point (wrong magic)", offset=0)
    if len(first) < PREAMBLE.size:
        raise TruncatedRestorePoint(
            f"the object ends at byte {size}, inside the preamble", offset=size
        )
    _, major, minor, head_length = PREAMBLE.unpack_from(first)
    if major != FORMAT_MAJOR:
        raise UnsupportedFormat(
            f"format version {major}.{minor} is not supported (this reader reads {FORMAT_MAJOR}.x)",
            expected=FORMAT_MAJOR,
            found=major,
        )
    if head_length == 0 or head_length > MAX_HEAD_BYTES:
        raise LimitExceeded(f"head length {head_length} is outside 1..{MAX_HEAD_BYTES}", offset=12)
    data_start = PREAMBLE.size + head_length + DIGEST_SIZE
    assert data_start <= GATE_PREFIX_MAX
    if data_start > size:
        raise TruncatedRestorePoint(
            f"the object ends at byte {size}, inside the "
            f"{'head' if size < PREAMBLE.size + head_length else 'head digest'}"
            f" (which ends at {data_start})",
            offset=size,
        )
    prefix = (
        first if len(first) >= data_start else first + source.read_range(len(first), data_start)
    )
    if len(prefix) < data_start:
        raise TruncatedRestorePoint(
            f"the object ends at byte {len(prefix)}, inside the head", offset=len(prefix)
        )
    head_bytes = prefix[PREAMBLE.size : PREAMBLE.size + head_length]
    recorded = prefix[PREAMBLE.size + head_length : data_start]
    digest = hashlib.sha256(head_bytes).digest()
    if digest != recorded:
        raise DigestMismatch(
            "head digest differs",
            member="(head)",
            expected=recorded.hex(),
            found=digest.hex(),
            offset=PREAMBLE.size + head_length,
        )
    return Prefix(head_bytes, digest.hex(), data_start, major, minor)


def parse_head(prefix: Prefix) -> Head:
    """Reader step R4: the head document, strictly parsed and validated."""
    manifest = Manifest.from_head_dict(strict_loads(prefix.head_bytes, "head"))
    if manifest.format_version != f"{prefix.major}.{prefix.minor}":
        raise MalformedManifest(
            f"head says format {manifest.format_version}, "
            f"the preamble {prefix.major}.{prefix.minor}"
        )
    return Head(manifest, prefix.head_sha256, prefix.data_start, prefix.major, prefix.minor)


def read_head(source: RangeSource) -> Head:
    """Reader steps R1-R4: the identity part, from at most GATE_PREFIX_MAX leading bytes."""
    return parse_head(read_prefix(source))


def read_tail(source: RangeSource, data_start: int) -> Tail:
    """Reader steps R5-R6: the footer (which must end the object) and the signature block
    before it. Reads the last TAIL_READ bytes (more only for a larger signature block); the
    index is not read yet."""
    size = source.size
    if size < data_start + FOOTER.size:
        raise TruncatedRestorePoint(
            f"the object ends at byte {size}, before a footer could start", offset=size
        )
    tail_start = max(data_start, size - TAIL_READ)
    tail = source.read_range(tail_start, size)
    if len(tail) != size - tail_start:
        raise TruncatedRestorePoint("the object is shorter than its reported size", offset=size)
    index_offset, index_length, index_sha, sig_length, end = FOOTER.unpack(tail[-FOOTER.size :])
    if end != END_MAGIC:
        _no_footer(tail, tail_start, size, data_start)
    footer_start = size - FOOTER.size
    if index_length > MAX_INDEX_BYTES:
        raise LimitExceeded(
            f"index length {index_length} exceeds {MAX_INDEX_BYTES}", offset=footer_start + 8
        )
    if sig_length > MAX_SIGNATURE_BYTES:
        raise LimitExceeded(
            f"signature block length {sig_length} exceeds {MAX_SIGNATURE_BYTES}",
            offset=footer_start + 48,
        )
    if index_offset < data_start or index_offset + index_length + sig_length != footer_start:
        raise FramingError(
            f"footer places the index at {index_offset}+{index_length} and "
            f"{sig_length} signature bytes before the footer at {footer_start}",
            offset=footer_start,
        )
    signature = None
    if sig_length:
        sig_start = footer_start - sig_length
        if sig_start >= tail_start:
            signature = tail[sig_start - tail_start : footer_start - tail_start]
        else:
            signature = source.read_range(sig_start, footer_start)
            if len(signature) != sig_length:
                raise TruncatedRestorePoint("the object ends inside the signatures", offset=size)
    return Tail(index_offset, index_length, index_sha.hex(), signature, tail, tail_start)


def read_index(source: RangeSource, tail: Tail) -> bytes:
    """Reader step R7: the index bytes, checked against the footer's digest."""
    start, end = tail.index_offset, tail.index_offset + tail.index_length
    if start >= tail.tail_start:
        index_bytes = tail.tail[start - tail.tail_start : end - tail.tail_start]
    else:
        index_bytes = source.read_range(start, end)
        if len(index_bytes) != tail.index_length:
            raise TruncatedRestorePoint("the object ends inside the index", offset=source.size)
    digest = hashlib.sha256(index_bytes).hexdigest()
    if digest != tail.index_sha256:
        raise DigestMismatch(
            "index digest differs",
            member="(index)",
            expected=tail.index_sha256,
            found=digest,
            offset=start,
        )
    return index_bytes


def parse_index(head: Head, tail: Tail, index_bytes: bytes) -> Manifest:
    """Reader step R8: the index document against its head, and the layout checks (offsets
    contiguous, stored sizes within the codec's bounds)."""
    manifest = head.manifest.payload_from_index_dict(
        strict_loads(index_bytes, "index"), head.head_sha256
    )
    _check_layout(manifest, head.data_start, tail.index_offset)
    return manifest


def read_manifest(source: RangeSource, head: Head | None = None) -> tuple[Head, Manifest]:
    """Reader steps R1-R8: head, footer, signatures' framing, index, layout. Reads no payload
    byte. (Callers that check signatures run read_prefix, read_tail and read_index themselves,
    and parse only after the check.)"""
    head = head or read_head(source)
    tail = read_tail(source, head.data_start)
    return head, parse_index(head, tail, read_index(source, tail))


def _no_footer(tail: bytes, tail_start: int, size: int, data_start: int) -> None:
    """No footer at the very end: either the object is cut short, or something was appended
    after a complete restore point. The second is told apart by a consistent footer earlier."""
    pos = tail.rfind(END_MAGIC)
    while pos != -1:
        end = tail_start + pos + len(END_MAGIC)
        start = end - FOOTER.size
        if start >= tail_start and start >= data_start:
            index_offset, index_length, _, sig_length, _ = FOOTER.unpack(
                tail[pos + 8 - FOOTER.size : pos + 8]
            )
            if index_offset + index_length + sig_length == start:
                raise TrailingBytes(
                    f"{size - end} bytes follow the footer that ends at byte {end}", offset=end
                )
        pos = tail.rfind(END_MAGIC, 0, pos)
    raise TruncatedRestorePoint(
        f"no footer at the end of the object (byte {size}): truncated or still being written",
        offset=size,
    )


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def _check_layout(manifest: Manifest, data_start: int, index_offset: int) -> None:
    expected_offset = data_start
    assert manifest.payload is not None
    overhead = manifest.chunk_overhead
    for entry in manifest.payload:
        if entry.offset != expected_offset:
            raise FramingError(
                f"stored bytes start at {entry.offset}, expected {expected_offset}",
                member=entry.path,
                expected=expected_offset,
                found=entry.offset,
            )
        if entry.delta is not None:
            _check_delta_layout(entry, manifest.chunk_size)
            expected_offset += entry.stored_size
            continue
        n = chunk_count(entry.size, manifest.chunk_size)
        last = entry.size - (n - 1) * manifest.chunk_size if n else 0
        lowest = n * CHUNK_HEADER.size
        highest = lowest
        if n:
            highest += (n - 1) * (entry.codec.max_stored(manifest.chunk_size) + overhead)
            highest += entry.codec.max_stored(last) + overhead
        if not lowest <= entry.stored_size <= highest:
            raise FramingError(
                f"stored size {entry.stored_size} is impossible for {entry.size} bytes "
                f"in {n} chunks with codec {entry.codec.name}",
                member=entry.path,
            )
        expected_offset += entry.stored_size
    if expected_offset != index_offset:
        raise FramingError(
            f"payload ends at {expected_offset}, but the index starts at {index_offset}",
            expected=index_offset,
            found=expected_offset,
        )


def _check_delta_layout(entry: Entry, chunk_size: int) -> None:
    """R8 for a ``delta/1`` entry (section 28): every frame length within the codec's bound,
    each reference's length exactly that of its frames, and the stored size exactly that of
    the frames not referenced."""
    delta = entry.delta
    assert delta is not None
    lengths = chunk_lengths(entry.size, chunk_size, delta.cuts)
    referenced = [False] * len(lengths)
    for ref in delta.refs:
        total = 0
        for i in range(ref.first, ref.first + ref.count):
            referenced[i] = True
            total += CHUNK_HEADER.size + delta.frame_length(i)
        if total != ref.length:
            raise FramingError(
                f"reference to chunks {ref.first}..{ref.first + ref.count - 1} is "
                f"{ref.length} bytes long; their frames are {total}",
                member=entry.path,
            )
    stored = 0
    for i, plain in enumerate(lengths):
        length = delta.frame_length(i)
        if length > entry.codec.max_stored(plain):
            raise FramingError(
                f"chunk {i} declares {length} stored bytes, more than possible",
                member=entry.path,
            )
        if not referenced[i]:
            stored += CHUNK_HEADER.size + length
    if stored != entry.stored_size:
        raise FramingError(
            f"stored size {entry.stored_size} differs from that of the frames stored here "
            f"({stored})",
            member=entry.path,
        )
