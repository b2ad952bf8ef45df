"""The writer's algorithm (spec section "Writing"): one pass over every payload byte.

Each source chunk is read once; the main thread hashes it (sha256 of the plain file) while a
thread pool encodes earlier chunks, and a writer thread emits the stored frames in order and
hashes the object as it goes. hashlib and zstandard release the GIL, so on two cores the three
stages overlap. At most ``depth`` chunks are in flight, so memory stays bounded whatever the
payload's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from ..errors import IntegrityError, SourceError
from ._json import canonical_dumps, strict_loads
from ._layout import CHUNK_HEADER, END_MAGIC, FOOTER, FORMAT_MAJOR, FORMAT_MINOR, MAGIC, PREAMBLE
from .codecs import Codec, NoneCodec
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

__all__ = ["Sink", "Writer"]


class Sink(Protocol):
    """Where the writer's bytes go, in order. Publishing (atomicity) is the caller's concern."""

    def write(self, data: bytes, /) -> object: ...


@dataclass
class _Pending:
    path: str
    size: int
    sha256: str = ""
    offset: int = -1
    stored: int = 0
    read_done: bool = False


_Item = tuple[str, "_Pending", "Future[bytes] | None"]


@dataclass
class _Done:
    value: bytes

    def result(self) -> bytes:
        return self.value


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

    def __post_init__(self) -> None:
        if (self.cipher is None) != (self.head.encryption is None):
            raise ValueError("a cipher goes with a head that declares its encryption")
        if self.cipher is not None and self.entries is None:
            raise ValueError("an encrypting writer needs the number of entries up front")
        self._object_hash = hashlib.sha256()
        # The object's sha256 runs on a thread of its own, beside the writes: on two cores
        # that is what keeps a store-only pack close to a plain read-and-hash pass.
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="rp-hash")
        self._hashing: deque[Future[None]] = deque()
        self._position = 0
        self._entries: list[Entry] = []
        self._paths: list[str] = []
        self._depth = max(2, 2 * self.threads)
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=self._depth)
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
        self._emit(PREAMBLE.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, len(head)))
        self._emit(head)
        self._emit(digest)
        if not isinstance(self.codec, NoneCodec) or self.cipher is not None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rp-encode")
        self._thread = threading.Thread(target=self._drain, name="rp-write", daemon=True)
        self._thread.start()

    def add(self, path: str, source: BinaryIO, size: int) -> None:
        """Step 4: one payload file, read exactly once, ``size`` bytes (its size when listed)."""
        check_path(path)
        if self._paths and path.encode() <= self._paths[-1].encode():
            raise SourceError(f"payload paths must be added in sorted order: {path!r}")
        if len(self._paths) >= MAX_ENTRIES:
            raise SourceError(f"more than {MAX_ENTRIES} payload files")
        if self.entries is not None and len(self._paths) >= self.entries:
            raise SourceError(f"more payload files than the {self.entries} announced")
        position = len(self._paths)
        n_chunks = -(-size // self.head.chunk_size)
        self._paths.append(path)
        pending = _Pending(path, size)
        self._put(("begin", pending, None))
        file_hash = hashlib.sha256()
        chunk_size = self.head.chunk_size
        left = size
        index = 0
        while left > 0:
            want = min(chunk_size, left)
            chunk = _read_exactly(source, want)
            if len(chunk) != want:
                raise SourceError(f"{path}: file shrank while it was packed")
            left -= want
            file_hash.update(chunk)
            future: Future[bytes] | _Done
            if self._pool is None:
                future = _Done(chunk)
            else:
                future = self._pool.submit(
                    self._encode, path, size, position, index, index == n_chunks - 1, chunk
                )
            index += 1
            self._put(("chunk", pending, future))  # type: ignore[arg-type]
            if self.progress is not None:
                self.progress(want)
        if source.read(1):
            raise SourceError(f"{path}: file grew while it was packed")
        pending.sha256 = file_hash.hexdigest()
        self._put(("end", pending, None))

    def _encode(
        self, path: str, size: int, position: int, index: int, last: bool, chunk: bytes
    ) -> bytes:
        stored = self.codec.encode(chunk)
        if self.cipher is not None:
            assert self.entries is not None
            stored = self.cipher.seal(path, size, position, self.entries, index, last, stored)
        return stored

    def finish(self) -> tuple[Manifest, str, int]:
        """Steps 5-6: index, signature block, footer. Returns the full manifest, the object's
        sha256 and its size."""
        self._stop()
        if self.entries is not None and len(self._entries) != self.entries:
            raise SourceError(f"{len(self._entries)} payload files, {self.entries} announced")
        manifest = self.head.with_payload(self._entries)
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
        digest = self._object_digest()
        self._hasher.shutdown(wait=True)
        return manifest, digest, self._position

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

    def _emit(self, data: bytes) -> None:
        self._hashing.append(self._hasher.submit(self._object_hash.update, data))
        self.sink.write(data)
        self._position += len(data)
        while len(self._hashing) > self._depth:
            self._hashing.popleft().result()

    def _object_digest(self) -> str:
        while self._hashing:
            self._hashing.popleft().result()
        return self._object_hash.hexdigest()

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
                kind, pending, future = item
                if self._error is not None:
                    continue
                if kind == "begin":
                    pending.offset = self._position
                elif kind == "chunk":
                    assert future is not None
                    stored = future.result()
                    self._emit(CHUNK_HEADER.pack(len(stored)))
                    self._emit(stored)
                    pending.stored += CHUNK_HEADER.size + len(stored)
                else:
                    self._entries.append(
                        Entry(
                            path=pending.path,
                            size=pending.size,
                            sha256=pending.sha256,
                            codec=self.codec,
                            offset=pending.offset,
                            stored_size=pending.stored,
                        )
                    )
        except BaseException as exc:
            self._error = exc

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
        if not raise_error:
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
