"""What this machine is, as the gate sees it: the pieces an adapter's local view is made of
(spec section 16, "The local view").

- the **data digest** of a directory, a cache key computed from the data itself: every regular
  file below it, its size and sha256, in one digest, so that a changed, added, removed or
  renamed input file changes the key;
- the **cache root** from the environment (``RESTOREPOINT_CACHE_ROOT``).

Detected values are never copied from the restore point: a view says what *this* machine has.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from ..errors import NotFound, UsageError

__all__ = ["CACHE_ROOT_ENV", "DATA_KEY", "cache_root_from_env", "data_digest"]

CACHE_ROOT_ENV = "RESTOREPOINT_CACHE_ROOT"
#: The cache key that ``--data DIR`` sets when no adapter names its own.
DATA_KEY = "data"
_BLOCK = 1 << 20


def cache_root_from_env() -> str | None:
    return os.environ.get(CACHE_ROOT_ENV) or None


def _files(root: str) -> Iterator[tuple[bytes, str]]:
    """(relative path as UTF-8 bytes, full path) of every regular file below ``root``, links
    to regular files followed, links to directories not (a link cycle cannot hang the walk)."""
    for directory, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in names:
            full = os.path.join(directory, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link: no data
            if stat.S_ISREG(st.st_mode):
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                yield os.fsencode(rel), full


def _sha256(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def data_digest(path: str | os.PathLike[str], *, threads: int | None = None) -> str:
    """``sha256:`` and the SHA-256 of the listing ``SHA256 SIZE PATH\\n`` of every regular file
    below ``path``, sorted by the paths' UTF-8 bytes (``PATH`` relative, ``/``-separated, as
    the file system spells it, a backslash and a newline escaped as sha256sum escapes them);
    a single file is listed under its base name. Files are hashed on ``threads`` threads
    (hashlib releases the GIL)."""
    root = os.fspath(path)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise NotFound("data directory not found", url=root) from None
    except OSError as exc:
        raise UsageError(f"cannot read the data ({exc.strerror})", url=root) from None
    if stat.S_ISREG(st.st_mode):
        files = [(os.fsencode(os.path.basename(os.path.abspath(root))), root)]
    elif stat.S_ISDIR(st.st_mode):
        files = sorted(_files(root))
    else:
        raise UsageError("the data is neither a directory nor a regular file", url=root)
    workers = threads or max(1, min(4, os.cpu_count() or 1))
    listing = hashlib.sha256()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="rp-data") as pool:
            for (rel, _), (size, digest) in zip(
                files, pool.map(_sha256, [full for _, full in files]), strict=True
            ):
                # As sha256sum escapes: a newline in a name cannot forge another line.
                name = rel.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
                listing.update(b"%s %d %s\n" % (digest.encode(), size, name))
    except OSError as exc:
        raise UsageError(f"cannot read the data ({exc.strerror})", url=root) from None
    return f"sha256:{listing.hexdigest()}"
