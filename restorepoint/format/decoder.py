"""The payload frames of a checked manifest (spec section "Reading", R9 and R10), decoded
and hashed on a thread pool, every file's sha256 checked in order: ``PayloadDecoder``. The
manifest and the stream come from ``reader``."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import (
    DecryptionError,
    DigestMismatch,
    FramingError,
    RestorePointError,
    TruncatedRestorePoint,
)
from ._pipeline import Budget, HashLane, Ticket
from .codecs import Decoded, decode_into
from .delta import chunk_lengths
from .layout import CHUNK_HEADER
from .manifest import Entry, Manifest
from .reader import ChunkCipher, chunk_count
from .references import BaseFrames, Bases

__all__ = ["PLACED_DEPTH", "PayloadDecoder"]

#: Chunks' worth of plain bytes in flight per thread when every file has its place: the
#: decoded bytes are held there whatever the depth, so what a deeper window costs is the stored
#: bytes read ahead. It lets the decoders run ahead of the file's one sha256 lane: a 1 GiB
#: import in memory 1.24 s against 1.49 s at 2, for 41 MB more at its peak (docs/performance.md).
PLACED_DEPTH = 8


class PayloadDecoder:
    """Decode the payload frames of a checked manifest from a sequential stream that starts at
    the first entry's offset. ``events()`` yields ``(entry, plain_chunk)`` for each chunk, in
    order (bytes, or a read-only memoryview), and ``(entry, None)`` once an entry's sha256 has
    been checked. Opening, decoding and hashing run on a pool of ``threads`` (each file's chunks
    hashed in order, files side by side); at most ``2 * threads`` chunks' worth of plain bytes
    (``PLACED_DEPTH * threads`` with places) are in flight. ``held``: the caller keeps the
    chunks it is given. ``places``: where each file's plain bytes go, a writable buffer of its
    size (or None: chunks of their own); each chunk is decoded into its place there
    (``decode_into``) and given as a view of it."""

    def __init__(  # noqa: PLR0913 - the stream, and how to read it (threads, key, bases, held)
        self,
        manifest: Manifest,
        stream: BinaryIO,
        *,
        threads: int = 2,
        cipher: ChunkCipher | None = None,
        bases: Bases | None = None,
        held: bool = False,
        places: Callable[[Entry], memoryview | None] | None = None,
    ) -> None:
        assert manifest.payload is not None
        self._places = places
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
        depth = PLACED_DEPTH if self._places is not None else 2
        budget = Budget(depth * self.threads * chunk_size, 32 * self.threads)
        inflight: deque[_InFlight] = deque()
        try:
            for position, entry in enumerate(self.manifest.payload):
                if entry.delta is not None:
                    yield from self._delta_entry(entry, pool, budget, inflight)
                    continue
                n = chunk_count(entry.size, chunk_size)
                lane = HashLane(n)
                buffer = self._place(entry)
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
                    at = i * chunk_size
                    into = None if buffer is None else buffer[at : at + plain]
                    task = pool.submit(
                        self._decode,
                        entry,
                        lane,
                        (position, entries, i, n),
                        stored,
                        plain,
                        into,
                        ticket,
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
        buffer, start = self._place(entry), 0
        for i, plain in enumerate(lengths):
            into = None if buffer is None else buffer[start : start + plain]
            start += plain
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
            task = pool.submit(self._decode_chunk, entry, lane, i, stored, plain, into, ticket)
            inflight.append(_InFlight(entry, lane, task, i, ticket))
        inflight.append(_InFlight(entry, lane, None, len(lengths), None))

    def _plain(self, entry: Entry, stored: bytes, plain: int, into: memoryview | None) -> Decoded:
        """One chunk's plain bytes: decoded into its place where its file has one."""
        if into is None:
            return entry.codec.decode(stored, plain, held=self.held)
        return decode_into(entry.codec, stored, plain, into)

    def _place(self, entry: Entry) -> memoryview | None:
        """Where ``entry``'s plain bytes go (``places``), checked to be exactly as long."""
        buffer = self._places(entry) if self._places is not None and entry.size else None
        if buffer is not None and len(buffer) != entry.size:
            raise ValueError(f"a place of {len(buffer)} bytes for {entry.size}")
        return buffer

    def _decode_chunk(  # noqa: PLR0913, PLR0917 - the state of one chunk in flight
        self,
        entry: Entry,
        lane: HashLane,
        index: int,
        stored: bytes,
        plain: int,
        into: memoryview | None,
        ticket: Ticket,
    ) -> Decoded:
        """On a pool thread: decode a ``delta/1`` chunk, check its own sha256, then feed it
        to its file's."""
        assert entry.delta is not None
        data = self._plain(entry, stored, plain, into)
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
        where: tuple[int, int, int, int],
        stored: bytes,
        plain: int,
        into: memoryview | None,
        ticket: Ticket,
    ) -> Decoded:
        """On a pool thread: open and decode one chunk, then feed it to its file's sha256.
        ``where``: the entry's position among ``entries``, the chunk's index among ``count``."""
        position, entries, index, count = where
        if self.cipher is not None:
            stored = self.cipher.open(
                entry.path, entry.size, position, entries, index, index == count - 1, stored
            )
        data = self._plain(entry, stored, plain, into)
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
