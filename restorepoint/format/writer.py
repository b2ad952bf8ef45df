"""The writer's algorithm (spec section "Writing"): one pass over every payload byte.

Each source chunk is read once, on the caller's thread; a thread pool hashes it into its file's
sha256 (in chunk order, files side by side: ``_pipeline.HashLane``) and encodes it, and a writer
thread emits the stored frames in order. hashlib and zstandard release the GIL, so the stages
overlap on every core. A budget of plain bytes in flight (``_pipeline.Budget``) bounds memory
whatever the payload's size. The sha256 of the whole object, a second pass over every stored byte,
is made only on request (``object_sha256``): the restore point digest binds the head and the index
and costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import BinaryIO, Protocol

from ..errors import IntegrityError, SourceError
from ._json import canonical_dumps, strict_loads
from ._pipeline import Budget, HashLane, Ticket
from .adaptive import Choices, CodecChooser
from .codecs import Codec, NoneCodec, PlanesCodec, encode_raw_parts
from .delta import DELTA_FEATURE, Base, Chunks, Ref, chunk_lengths, pack_cuts
from .layout import CHUNK_HEADER, END_MAGIC, FOOTER, MAGIC, PREAMBLE
from .limits import (
    MAX_ENTRIES,
    MAX_HEAD_BYTES,
    MAX_INDEX_BYTES,
    MAX_SAFE_INTEGER,
    MAX_SIGNATURE_BYTES,
)
from .manifest import Entry, Manifest
from .paths import check_path
from .reader import ChunkCipher
from .statement import restore_point_digest

__all__ = ["DeltaPlan", "Sink", "Writer", "Written"]

#: Chunks in flight at most, whatever their size: many small files hash side by side, and the
#: futures of a payload of tiny files stay few.
MAX_CHUNKS_IN_FLIGHT = 64


class Sink(Protocol):
    """Where the writer's bytes go, in order. Publishing (atomicity) is the caller's concern."""

    def write(self, data: bytes | memoryview, /) -> object: ...


@dataclass(frozen=True)
class DeltaPlan:
    """What an incremental writer may reference (section 28, W4c): the bases, and for each
    chunk sha256 found in them where its frame lies: (base number, offset, stored length).
    Made by the caller from the newest restore point's index, with its frames flattened (a
    frame the newest one references is named where it lies, in that one's base)."""

    bases: tuple[Base, ...] = ()
    frames: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class _Pending:
    path: str
    size: int
    lane: HashLane
    offset: int = -1
    stored: int = 0
    cuts: str | None = None
    shas: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    refs: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class _Encoded:
    """A chunk as the pool made it: its stored pieces, or (incremental) where its frame
    already lies; its sha256 when the object names its chunks."""

    parts: list[bytes | memoryview]
    sha256: str | None = None
    reuse: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class _Begin:
    """A file starts: its region begins where the output stands when this item is written."""

    pending: _Pending


@dataclass(frozen=True)
class _Chunk:
    """A chunk of ``pending``'s file, being encoded by the pool: written in queue order."""

    pending: _Pending
    future: Future[_Encoded]
    ticket: Ticket


_Item = _Begin | _Chunk


@dataclass(frozen=True)
class Written:
    """What the writer wrote: the full manifest, the object's size, the digests of its head and
    index, the restore point digest (the statement's sha256, spec section 21), and the sha256
    of the whole object when it was asked for (None otherwise)."""

    manifest: Manifest
    size: int
    head_sha256: str
    index_sha256: str
    object_sha256: str | None
    #: What the adaptive chooser chose (None: every chunk went through the codec's probe).
    choices: Choices | None = None

    @property
    def digest(self) -> str:
        return restore_point_digest(self.manifest.id, self.head_sha256, self.index_sha256)


@dataclass
class Writer:
    """Write one restore point into ``sink``: ``begin()``, ``add()`` per file, ``finish()``."""

    sink: Sink
    head: Manifest
    codec: Codec = field(default_factory=NoneCodec)
    threads: int = 2
    progress: Callable[[int], None] | None = None
    #: Seals every stored chunk (encrypted payloads); needs ``entries``, the number of files.
    cipher: ChunkCipher | None = None
    entries: int | None = None
    #: Makes the signature block from (head sha256, index sha256); None: unsigned.
    signer: Callable[[str, str], bytes] | None = None
    #: Also hash the whole object as it is written (a second pass over every stored byte).
    object_sha256: bool = False
    #: Chooses each chunk's mode, probe or raw, from what compression and the store cost
    #: (codec planes only: spec section 13, W4b); None: every chunk is probed.
    chooser: CodecChooser | None = None
    #: What an incremental object may reference (its head lists ``delta/1``); with the
    #: feature and no plan, every chunk is stored and named (the object can serve as a base).
    delta: DeltaPlan | None = None

    def __post_init__(self) -> None:
        if (self.cipher is None) != (self.head.encryption is None):
            raise ValueError("a cipher goes with a head that declares its encryption")
        if self.cipher is not None and self.entries is None:
            raise ValueError("an encrypting writer needs the number of entries up front")
        # getattr: a codec registered before codecs named their feature needs none.
        feature = getattr(self.codec, "feature", None)
        if feature is not None and feature not in self.head.required_features:
            raise ValueError(f"codec {self.codec.name} needs the required feature {feature}")
        if self.chooser is not None and not isinstance(self.codec, PlanesCodec):
            raise ValueError("the adaptive chooser needs codec planes (a mode per chunk)")
        self._named = DELTA_FEATURE in self.head.required_features
        if self.delta is not None and not self._named:
            raise ValueError(f"an incremental writer needs the required feature {DELTA_FEATURE}")
        if self._named and self.cipher is not None:
            raise ValueError(f"{DELTA_FEATURE} goes without encryption")
        self._used: dict[int, int] = {}
        self._object_hash = hashlib.sha256() if self.object_sha256 else None
        # The object's sha256 runs on a thread of its own, beside the writes.
        self._hasher = (
            ThreadPoolExecutor(1, thread_name_prefix="rp-hash") if self.object_sha256 else None
        )
        self._hashing: deque[Future[None]] = deque()
        self._position = 0
        self._pending: list[_Pending] = []
        self._paths: list[str] = []
        self._depth = max(2, 2 * self.threads)
        # As many plain bytes in flight as depth full chunks: the memory of a pipeline that is
        # depth chunks deep, but room for many small files at once.
        self._budget = Budget(self._depth * self.head.chunk_size, MAX_CHUNKS_IN_FLIGHT)
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=4 * MAX_CHUNKS_IN_FLIGHT)
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._head_sha256 = ""

    # -- public steps ----------------------------------------------------------------------

    def begin(self) -> None:
        """Step 1-3: preamble, head, head digest."""
        head = canonical_dumps(self.head.head_dict())
        if len(head) > MAX_HEAD_BYTES:
            raise SourceError(f"the head is {len(head)} bytes; the limit is {MAX_HEAD_BYTES}")
        # Read the head back as a reader would (depth limit, number domain, schema): a writer
        # must never publish an object that every reader then refuses.
        try:
            Manifest.from_head_dict(strict_loads(head, "head"))
        except IntegrityError as exc:
            raise SourceError(f"the head would not be readable: {exc.message}") from None
        digest = hashlib.sha256(head).digest()
        self._head_sha256 = digest.hex()
        major, minor = (int(n) for n in self.head.format_version.split("."))
        self._emit(PREAMBLE.pack(MAGIC, major, minor, len(head)))
        self._emit(head)
        self._emit(digest)
        # Also for codec none: the pool hashes, so that the reading thread only reads.
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rp-encode")
        self._thread = threading.Thread(target=self._drain, name="rp-write", daemon=True)
        self._thread.start()

    def add(self, path: str, source: BinaryIO, size: int, cuts: list[int] | None = None) -> None:
        """Step 4: one payload file, read exactly once, ``size`` bytes (its size when listed).
        ``cuts``: where chunks 1..n-1 start (a ``delta/1`` object only; section 28), at most
        ``chunk_size`` apart; None: fixed chunks."""
        check_path(path)
        if self._paths and path.encode() <= self._paths[-1].encode():
            raise SourceError(f"payload paths must be added in sorted order: {path!r}")
        if len(self._paths) >= MAX_ENTRIES:
            raise SourceError(f"more than {MAX_ENTRIES} payload files")
        if self.entries is not None and len(self._paths) >= self.entries:
            raise SourceError(f"more payload files than the {self.entries} announced")
        assert self._pool is not None, "begin() first"
        position = len(self._paths)
        packed = pack_cuts(cuts) if cuts else None
        if packed is not None and not self._named:
            raise ValueError(f"cuts need the required feature {DELTA_FEATURE}")
        lengths = chunk_lengths(size, self.head.chunk_size, packed)
        if any(not 0 < n <= self.head.chunk_size for n in lengths):
            raise SourceError(f"{path}: cuts must lie inside the file, at most chunk_size apart")
        n_chunks = len(lengths)
        self._paths.append(path)
        pending = _Pending(path, size, HashLane(n_chunks), cuts=packed)
        self._pending.append(pending)
        self._put(_Begin(pending))
        for index, want in enumerate(lengths):
            ticket = self._budget.acquire(want, self._check)
            chunk = _read_exactly(source, want)
            if len(chunk) != want:
                raise SourceError(f"{path}: file shrank while it was packed")
            future = self._pool.submit(
                self._chunk, pending, position, index, index == n_chunks - 1, chunk, ticket
            )
            self._put(_Chunk(pending, future, ticket))
            if self.progress is not None:
                self.progress(want)
        if source.read(1):
            raise SourceError(f"{path}: file grew while it was packed")

    def _chunk(  # noqa: PLR0913, PLR0917 - the state of one chunk in flight, from the hot loop
        self, pending: _Pending, position: int, index: int, last: bool, chunk: bytes, ticket: Ticket
    ) -> _Encoded:
        """On a pool thread: the chunk into its file's sha256 (in order), then encoded, as
        pieces of its stored bytes when the codec makes them and nothing seals them; in a
        ``delta/1`` object also its own sha256, and a frame of the plan's that holds it."""
        sha = hashlib.sha256(chunk).hexdigest() if self._named else None
        pending.lane.feed(index, chunk, ticket)
        if sha is not None and self.delta is not None:
            reuse = self.delta.frames.get(sha)
            if reuse is not None:
                return _Encoded([], sha, reuse)
        return _Encoded(self._encode(pending, position, index, last, chunk), sha)

    def _encode(
        self, pending: _Pending, position: int, index: int, last: bool, chunk: bytes
    ) -> list[bytes | memoryview]:
        if self.chooser is not None:
            pieces = self._choose(chunk)
            if self.cipher is None:
                return pieces
            stored = b"".join(pieces)
        elif self.cipher is None:
            parts = getattr(self.codec, "encode_parts", None)
            return parts(chunk) if parts is not None else [self.codec.encode(chunk)]
        else:
            stored = self.codec.encode(chunk)
        assert self.entries is not None
        return [
            self.cipher.seal(
                pending.path, pending.size, position, self.entries, index, last, stored
            )
        ]

    def _choose(self, chunk: bytes) -> list[bytes | memoryview]:
        """The chunk in the mode the chooser picks, its encoding measured when probed."""
        assert self.chooser is not None
        assert isinstance(self.codec, PlanesCodec)
        if self.chooser.choose(len(chunk)) == "raw":
            return encode_raw_parts(chunk)
        started = time.perf_counter()
        pieces = self.codec.encode_parts(chunk)
        seconds = time.perf_counter() - started
        self.chooser.record_encode(len(chunk), sum(len(p) for p in pieces), seconds)
        return pieces

    def finish(self) -> Written:
        """Steps 5-6: index, signature block, footer."""
        self._stop()
        if self.entries is not None and len(self._pending) != self.entries:
            raise SourceError(f"{len(self._pending)} payload files, {self.entries} announced")
        entries = [
            Entry(
                path=p.path,
                size=p.size,
                sha256=p.lane.hexdigest(self._check),
                codec=self.codec,
                offset=p.offset,
                stored_size=p.stored,
                delta=self._chunks(p),
            )
            for p in self._pending
        ]
        manifest = self.head.with_payload(entries)
        if self._named:
            # Only the bases referenced, numbered in the plan's order.
            plan = self.delta or DeltaPlan()
            manifest = replace(manifest, bases=tuple(plan.bases[b] for b in sorted(self._used)))
        index = canonical_dumps(manifest.index_dict(self._head_sha256))
        if len(index) > MAX_INDEX_BYTES:
            raise SourceError(f"the index is {len(index)} bytes; the limit is {MAX_INDEX_BYTES}")
        index_offset = self._position
        index_digest = hashlib.sha256(index).digest()
        self._emit(index)
        signature = b""
        if self.signer is not None:
            signature = self.signer(self._head_sha256, index_digest.hex())
            if len(signature) > MAX_SIGNATURE_BYTES:
                raise SourceError(f"the signature block exceeds {MAX_SIGNATURE_BYTES} bytes")
            self._emit(signature)
        self._emit(FOOTER.pack(index_offset, len(index), index_digest, len(signature), END_MAGIC))
        if self._position > MAX_SAFE_INTEGER:
            raise SourceError("the restore point would exceed 2**53-1 bytes")
        object_sha256 = self._object_digest()
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
        return Written(
            manifest,
            self._position,
            self._head_sha256,
            index_digest.hex(),
            object_sha256,
            self.chooser.choices if self.chooser is not None else None,
        )

    def abort(self) -> None:
        """Stop the threads after a failure; the caller discards what was written. Never
        raises: it runs while another exception (a signal, even) is on its way out, and may
        find the threads in any state, a writer thread whose start was interrupted included."""
        self._error = self._error or RuntimeError("aborted")
        with contextlib.suppress(Exception):
            while True:
                self._queue.get_nowait()
        with contextlib.suppress(Exception):
            self._stop(raise_error=False)

    # -- internals -------------------------------------------------------------------------

    def _chunks(self, pending: _Pending) -> Chunks | None:
        if not self._named:
            return None
        number = {b: i for i, b in enumerate(sorted(self._used))}
        return Chunks(
            "".join(pending.shas),
            "".join(f"{n:08x}" for n in pending.frames),
            pending.cuts,
            tuple(Ref(r[0], r[1], number[r[2]], r[3], r[4]) for r in pending.refs),
        )

    def _emit(self, data: bytes | memoryview) -> None:
        if self._hasher is not None:
            assert self._object_hash is not None
            self._hashing.append(self._hasher.submit(self._object_hash.update, data))
        self.sink.write(data)
        self._position += len(data)
        while len(self._hashing) > self._depth:
            self._hashing.popleft().result()

    def _object_digest(self) -> str | None:
        while self._hashing:
            self._hashing.popleft().result()
        return self._object_hash.hexdigest() if self._object_hash is not None else None

    def _check(self) -> None:
        """Raise the pipeline's error, if any: called by whatever waits on it."""
        if self._error is not None:
            self._raise()

    def _put(self, item: _Item) -> None:
        while True:
            if self._error is not None:
                self._raise()
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        error = self._error
        assert error is not None
        raise error

    def _drain(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                if self._error is not None:
                    continue
                if isinstance(item, _Begin):
                    item.pending.offset = self._position
                    continue
                encoded = item.future.result()
                pending = item.pending
                if encoded.sha256 is not None:
                    pending.shas.append(encoded.sha256)
                if encoded.reuse is not None:
                    self._reuse(pending, encoded.reuse)
                    item.ticket.done()
                    continue
                parts = encoded.parts
                length = sum(len(part) for part in parts)
                if encoded.sha256 is not None:
                    pending.frames.append(length)
                started = time.perf_counter()
                self._emit(CHUNK_HEADER.pack(length))
                for part in parts:
                    self._emit(part)
                if self.chooser is not None:
                    self.chooser.record_store(length, time.perf_counter() - started)
                item.pending.stored += CHUNK_HEADER.size + length
                item.ticket.done()
        except BaseException as exc:
            self._error = exc

    def _reuse(self, pending: _Pending, where: tuple[int, int, int]) -> None:
        """A chunk whose frame lies in a base: a reference, joined to the run before it
        when it is the next frame of the same base."""
        base, offset, length = where
        index = len(pending.frames)
        pending.frames.append(length)
        self._used[base] = self._used.get(base, 0) + 1
        last = pending.refs[-1] if pending.refs else None
        if (
            last is not None
            and last[0] + last[1] == index
            and last[2] == base
            and last[3] + last[4] == offset
        ):
            last[1] += 1
            last[4] += CHUNK_HEADER.size + length
        else:
            pending.refs.append([index, 1, base, offset, CHUNK_HEADER.size + length])

    def _stop(self, raise_error: bool = True) -> None:
        if self._thread is not None and self._thread.ident is None:
            self._thread = None  # never started: nothing to join
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.put(None, timeout=0.2)
                    break
                except queue.Full:
                    if self._error is not None:
                        # The writer thread died; empty the queue so it can see the sentinel.
                        try:
                            while True:
                                self._queue.get_nowait()
                        except queue.Empty:
                            pass
            self._thread.join()
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if not raise_error and self._hasher is not None:
            self._hasher.shutdown(wait=True, cancel_futures=True)
        if raise_error and self._error is not None:
            self._raise()


def _read_exactly(source: BinaryIO, n: int) -> bytes:
    """Up to n bytes, fewer only at end of file: an unbuffered read may return short (network
    and FUSE file systems do), which must not look like a file that shrank."""
    data = source.read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = source.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
