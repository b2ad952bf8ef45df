"""The completeness record of a trainer's directory: one owner for what the in-process
adapters write into a directory of a trainer's files once they are all there, and check
before they trust it (the Trainer's ``checkpoint-N/restorepoint.json``, Accelerate's
``restorepoint-state.json``).

A record names each file with its size and sha256, taken from the published restore point's
index when there is one (the publish hashed every byte already), else hashed here. It is
written whole (temporary file, fsync, rename) after the files, and removed before they are
written again, so a save killed midway leaves a directory that is not complete. Read back it
is hostile: size-capped, read without blocking (a FIFO is refused), its names checked by the
spec's path rules, and every file it names compared by size, then sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._posix import FileTooLarge, NotRegularFile, atomic_write, read_regular
from .._text import printable
from ..errors import IntegrityError
from ..format import Manifest
from ..format.paths import check_paths

__all__ = [
    "Incomplete",
    "check_files",
    "hashed_index",
    "payload_index",
    "read_record",
    "sha256_file",
    "write_record",
]

#: ``{path: (size, sha256)}``: what a record says of each file.
Index = dict[str, tuple[int, str]]


class Incomplete(Exception):
    """Why a directory is not complete (one line)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hashed_index(directory: Path, names: Iterable[str]) -> Index:
    """The files ``names`` of ``directory``, hashed here (no restore point says them)."""
    return {n: ((directory / n).stat().st_size, sha256_file(directory / n)) for n in names}


def payload_index(manifest: Manifest | None, names: Iterable[str] | None = None) -> Index | None:
    """What a published restore point's index says of its files (of ``names`` only, when
    given): None when it has no payload to say it, or does not hold every one of ``names``."""
    if manifest is None or manifest.payload is None:
        return None
    index = {e.path: (e.size, e.sha256) for e in manifest.payload}
    if names is None:
        return index
    wanted = list(names)
    if any(n not in index for n in wanted):
        return None
    return {n: index[n] for n in wanted}


def write_record(path: Path, doc: Mapping[str, Any], *, keep_mtime_of: Path | None = None) -> None:
    """Write the record whole; ``keep_mtime_of``: a directory whose modification time the
    write leaves as it was (the Trainer's rotation orders checkpoints by it)."""
    before = os.stat(keep_mtime_of) if keep_mtime_of is not None else None
    atomic_write(path, json.dumps(doc, sort_keys=True).encode() + b"\n")
    if keep_mtime_of is not None and before is not None:
        os.utime(keep_mtime_of, ns=(before.st_atime_ns, before.st_mtime_ns))


def read_record(path: Path, record_format: str, limit: int) -> dict[str, Any]:
    """The record at ``path`` as a JSON object of ``record_format``; Incomplete otherwise."""
    name = path.name
    try:
        raw = read_regular(path, limit=limit)
    except FileNotFoundError:
        raise Incomplete(f"no {name} (never completed, or written without restorepoint)") from None
    except (NotRegularFile, FileTooLarge, OSError) as exc:
        raise Incomplete(f"{name} cannot be read ({printable(str(exc))})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Incomplete(f"{name} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != record_format:
        raise Incomplete(f"{name} is not a {record_format} record")
    return doc


def check_files(directory: Path, files: Mapping[str, tuple[int, str]], record: str) -> None:
    """Every file ``files`` names is in ``directory`` (not a link), with its size and sha256;
    Incomplete, saying which is not, otherwise. The names pass the spec's path rules first
    (``record``: the record's name, for that message)."""
    try:
        check_paths(sorted(files, key=lambda p: p.encode()))
    except (IntegrityError, TypeError) as exc:
        raise Incomplete(f"{record} lists a path that is not allowed ({exc})") from None
    for rel, (size, sha256) in sorted(files.items()):
        path = directory / rel
        shown = printable(rel)
        try:
            if path.is_symlink() or not path.is_file():
                raise Incomplete(f"{shown} is missing")
            actual = path.stat().st_size
            if actual != size:
                raise Incomplete(f"{shown} has {actual} bytes, not {size}")
            if sha256_file(path) != sha256:
                raise Incomplete(f"{shown} differs from the record (sha256)")
        except OSError as exc:
            raise Incomplete(f"{shown} cannot be read ({exc.strerror})") from None
