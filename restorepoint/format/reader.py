"""The reader's algorithm (spec section "Reading"). No storage of its own: it reads through a
``RangeSource`` (an object's size and byte ranges) and a sequential stream, both supplied by
the caller, and trusts nothing it has not checked.

- ``read_head``: the identity part, from a bounded prefix (at most GATE_PREFIX_MAX bytes).
- ``read_manifest``: head, footer and index, with every structural check that can be made
  without reading the payload.
- ``PayloadDecoder``: the payload frames, decoded and hashed on a thread pool, every file's
  sha256 checked in order.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from ..errors import (
    DecryptionError,
    DigestMismatch,
    FramingError,
    LimitExceeded,
    MalformedManifest,
    NotARestorePoint,
    RestorePointError,
    TrailingBytes,
    TruncatedRestorePoint,
    UnsupportedFormat,
)
from ._json import strict_loads
from ._pipeline import Budget, HashLane, Ticket
from .codecs import Decoded
from .delta import chunk_lengths
from .layout import CHUNK_HEADER, DIGEST_SIZE, END_MAGIC, FOOTER, FORMAT_MAJOR, MAGIC, PREAMBLE
from .limits import GATE_PREFIX_MAX, MAX_HEAD_BYTES, MAX_INDEX_BYTES, MAX_SIGNATURE_BYTES
from .manifest import Entry, Manifest
from .references import BaseFrames, BaseRegion, Bases

__all__ = [
    "BaseRegion",
    "Bases",
    "ChunkCipher",
    "Head",
    "PayloadDecoder",
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


class PayloadDecoder:
    """Decode the payload frames of a checked manifest from a sequential stream that starts at
    the first entry's offset. ``events()`` yields ``(entry, plain_chunk)`` for each chunk, in
    order (bytes, or a read-only memoryview), and ``(entry, None)`` once an entry's sha256 has
    been checked. Opening, decoding and hashing run on a pool of ``threads`` (each file's chunks
    hashed in order, files side by side); at most ``2 * threads`` chunks' worth of plain bytes
    are in flight. ``held``: the caller keeps the chunks it is given."""

    def __init__(  # noqa: PLR0913 - the stream, and how to read it (threads, key, bases, held)
        self,
        manifest: Manifest,
        stream: BinaryIO,
        *,
        threads: int = 2,
        cipher: ChunkCipher | None = None,
        bases: Bases | None = None,
        held: bool = False,
    ) -> None:
        assert manifest.payload is not None
        self._frames = BaseFrames(manifest, bases)
        #: The caller keeps every chunk (an import in memory): the codec gives each memory of
        #: its own (``PlanesCodec.decode``).
        self.held = held
        if manifest.encryption is not None and cipher is None:
            raise DecryptionError("the payload is encrypted: a key is needed to read it")
        self.cipher = cipher
        self.manifest = manifest
        self.stream = stream
        self.threads = max(1, threads)
        self.position = manifest.payload[0].offset if manifest.payload else 0
        self._failed = False

    def _read(self, n: int, entry: Entry) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise TruncatedRestorePoint(
                f"the object ends inside the stored bytes (at byte {self.position + len(data)})",
                member=entry.path,
                offset=self.position + len(data),
            )
        self.position += n
        return data

    def _check(self) -> None:
        if self._failed:
            raise RuntimeError("the payload decoder stopped")

    def events(self) -> Iterator[tuple[Entry, Decoded | None]]:
        assert self.manifest.payload is not None
        chunk_size = self.manifest.chunk_size
        overhead = self.manifest.chunk_overhead
        entries = len(self.manifest.payload)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rp-decode")
        budget = Budget(2 * self.threads * chunk_size, 32 * self.threads)
        inflight: deque[_InFlight] = deque()
        try:
            for position, entry in enumerate(self.manifest.payload):
                if entry.delta is not None:
                    yield from self._delta_entry(entry, pool, budget, inflight)
                    continue
                n = chunk_count(entry.size, chunk_size)
                lane = HashLane(n)
                left_plain = entry.size
                left_stored = entry.stored_size
                for i in range(n):
                    plain = min(chunk_size, left_plain)
                    left_plain -= plain
                    header = self._read(CHUNK_HEADER.size, entry)
                    (stored_len,) = CHUNK_HEADER.unpack(header)
                    left_stored -= CHUNK_HEADER.size
                    reserve = (n - 1 - i) * CHUNK_HEADER.size
                    if (
                        stored_len > entry.codec.max_stored(plain) + overhead
                        or stored_len > left_stored - reserve
                    ):
                        raise FramingError(
                            f"chunk {i} declares {stored_len} stored bytes, more than possible",
                            member=entry.path,
                            offset=self.position - CHUNK_HEADER.size,
                        )
                    # Room for the plain bytes before the stored ones are read: settle the
                    # oldest chunks (which frees their room once hashed) until there is.
                    while inflight and not budget.has_room(plain):
                        yield from self._settle(inflight.popleft())
                    ticket = budget.acquire(plain, self._check)
                    stored = self._read(stored_len, entry)
                    left_stored -= stored_len
                    task = pool.submit(
                        self._decode, entry, lane, position, entries, i, n, stored, plain, ticket
                    )
                    inflight.append(_InFlight(entry, lane, task, i, ticket))
                if left_stored != 0:
                    raise FramingError(
                        f"chunk frames use {entry.stored_size - left_stored} of "
                        f"{entry.stored_size} stored bytes",
                        member=entry.path,
                    )
                inflight.append(_InFlight(entry, lane, None, n, None))
            while inflight:
                yield from self._settle(inflight.popleft())
        finally:
            self._failed = True
            pool.shutdown(wait=True, cancel_futures=True)

    def _delta_entry(
        self,
        entry: Entry,
        pool: ThreadPoolExecutor,
        budget: Budget,
        inflight: deque[_InFlight],
    ) -> Iterator[tuple[Entry, Decoded | None]]:
        """A ``delta/1`` entry (section 28, R9a): each chunk's frame from this object's stream
        or, referenced, from its base; each frame exactly the length the index records; each
        chunk checked against its own sha256 as well as the file's."""
        delta = entry.delta
        assert delta is not None
        lengths = chunk_lengths(entry.size, self.manifest.chunk_size, delta.cuts)
        referenced = delta.referenced()
        lane = HashLane(len(lengths))
        for i, plain in enumerate(lengths):
            length = delta.frame_length(i)
            while inflight and not budget.has_room(plain):
                yield from self._settle(inflight.popleft())
            ticket = budget.acquire(plain, self._check)
            if i in referenced:
                ref, at = referenced[i]
                stored = self._frames.frame(entry, ref, i, at)
            else:
                (found,) = CHUNK_HEADER.unpack(self._read(CHUNK_HEADER.size, entry))
                if found != length:
                    raise FramingError(
                        f"chunk {i} declares {found} stored bytes, the index {length}",
                        member=entry.path,
                        offset=self.position - CHUNK_HEADER.size,
                    )
                stored = self._read(length, entry)
            task = pool.submit(self._decode_chunk, entry, lane, i, stored, plain, ticket)
            inflight.append(_InFlight(entry, lane, task, i, ticket))
        inflight.append(_InFlight(entry, lane, None, len(lengths), None))

    def _decode_chunk(  # noqa: PLR0913, PLR0917 - the state of one chunk in flight
        self, entry: Entry, lane: HashLane, index: int, stored: bytes, plain: int, ticket: Ticket
    ) -> Decoded:
        """On a pool thread: decode a ``delta/1`` chunk, check its own sha256, then feed it
        to its file's."""
        assert entry.delta is not None
        data = entry.codec.decode(stored, plain, held=self.held)
        found = hashlib.sha256(data).hexdigest()
        expected = entry.delta.chunk_sha256(index)
        if found != expected:
            where = ""
            for ref in entry.delta.refs:
                if ref.first <= index < ref.first + ref.count:
                    assert self.manifest.bases is not None
                    where = f" (from base {self.manifest.bases[ref.base].name})"
            raise DigestMismatch(f"digest differs{where}", expected=expected, found=found)
        lane.feed(index, data, ticket)
        return data

    def _decode(  # noqa: PLR0913, PLR0917 - the state of one chunk in flight, from the hot loop
        self,
        entry: Entry,
        lane: HashLane,
        position: int,
        entries: int,
        index: int,
        count: int,
        stored: bytes,
        plain: int,
        ticket: Ticket,
    ) -> Decoded:
        """On a pool thread: open and decode one chunk, then feed it to its file's sha256."""
        if self.cipher is not None:
            stored = self.cipher.open(
                entry.path, entry.size, position, entries, index, index == count - 1, stored
            )
        data = entry.codec.decode(stored, plain, held=self.held)
        lane.feed(index, data, ticket)
        return data

    def _settle(self, item: _InFlight) -> Iterator[tuple[Entry, Decoded | None]]:
        entry = item.entry
        if item.future is None:
            found = item.lane.hexdigest(self._check)
            if found != entry.sha256:
                raise DigestMismatch(
                    f"payload digest differs (expected {entry.sha256[:16]}..., "
                    f"found {found[:16]}...)",
                    member=entry.path,
                    expected=entry.sha256,
                    found=found,
                )
            yield entry, None
            return
        try:
            plain = item.future.result()
        except RestorePointError as exc:
            if exc.member is None:
                exc.member = entry.path
                exc.message = f"chunk {item.index}: {exc.message}"
            raise
        assert item.ticket is not None
        item.ticket.done()
        yield entry, plain


@dataclass(frozen=True)
class _InFlight:
    """A chunk submitted to the pool (or, with no future, the end of its entry)."""

    entry: Entry
    lane: HashLane
    future: Future[Decoded] | None
    index: int
    ticket: Ticket | None
