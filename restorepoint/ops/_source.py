"""The pack source: a directory (packed recursively) or one file, listed before any byte is
read so that every path rule is checked up front and sizes are known; and files whose bytes
are in memory (``InMemory``: a runtime's snapshot), which take the place of the directory's
file of the same payload path, so that what is in memory is packed without being written to
a file and read back first."""

from __future__ import annotations

import ctypes
import io
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from ..errors import MalformedManifest, NotFound, SourceError
from ..format import check_paths

__all__ = ["BytesFile", "InMemory", "PiecesReader", "SourceFile", "list_source"]


class InMemory(Protocol):
    """A payload file's bytes in memory: its size, and a stream that reads them once."""

    @property
    def size(self) -> int: ...

    def open(self) -> BinaryIO: ...


class BytesFile:
    """A small payload file in memory (a position sidecar): an InMemory of ``data``."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def size(self) -> int:
        return len(self.data)

    def open(self) -> BinaryIO:
        return io.BytesIO(self.data)


#: A piece of an in-memory file: bytes, or (address, length) of memory that ``fetch`` copies.
Piece = bytes | tuple[int, int]


class PiecesReader(io.RawIOBase):
    """An in-memory file laid out as pieces, read in order (or from where ``seek`` puts it:
    an incremental publish hashes a sample of chunks before it writes, spec 28.4, W4c), each
    read one copy into a buffer of its own. A subclass says where a read's buffer is
    (``allocate``: its address, and the read-only view returned) and how memory is copied
    (``fetch``: out of this process's tensors, or out of another process)."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        super().__init__()
        self._pieces = list(pieces)
        self._size = sum(len(p) if isinstance(p, bytes) else p[1] for p in self._pieces)
        self._piece = 0
        self._at = 0
        self._done = 0

    def allocate(self, size: int) -> tuple[int, memoryview]:
        raise NotImplementedError

    def fetch(self, into: int, address: int, length: int) -> None:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._done

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._done, io.SEEK_END: self._size}[whence]
        target = min(max(0, base + offset), self._size)
        self._piece, self._at, self._done = 0, target, target
        for piece in self._pieces:
            length = len(piece) if isinstance(piece, bytes) else piece[1]
            if self._at < length:
                break
            self._at -= length
            self._piece += 1
        return target

    def read(self, n: int = -1, /) -> bytes:
        want = min(self._size - self._done, self._size if n is None or n < 0 else n)
        if want <= 0:
            return b""
        base, view = self.allocate(want)
        got = 0
        while got < want:
            piece = self._pieces[self._piece]
            length = len(piece) if isinstance(piece, bytes) else piece[1]
            take = min(want - got, length - self._at)
            if isinstance(piece, bytes):
                ctypes.memmove(base + got, piece[self._at : self._at + take], take)
            else:
                self.fetch(base + got, piece[0] + self._at, take)
            got += take
            self._at += take
            if self._at == length:
                self._piece += 1
                self._at = 0
        self._done += want
        return view  # type: ignore[return-value]


@dataclass(frozen=True)
class SourceFile:
    path: str  # payload path: relative, "/"-separated
    location: str  # where to read it (for an in-memory file: where it stands in for)
    size: int
    #: The stream of an in-memory file; None: open ``location``.
    opener: Callable[[], BinaryIO] | None = None


def list_source(
    source: str,
    include: Sequence[str] | None = None,
    memory: Mapping[str, InMemory] | None = None,
) -> list[SourceFile]:
    """Every regular file under ``source`` in payload order. Symbolic links are followed only
    when they lead to a regular file inside the source; anything else that is not a regular
    file (a link out of the source, a FIFO, a device, a socket) is refused. ``memory``: payload
    files read from memory, in the place of the source's file of the same path (or beside the
    source's files); ``source`` is then a directory. ``include``, when given, keeps only those
    payload paths (an adapter's snapshot files)."""
    try:
        st = os.stat(source)
    except FileNotFoundError:
        raise NotFound("source not found", url=source) from None
    except OSError as exc:
        raise SourceError(f"cannot read the source ({exc.strerror})", url=source) from None
    if stat.S_ISREG(st.st_mode):
        files = [SourceFile(os.path.basename(os.path.abspath(source)), source, st.st_size)]
    elif stat.S_ISDIR(st.st_mode):
        files = _walk(source)
    else:
        raise SourceError("the source is neither a regular file nor a directory", url=source)
    if memory:
        if not stat.S_ISDIR(st.st_mode):
            raise SourceError("files from memory go into a directory source", url=source)
        files = [f for f in files if f.path not in memory] + [
            SourceFile(path, os.path.join(source, path), item.size, item.open)
            for path, item in memory.items()
        ]
    if include is not None:
        wanted = set(include)
        files = [f for f in files if f.path in wanted]
        missing = wanted - {f.path for f in files}
        if missing:
            raise SourceError(f"not in the source: {', '.join(sorted(missing))}", url=source)
    files.sort(key=lambda f: f.path.encode("utf-8", errors="surrogateescape"))
    try:
        check_paths(f.path for f in files)
    except MalformedManifest as exc:
        raise SourceError(f"cannot be packed: {exc.message}", url=source) from None
    return files


def _walk(root: str) -> list[SourceFile]:
    real_root = os.path.realpath(root)
    out: list[SourceFile] = []

    def fail(where: str, why: str) -> SourceError:
        return SourceError(why, url=os.path.join(root, where))

    def onerror(exc: OSError) -> None:
        raise SourceError(f"cannot read ({exc.strerror})", url=exc.filename)

    for directory, dirs, names in os.walk(root, onerror=onerror, followlinks=False):
        rel_dir = os.path.relpath(directory, root)
        for name in list(dirs):
            full = os.path.join(directory, name)
            if os.path.islink(full):
                raise fail(
                    os.path.join(rel_dir, name), "symbolic link to a directory is not packed"
                )
        for name in names:
            full = os.path.join(directory, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            try:
                lst = os.lstat(full)
            except FileNotFoundError:
                # Removed since the directory was listed (a trainer's temporary file renamed
                # into place): it is not part of the source any more.
                continue
            if stat.S_ISLNK(lst.st_mode):
                target = os.path.realpath(full)
                if os.path.commonpath([real_root, target]) != real_root:
                    raise fail(rel, "symbolic link leads out of the source")
                try:
                    lst = os.stat(target)
                except FileNotFoundError:
                    raise fail(rel, "dangling symbolic link") from None
                full = target
            if not stat.S_ISREG(lst.st_mode):
                raise fail(rel, "not a regular file (FIFO, socket or device)")
            out.append(SourceFile(rel.replace(os.sep, "/"), full, lst.st_size))
    return out
