"""What an import in memory keeps of each file (``Contents``): the decoded chunks, read by the
caller and written into the staging tree by the ``StagingWriter`` (spec section 18)."""

from __future__ import annotations

import bisect
import ctypes
import sys
from collections.abc import Callable
from typing import Any

from .._posix import give_back, huge_buffer, release_free_memory
from ._staging import StagingWriter

__all__ = ["WRITE_LAG", "Contents", "file_buffer"]

#: How far a reader of an import in memory may let go of bytes ahead of the staging writer
#: (``Contents.forget``): the chunks it forgets that the writer has not yet written stay
#: held for it, at most this much; beyond, the reader waits for the writer.
WRITE_LAG = 64 << 20

#: Below this many bytes a read copies by slices: numpy's call costs more than the GIL.
_NUMPY_COPY = 1 << 20


class Contents:
    """One file's plain bytes, verified, as an import ``in_memory`` kept them: the chunks the
    decoder gave (bytes or read-only views), in order. A reader copies out what it needs and
    may ``forget`` what it has read, so that the bytes and what is built of them are not both
    held whole. The copy in the staging tree is written from the same chunks on a thread of
    its own (``StagingWriter``): a chunk goes when both are done with it."""

    __slots__ = (
        "_address",
        "_base",
        "_chunks",
        "_forgotten",
        "_given",
        "_index",
        "_starts",
        "_writer",
        "size",
    )

    def __init__(self, writer: StagingWriter | None = None, index: int = 0) -> None:
        self._chunks: list[bytes | memoryview | None] = []
        self._starts: list[int] = []
        #: Chunks before this one are forgotten.
        self._forgotten = 0
        #: The writer of the staging copy, and this file's index in its order.
        self._writer, self._index = writer, index
        self.size = 0
        #: The file's bytes in one buffer, where the decoder placed every chunk (``adopt``),
        #: and its address where it is a mapping of its own (pages may be given back).
        self._base: memoryview | None = None
        self._address: int | None = None
        #: The ranges given away (``share``), in order: no longer the verified bytes.
        self._given: list[tuple[int, int]] = []

    def adopt(self, base: memoryview, own: bool) -> None:
        """The decoder placed this file's bytes in ``base`` (``file_buffer``): what ``share``
        hands out. ``own``: ``base`` is a mapping of its own."""
        self._base = base
        if own:
            probe = ctypes.c_char.from_buffer(base)
            self._address = ctypes.addressof(probe)
            del probe

    def share(self, start: int, end: int) -> tuple[memoryview, Callable[[], None] | None] | None:
        """Bytes ``start`` to ``end`` as writable memory to make a tensor of, without a copy,
        and what gives their whole pages back to the system once nothing refers to them (None
        where the buffer is not a mapping of its own); None when the bytes are not in one
        buffer (an import with a staging copy, which is written from the same chunks while
        training changes its tensors). Once shared, those bytes are the tensor's, no longer
        the verified file's: they are never read again (ValueError)."""
        if self._base is None or self._writer is not None or not 0 <= start <= end <= self.size:
            return None
        if self._given and start < self._given[-1][1]:
            raise ValueError("those bytes were shared already")
        self._given.append((start, end))
        address = self._address
        release = None if address is None else lambda: give_back(address + start, end - start)
        return self._base[start:end], release

    def append(self, chunk: bytes | memoryview) -> None:
        self._starts.append(self.size)
        self._chunks.append(chunk)
        self.size += len(chunk)

    def readinto(self, start: int, out: memoryview) -> int:
        """Copy bytes ``start`` to ``start + len(out)`` (fewer at the end) into ``out``;
        returns how many. Forgotten bytes are not there: ValueError. Safe from several
        threads at once over bytes none of them forgets. Where the process has numpy already
        (a PyTorch run), the copies are numpy's, which release the GIL, so that readers on
        two threads copy side by side; slices of memoryviews, which hold it, otherwise."""
        n = max(0, min(len(out), self.size - start))
        k = bisect.bisect_right(self._given, (start + n,))
        if k and self._given[k - 1][1] > start:
            raise ValueError("those bytes were shared")
        i = bisect.bisect_right(self._starts, start) - 1
        numpy: Any = sys.modules.get("numpy") if n >= _NUMPY_COPY else None
        into = None if numpy is None else numpy.frombuffer(out, numpy.uint8)
        done = 0
        while done < n:
            chunk = self._chunks[i]
            if chunk is None:
                raise ValueError("those bytes were forgotten")
            offset = start + done - self._starts[i]
            take = min(n - done, len(chunk) - offset)
            if into is not None:
                into[done : done + take] = numpy.frombuffer(chunk, numpy.uint8, take, offset)
            else:
                out[done : done + take] = memoryview(chunk)[offset : offset + take]
            done += take
            i += 1
        return n

    def read(self, start: int, end: int) -> bytes:
        out = bytearray(max(0, min(end, self.size) - start))
        self.readinto(start, memoryview(out))
        return bytes(out)

    def forget(self, end: int) -> None:
        """Let go of every chunk that lies wholly before byte ``end``. The chunks the staging
        writer has not yet written stay held for it: when more than ``WRITE_LAG`` bytes would,
        this waits for the writer, so that forgetting bounds the memory held as before."""
        i = first = self._forgotten
        while i < len(self._chunks) and self._starts[i] + len(self._chunks[i] or b"") <= end:
            self._chunks[i] = None
            i += 1
        self._forgotten = i
        if i == first:
            return
        let_go = self._starts[i] if i < len(self._starts) else self.size
        if self._writer is not None and let_go > WRITE_LAG:
            self._writer.wait_written(self._index, let_go - WRITE_LAG)
        # The chunks were allocated by the decoder's threads: without this their memory would
        # stay resident beside the tensors made of them (at 1 GiB, 0.2 GiB more at the peak).
        release_free_memory()


def file_buffer(size: int) -> tuple[memoryview, bool]:
    """Writable memory for a file's ``size`` bytes, and whether it is a mapping of its own
    (``huge_buffer``: fresh, in huge pages, its pages given back one by one, ``share``)."""
    fresh = huge_buffer(size)
    if fresh is not None:
        return fresh, True
    return memoryview(bytearray(size)), False
