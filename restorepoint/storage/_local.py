"""Local paths and file:// URLs: POSIX files, published by a rename (spec 15.1)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO, ClassVar

from .._direct import DIRECT_MIN, DirectWriter
from .._posix import fsync_dir
from ..errors import StorageError
from ._base import (
    Abilities,
    Location,
    ObjectInfo,
    ObjectReader,
    Publisher,
    TranslatingStream,
    join_url,
)
from ._errors import translate, translating
from ._names import partial_name

__all__ = ["LocalLocation"]


class _LocalReader:
    def __init__(self, url: str, path: str) -> None:
        self.url = url
        with translating(url):
            # One descriptor for every read: a rename over the path while we read cannot mix
            # two objects. O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer
            # (forever), before fstat could tell that it is not a file; the type is checked on
            # the descriptor itself, so a path swapped after a stat cannot slip through.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise StorageError("not a regular file", url=url)
                os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
            self._file = os.fdopen(fd, "rb", buffering=0)
        self._size = st.st_size

    @property
    def size(self) -> int:
        return self._size

    def read_range(self, start: int, end: int) -> bytes:
        # pread allocates the whole count first: an end far past the object must not.
        count = min(end, self._size) - start
        if count <= 0:
            return b""
        with translating(self.url):
            return os.pread(self._file.fileno(), count, start)

    def open_stream(self, start: int) -> BinaryIO:
        with translating(self.url):
            fd = os.dup(self._file.fileno())
            stream = os.fdopen(fd, "rb", buffering=1 << 20)
            stream.seek(start)
            return TranslatingStream(_ReadAhead(stream, start), self.url)  # type: ignore[return-value]

    def close(self) -> None:
        self._file.close()


#: How far ahead of a stream's reads the kernel is asked to read (``_ReadAhead``).
READ_AHEAD = 64 << 20


class _ReadAhead:
    """A sequential read stream that keeps the kernel reading up to READ_AHEAD bytes ahead
    of it (``posix_fadvise(WILLNEED)``, a window at a time): a payload read from a cold disk
    then waits for the disk less, its chunks' decoding and hashing overlapping the reads
    instead of alternating with them (a resume of 1 GiB from a cold local store: 0.94 to
    0.99 s against 0.99 to 1.62 s, docs/performance.md). Nothing is held beyond the page
    cache, which the kernel reclaims as it needs."""

    def __init__(self, inner: BinaryIO, start: int) -> None:
        self._inner = inner
        self._position = start
        self._advised = start
        self._advise = hasattr(os, "posix_fadvise")

    def read(self, n: int = -1) -> bytes:
        if self._advise and self._position + READ_AHEAD // 2 >= self._advised:
            start = max(self._advised, self._position)
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._inner.fileno(), start, READ_AHEAD, os.POSIX_FADV_WILLNEED)
            self._advised = start + READ_AHEAD
        data = self._inner.read(n)
        self._position += len(data)
        return data

    def close(self) -> None:
        self._inner.close()


class _LocalPublisher:
    """A new object: written to a temporary name beside it, fsynced, then renamed (or linked,
    create-only) into place. A restore point (``size_hint`` at least DIRECT_MIN) is written
    past the page cache (``DirectWriter``): nothing reads it back soon, and its cached pages
    would cost fresh memory and writeback while training runs."""

    def __init__(self, url: str, path: str, create_only: bool, size_hint: int = 0) -> None:
        self.url = url
        self.path = path
        self.create_only = create_only
        self.directory = os.path.dirname(path) or "."
        self.writer: DirectWriter | None = None
        with translating(url):
            os.makedirs(self.directory, exist_ok=True)
            self.temp = os.path.join(self.directory, partial_name(os.path.basename(path)))
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            if size_hint >= DIRECT_MIN:
                self.writer = DirectWriter(self.fd, size_hint)

    def write(self, data: bytes | memoryview) -> None:
        with translating(self.url):
            if self.writer is not None:
                self.writer.write(data)
                return
            view = memoryview(data)
            while view:
                n = os.write(self.fd, view)
                view = view[n:]

    def commit(self) -> None:
        with translating(self.url):
            if self.writer is not None:
                self.writer.finish()
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            if self.create_only:
                # link() fails if the name exists: a create-only publish never replaces.
                os.link(self.temp, self.path)
                os.unlink(self.temp)
            else:
                os.replace(self.temp, self.path)
            fsync_dir(self.directory)

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


class LocalLocation(Location):
    abilities: ClassVar[Abilities] = Abilities(atomic_rename=True, create_only=True)

    def __init__(self, url: str, path: str) -> None:
        self.url = url
        self.path = os.path.abspath(path)

    def reader(self) -> ObjectReader:
        return _LocalReader(self.url, self.path)

    def join(self, name: str) -> Location:
        return LocalLocation(join_url(self.url, name), os.path.join(self.path, *name.split("/")))

    def beside(self, name: str) -> Location:
        url = self.url.rstrip("/")
        url = f"{url.rsplit('/', 1)[0]}/{name}" if "/" in url else name
        return LocalLocation(url, os.path.join(os.path.dirname(self.path), *name.split("/")))

    def up(self) -> Location:
        url = self.url.rstrip("/")
        parent = url.rsplit("/", 1)[0] if "/" in url else "."
        return LocalLocation(parent, os.path.dirname(self.path))

    def list_objects(self) -> list[ObjectInfo]:
        return sorted(self.iter_objects(), key=lambda o: o.name)

    def iter_objects(self) -> Iterator[ObjectInfo]:
        # One top-level entry (a run's directory) at a time, sorted within it: the store's
        # listing is never held whole (fsck on a store of 100k objects).
        if not os.path.isdir(self.path):
            return
        with translating(self.url):
            for top in sorted(os.listdir(self.path)):
                full = os.path.join(self.path, top)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # removed while we listed
                if stat.S_ISDIR(st.st_mode):
                    yield from sorted(self._walk(full), key=lambda o: o.name)
                elif stat.S_ISREG(st.st_mode):
                    yield ObjectInfo(top, join_url(self.url, top), st.st_size, st.st_mtime)

    def _walk(self, root: str) -> Iterator[ObjectInfo]:
        def onerror(exc: OSError) -> None:
            raise translate(exc, self.url)

        for directory, _dirs, names in os.walk(root, onerror=onerror):
            for name in names:
                full = os.path.join(directory, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # removed while we listed
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = os.path.relpath(full, self.path).replace(os.sep, "/")
                yield ObjectInfo(rel, join_url(self.url, rel), st.st_size, st.st_mtime)

    def delete(self) -> None:
        with translating(self.url):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                return

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        return _LocalPublisher(self.url, self.path, create_only, size_hint)
