"""What the writer's and the reader's thread pools share: a file's sha256 fed from any thread in
chunk order, and a budget of plain bytes in flight.

SHA-256 is sequential, so one file's digest is one core's work whatever the pool's size; what a
pool can do is hash several files at once and keep hashing off the thread that reads. A
``HashLane`` takes a file's chunks in any order from the pool threads that produced them and
hashes them in order: the thread that brings the next chunk hashes it and every parked chunk that
follows, the others park theirs and go on, so no pool thread ever waits for another. hashlib
releases the GIL while it hashes, so lanes of different files run on different cores.

Parked chunks are memory: a ``Budget`` counts the plain bytes of every chunk from the moment it
is read until it is both hashed and handed on (written, or yielded), and the reading thread
waits for room before it reads the next one. Since the budget counts bytes, not files, many small
files fit in it at once and hash in parallel; a file larger than the budget hashes alone, at the
speed of one core's sha256.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

__all__ = ["Budget", "HashLane", "Ticket"]


class Budget:
    """Plain bytes (and chunks) in flight; ``acquire`` blocks until there is room. One chunk is
    always let in when nothing is in flight, whatever its size, so a chunk larger than the
    budget cannot stall the pipeline."""

    def __init__(self, limit_bytes: int, limit_chunks: int) -> None:
        self._limit_bytes = limit_bytes
        self._limit_chunks = limit_chunks
        self._bytes = 0
        self._chunks = 0
        self._cond = threading.Condition()

    def has_room(self, n: int) -> bool:
        with self._cond:
            return not self._chunks or (
                self._bytes + n <= self._limit_bytes and self._chunks < self._limit_chunks
            )

    def acquire(self, n: int, failed: Callable[[], None]) -> Ticket:
        """Room for a chunk of ``n`` bytes. ``failed`` is called every 0.2 s while waiting and
        raises when the pipeline has failed, so that a waiting reader never hangs."""
        with self._cond:
            while self._chunks and (
                self._bytes + n > self._limit_bytes or self._chunks >= self._limit_chunks
            ):
                failed()
                self._cond.wait(0.2)
            self._bytes += n
            self._chunks += 1
        return Ticket(self, n)

    def _release(self, n: int) -> None:
        with self._cond:
            self._bytes -= n
            self._chunks -= 1
            self._cond.notify_all()


class Ticket:
    """One chunk's place in the budget, given back when both of its uses are done: hashed,
    and written or handed out."""

    __slots__ = ("_budget", "_left", "_lock", "_n")

    def __init__(self, budget: Budget, n: int) -> None:
        self._budget = budget
        self._n = n
        self._left = 2
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._budget._release(self._n)


class HashLane:
    """The sha256 of one file of ``chunks`` chunks, fed chunk by chunk from any thread."""

    def __init__(self, chunks: int) -> None:
        self._hash = hashlib.sha256()
        self._chunks = chunks
        self._next = 0
        self._parked: dict[int, tuple[bytes | memoryview, Ticket | None]] = {}
        self._busy = False
        self._lock = threading.Lock()
        self._finished = threading.Event()
        if chunks == 0:
            self._finished.set()

    def feed(self, index: int, chunk: bytes | memoryview, ticket: Ticket | None = None) -> None:
        """Chunk ``index`` (from 0). Hashes it now if it is next and nobody is hashing this
        file, with every parked chunk that follows it; otherwise parks it and returns."""
        with self._lock:
            self._parked[index] = (chunk, ticket)
            if self._busy:
                return
            self._busy = True
        while True:
            with self._lock:
                item = self._parked.pop(self._next, None)
                if item is None:
                    self._busy = False
                    return
                self._next += 1
                last = self._next == self._chunks
            data, done = item
            # Outside the lock: hashlib releases the GIL, and other threads may park meanwhile.
            self._hash.update(data)
            if done is not None:
                done.done()
            if last:
                self._finished.set()

    def hexdigest(self, failed: Callable[[], None]) -> str:
        """The file's sha256 once every chunk is hashed; ``failed`` as in Budget.acquire."""
        while not self._finished.wait(0.2):
            failed()
        return self._hash.hexdigest()
