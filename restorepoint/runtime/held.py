"""A snapshot file's bytes held in memory, verified (an import in memory keeps them so), and
how a tensor is filled from them, or made of them (``Share``): ``snapshot_file.
read_snapshot_held`` makes the state."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["FILL_STEP", "FILL_THREADS", "Fill", "Held", "Share"]

#: Bytes ``start`` to ``end`` of held bytes as writable memory to make a tensor of, and what
#: gives their pages back once nothing refers to them; None where they cannot be shared
#: (``ops.unpack.Contents.share``: held bytes that have one buffer, and no copy to write).
Share = Callable[[int, int], "tuple[memoryview, Callable[[], None] | None] | None"]

#: How much of a tensor ``Fill`` copies in one step; a window of steps is copied before what
#: it copied is forgotten.
FILL_STEP = 16 << 20
#: A tensor made of held bytes is filled on at most this many threads (``Fill``).
FILL_THREADS = 2


class Held(Protocol):
    """A file's bytes held in memory, verified (an import in memory keeps them so:
    ``ops.unpack.Contents``)."""

    @property
    def size(self) -> int: ...

    def read(self, start: int, end: int) -> bytes: ...

    def readinto(self, start: int, out: memoryview) -> int:
        """Safe from several threads at once over bytes none of them forgets."""
        ...

    def forget(self, end: int) -> None: ...


class Fill:
    """A tensor's bytes copied out of held bytes a window at a time, each window's steps
    (FILL_STEP bytes each) on up to FILL_THREADS threads (no more than the cores), and each
    window's bytes forgotten once copied: the bytes of the tensor being made are not held
    twice either (at most one window's). The held bytes' copies release the GIL
    (``Contents.readinto``), so two steps copy side by side; the fresh pages they land in
    fault under one memory map's lock, so two threads do not halve the time (at 1 GiB, 0.86
    against 0.95 s: docs/performance.md). On one thread when no thread can start."""

    def __init__(self, data: Held) -> None:
        self.data = data
        self.threads = max(1, min(FILL_THREADS, os.cpu_count() or 1))
        self._pool: Any = None

    def __enter__(self) -> Fill:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _map(self, steps: list[tuple[int, memoryview]]) -> list[int]:
        if self.threads > 1 and len(steps) > 1:
            try:
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rp-fill")
                return list(self._pool.map(lambda s: self.data.readinto(*s), steps))
            except RuntimeError:
                self.threads = 1  # no new thread now (the interpreter shutting down)
        return [self.data.readinto(at, view) for at, view in steps]

    def __call__(self, start: int, out: memoryview) -> int:
        done = 0
        while done < len(out):
            window = [
                (start + at, out[at : at + FILL_STEP])
                for at in range(done, min(len(out), done + self.threads * FILL_STEP), FILL_STEP)
            ]
            got = self._map(window)
            done += sum(got)
            self.data.forget(start + done)
            if got[-1] < len(window[-1][1]):
                break
        return done
