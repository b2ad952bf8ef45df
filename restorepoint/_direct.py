"""Writes past the page cache (O_DIRECT): a snapshot file (``runtime.state.save_image``) and
a restore point published into a local store (``storage._local``). Both are written once and
not read back soon by the process that writes them."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path

from ._posix import fsync_dir
from .errors import StorageError

__all__ = [
    "DIRECT_ALIGN",
    "DIRECT_BUFFER",
    "DIRECT_MIN",
    "DirectWriter",
    "no_space",
    "replace_file",
]


#: What O_DIRECT needs aligned (the buffer's address, each write's length and offset): the
#: page, which every device's logical block (512 or 4096 bytes) divides.
DIRECT_ALIGN = 4096
#: The aligned buffer a direct write copies the bytes through, and the size of each write.
DIRECT_BUFFER = 8 << 20
#: Below this many bytes a file is written through the cache: a few pages, not worth it.
DIRECT_MIN = 1 << 20


class DirectWriter:
    """Writes to the start of an empty file, open for writing as ``fd``, past the page cache
    (O_DIRECT) where the file system allows it: the bytes are copied into an aligned buffer
    of DIRECT_BUFFER bytes, which is written whole each time it fills; ``finish`` writes the
    rest, less than a buffer, in whole blocks, and the last partial block through the cache
    (O_DIRECT off again). Where direct I/O is refused, every byte goes through the cache
    (from where it lies, but for ``write_copied``'s, which always pass through the buffer).

    Why: a write through the page cache takes a fresh page of memory for each page it caches,
    and the kernel's writeback comes after it. On the 2-core VM of docs/performance.md, whose
    freed memory goes back to its host (``freed_memory_reported``), writing and fsyncing 1 GiB
    that way took 0.25 to 2.75 s of CPU; direct, 0.05 s, in 0.5 s. What is written so is not
    read back soon by the process that writes it (a snapshot file, a store's object), so
    nothing is lost by leaving it uncached.

    ``write_memory``'s copies (ctypes.memmove) and every write (os.write) release the GIL;
    ``write``'s copies (of bytes objects: a store's) hold it. A write refused
    midway for its alignment (EINVAL: a file system that took the flag but not the write)
    turns the flag off and writes on through the cache."""

    def __init__(self, fd: int, size_hint: int | None = None) -> None:
        self.fd = fd
        self.direct = _direct_on(fd, True)
        size = DIRECT_BUFFER
        if size_hint is not None:
            size = max(DIRECT_ALIGN, min(size, -(-size_hint // DIRECT_ALIGN) * DIRECT_ALIGN))
        # An anonymous mapping starts at a page: aligned as O_DIRECT needs.
        self._buffer: mmap.mmap | None = mmap.mmap(-1, size)
        self._view = memoryview(self._buffer)
        self._probe = ctypes.c_char.from_buffer(self._buffer)
        self._base = ctypes.addressof(self._probe)
        self._fill = 0

    def write_memory(self, address: int, length: int) -> None:
        """``length`` bytes of this process's memory at ``address`` (copied without the GIL;
        through the cache, written from where they lie)."""
        if not self.direct and not self._fill:
            _write_all(self.fd, memoryview((ctypes.c_ubyte * length).from_address(address)))
            return
        self._fill_with(
            length, lambda at, done, n: ctypes.memmove(self._base + at, address + done, n)
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """The bytes of ``data``."""
        view = memoryview(data).cast("B")
        if not self.direct and not self._fill:
            _write_all(self.fd, view)
            return

        def copy(at: int, done: int, n: int) -> None:
            self._view[at : at + n] = view[done : done + n]

        self._fill_with(view.nbytes, copy)

    def write_copied(self, length: int, copy: Callable[[int, int, int], object]) -> None:
        """``length`` bytes that ``copy(into, done, n)`` puts into this process's memory at
        the address ``into``, ``n`` bytes from the ``done``-th on (the publish process reads
        its parent's memory so, straight into the buffer)."""
        self._fill_with(length, lambda at, done, n: copy(self._base + at, done, n))

    def _fill_with(self, length: int, copy: Callable[[int, int, int], object]) -> None:
        """Copy ``length`` bytes into the buffer, piece by piece (``copy(at, done, n)``: n
        bytes from ``done`` on into the buffer at ``at``), writing it each time it fills."""
        assert self._buffer is not None
        done = 0
        while done < length:
            n = min(len(self._buffer) - self._fill, length - done)
            copy(self._fill, done, n)
            self._fill, done = self._fill + n, done + n
            if self._fill == len(self._buffer):
                self._flush(self._fill)

    def finish(self) -> None:
        """Write what the buffer holds (nothing is written past the bytes given) and give
        the buffer back: the caller fsyncs and closes the file."""
        if self._buffer is None:
            return
        whole = self._fill // DIRECT_ALIGN * DIRECT_ALIGN if self.direct else 0
        if whole:
            self._flush(whole)
        if self._fill:
            # The last partial block (now first in the buffer), through the cache.
            _direct_on(self.fd, False)
            self.direct = False
            _write_all(self.fd, self._view[: self._fill])
            self._fill = 0
        self.close()

    def close(self) -> None:
        """Give the buffer back (after ``finish``, or instead of it on a failure)."""
        buffer, self._buffer = self._buffer, None
        if buffer is None:
            return
        del self._probe
        # A failed write's traceback may still hold a slice of the buffer: it is then freed
        # with the traceback, not here.
        with contextlib.suppress(BufferError):
            self._view.release()
            buffer.close()

    def _flush(self, length: int) -> None:
        """Write the buffer's first ``length`` bytes (whole blocks); keep the rest first."""
        assert self._buffer is not None
        view = self._view[:length]
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                # Refused for its alignment after all: the rest through the cache, from
                # where the file's offset stands.
                _direct_on(self.fd, False)
                self.direct = False
        rest = self._fill - length
        if rest:
            self._buffer.move(0, length, rest)
        self._fill = rest


def _direct_on(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for ``fd``; whether it is on (False where refused)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        import fcntl  # POSIX only

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except (OSError, ImportError):
        return False
    return on


def replace_file(
    target: Path, scratch: Path, size: int, fill: Callable[[DirectWriter], None]
) -> None:
    """The one way a snapshot file reaches the run directory, from the training process
    (``runtime.state.save_image``) or from the publish process (``ops._publish_child``):
    ``fill`` writes the file's ``size`` bytes into a ``DirectWriter`` on a temporary file in
    ``scratch`` (on the same file system, outside the checkpoints a pack may be reading),
    then fsync, rename over ``target``, fsync of its directory. A kill at any moment leaves
    the previous file or the new one, never a torn one; a failure leaves no litter; a full
    disk is StorageError naming ``target`` (docs/reliability.md, "Full disks")."""
    tmp = scratch / f".{target.name}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            writer = DirectWriter(fd, size)
            try:
                fill(writer)
                writer.finish()
            finally:
                writer.close()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if no_space(exc):
            raise StorageError("no space left on the device", url=str(target)) from exc
        raise
    fsync_dir(target.parent)


def no_space(exc: BaseException | None) -> bool:
    """Whether ENOSPC (or EDQUOT) caused ``exc``: torch.save reports it as a RuntimeError
    whose context is the OSError."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
