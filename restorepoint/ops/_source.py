"""The pack source: a directory (packed recursively) or one file, listed before any byte is
read so that every path rule is checked up front and sizes are known; and files whose bytes
are in memory (``InMemory``: a runtime's snapshot), which take the place of the directory's
file of the same payload path, so that what is in memory is packed without being written to
a file and read back first."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from ..errors import MalformedManifest, NotFound, SourceError
from ..format import check_paths

__all__ = ["InMemory", "SourceFile", "list_source"]


class InMemory(Protocol):
    """A payload file's bytes in memory: its size, and a stream that reads them once."""

    @property
    def size(self) -> int: ...

    def open(self) -> BinaryIO: ...


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
