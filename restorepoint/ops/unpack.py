"""import: gate, download, verify and safely unpack a restore point into a local directory.

The importer's algorithm (spec section "Import"), step by step:

1. read the head from a bounded prefix and apply the gate: a refusal writes nothing;
2. check DEST (absent, an empty directory, or replaced only with ``force``);
3. read the footer and index (every structural check), and the free space under DEST;
4. unpack into a fresh staging directory beside DEST, every file created exclusively and
   without following links, every chunk decoded and every file's sha256 checked as it streams;
5. only when every file verified, rename the staging directory into place (an atomic exchange
   when replacing), then fsync the parent.

A failure at any step, a SIGKILL included, leaves DEST as it was; a killed import leaves a
recognisable staging directory that the next import beside the same DEST removes.

An import ``in_memory`` keeps every file's verified plain bytes as well (``Contents``: the
decoded chunks, no copy to join them) and leaves step 5 to ``ImportResult.finish``: a caller
that loads the bytes (the runtime's resume) has them as soon as every file verified, without
waiting for the fsyncs or reading the files back, and moves the copy into place afterwards, on
any thread. With ``copy=False`` it makes no copy at all: nothing is written anywhere (the
runtime's resume from a store that is a local path).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._text import plural
from ..errors import (
    DestinationError,
    IncompatibleRestorePoint,
    NotFound,
    StorageError,
    UsageError,
    at_url,
)
from ..format import (
    Bases,
    ChunkCipher,
    Entry,
    Manifest,
    PayloadDecoder,
    check_path,
    check_paths,
    restore_point_digest,
)
from ..storage import STAGING_MARK, Location, resolve, translate
from ._contents import Contents, file_buffer
from ._delta import bases_for
from ._multipart import check_part, check_part_paths, missing_part, part_location, part_trust
from ._open import NO_TRUST, Trust, open_head, open_manifest
from ._staging import Staged, StagingWriter, Tree, new_name
from ._staging import clean_leftovers as _clean_leftovers
from ._threads import default_threads
from .gate import (
    CLI_HINTS,
    CheckResult,
    Expectations,
    decide,
    recorded_world,
    refuse,
    world_mismatch,
)

__all__ = ["Contents", "ImportResult", "import_restore_point"]
#: The staging tree by its old name (tests patch it here).
_Tree = Tree
#: What an import unpacks: a manifest, the reader of its object, where its payload starts, and
#: the cipher that opens it (one object's, or each of a commit's parts).
#: A manifest, its reader, its data start, its cipher, and (incremental) its bases.
_Source = tuple[Manifest, Any, int, ChunkCipher | None, Bases | None]


@dataclass(frozen=True)
class ImportResult:
    """A restore point unpacked and verified in ``dest``; with ``in_memory``, verified and
    kept in ``contents`` (payload path: plain bytes), its copy in ``dest`` landing when
    ``finish`` is called."""

    url: str
    dest: str
    manifest: Manifest
    files: list[str]
    bytes: int
    seconds: float
    check: CheckResult
    contents: Mapping[str, Contents] | None = None
    _staged: Staged | None = field(default=None, repr=False, compare=False)

    @property
    def gated(self) -> bool:
        return self.check.gated

    def finish(self) -> None:
        """An import ``in_memory``: make the staged copy durable and move it into ``dest``
        (steps U8 and U9: every file and directory fsynced, then the rename). Safe to call
        from any thread, and more than once; on a failure (StorageError) the staging
        directory is removed and ``dest`` is as it was. A process that ends before it leaves
        the staging directory, which the next import beside ``dest`` removes."""
        if self._staged is not None:
            self._staged.finish()

    def discard(self) -> None:
        """Remove the staged copy of an import ``in_memory`` that will not be finished."""
        if self._staged is not None:
            self._staged.discard()

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "dest": self.dest,
            "files": self.files,
            "gated": self.check.gated,
            "id": self.manifest.id,
            "ok": True,
            "position": self.manifest.position.to_dict(),
            "seconds": round(self.seconds, 6),
            "url": self.url,
        }


def import_restore_point(  # noqa: PLR0913 - public API: the import's keyword options (gate, trust, progress)
    url: str | Location,
    dest: str | os.PathLike[str],
    *,
    expect: Expectations | Sequence[Expectations] | None = None,
    strict: bool = False,
    defer: Iterable[str] = (),
    hints: Mapping[str, str] = CLI_HINTS,
    force: bool = False,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    trust: Trust = NO_TRUST,
    rank: int | None = None,
    world_size: int | None = None,
    in_memory: bool = False,
    copy: bool = True,
) -> ImportResult:
    """Import the restore point at ``url`` into the local directory ``dest``.

    ``in_memory``: also keep every file's verified plain bytes (``ImportResult.contents``),
    and return before the copy in ``dest`` is made durable and moved into place, which the
    caller does with ``ImportResult.finish()`` (or ``discard()``). The payload must fit in
    the memory available too (StorageError, exit 4, before anything is written).
    ``copy=False`` (with ``in_memory``): the bytes are only kept, and nothing is written;
    DEST is neither checked nor made (``files`` is empty, ``finish`` does nothing).

    A multi-part restore point (spec section 25) is imported whole, every part's files in one
    tree, or with ``rank`` only the shared part and that rank's. ``world_size`` is the world
    this import resumes: one the restore point was not made by is refused
    (IncompatibleRestorePoint) unless its state is declared reshardable.

    With ``trust``, signatures are checked (before the gate reads the head, and again over
    the whole manifest) and an encrypted payload is decrypted with ``trust.identity`` as it is
    unpacked; a missing or wrong key is a DecryptionError before anything is written.

    ``expect`` is one view of what this machine expects, or several (all must be met);
    ``strict`` refuses a field the restore point records that no view knows (spec section 16:
    every resume gates so), except the ``defer``red ones.

    Raises IncompatibleRestorePoint (exit 3) when ``expect`` is not met, DestinationError
    (exit 2) when DEST is not empty and ``force`` is not set, an IntegrityError (exit 1) when
    the restore point is not sound, a StorageError (exit 4) when it cannot be read or DEST has
    no room. In every one of these cases DEST is as it was."""
    if not copy and not in_memory:
        raise UsageError("an import that makes no copy must keep the bytes in memory")
    started = time.perf_counter()
    location = resolve(url, storage_options)
    target = os.path.abspath(os.fspath(dest))
    with at_url(location.url):
        reader = location.reader()
        try:
            gated = open_head(reader, trust)
            head = gated.head
            result = decide(
                location.url, head.manifest, expect, strict=strict, defer=defer, hints=hints
            )
            if not result.compatible:
                raise refuse(result)
            _check_world(location.url, head.manifest, rank, world_size)
            # Kept only: nothing is written, so DEST is not the import's business.
            keep_only = in_memory and not copy
            replacing = False if keep_only else _check_destination(target, force)
            # The head the gate decided on, not a second read of it (section 18, U3).
            opened = open_manifest(reader, trust, need_key=True, gated=gated)
            head, manifest = opened.head, opened.manifest
            assert manifest is not None
            readers = [reader]
            try:
                bases = bases_for(location, manifest)
                if bases is not None:
                    readers.append(bases)  # type: ignore[arg-type] # closed alike
                sources: list[_Source] = [(manifest, reader, head.data_start, opened.cipher, bases)]
                if manifest.parts is not None:
                    # On another world size (a reshardable state) a rank needs every part.
                    whole = world_size not in (None, manifest.parts.world_size)
                    sources = _open_parts(
                        location, manifest, None if whole else rank, trust, readers
                    )
                total = sum(m.total_size for m, *_ in sources)
                if not keep_only:
                    _check_space(target, total, sum(m.file_count for m, *_ in sources))
                if in_memory:
                    _check_memory(target, total)
                if on_start is not None:
                    on_start(total)
                kept: dict[str, Contents] | None = {} if in_memory else None
                if keep_only:
                    assert kept is not None
                    files, staged = _keep(sources, threads, progress, kept)
                else:
                    _clean_leftovers(target)
                    files, staged = _unpack(sources, target, replacing, threads, progress, kept)
            finally:
                for other in readers[1:]:
                    other.close()
        finally:
            reader.close()
    return ImportResult(
        url=location.url,
        dest=target,
        manifest=manifest,
        files=files,
        bytes=total,
        seconds=time.perf_counter() - started,
        check=result,
        contents=kept,
        _staged=staged,
    )


# -- step 2: the destination ----------------------------------------------------------------


def _check_destination(target: str, force: bool) -> bool:
    """Whether DEST exists with contents that will be replaced; refuse what cannot be."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot inspect the destination ({exc.strerror})", url=target) from None
    if stat.S_ISLNK(st.st_mode):
        raise DestinationError("the destination is a symbolic link; give its target", url=target)
    if not stat.S_ISDIR(st.st_mode):
        raise DestinationError("the destination exists and is not a directory", url=target)
    try:
        empty = not os.listdir(target)
    except OSError as exc:
        raise StorageError(f"cannot list the destination ({exc.strerror})", url=target) from None
    if empty:
        return False
    if not force:
        raise DestinationError(
            "the destination is not empty (use --force to replace it atomically)", url=target
        )
    return True


def _check_world(url: str, head: Manifest, rank: int | None, world_size: int | None) -> None:
    """A part is no restore point; a rank must exist; the world must be the restore point's
    unless its state reshards (the gate's rule, spec 25.4)."""
    if head.part is not None:
        raise IncompatibleRestorePoint(
            "this is one part of a multi-part restore point, not a restore point: import its "
            "commit (with --rank)",
            url=url,
        )
    world = recorded_world(head)
    if rank is not None and not 0 <= rank < (world_size or world):
        raise UsageError(f"rank {rank} is not below the world size {world_size or world}")
    found = None if world_size is None else world_mismatch(head, world_size, None)
    if found is not None:
        assert world_size is not None  # a mismatch is found only for a world size given
        raise IncompatibleRestorePoint(
            f"refusing to resume on {plural(world_size, 'rank')}: the restore point was made "
            f"by {world} and its state is not declared reshardable",
            url=url,
            mismatches=[found.to_dict()],
            details=[found.describe()],
        )


def _open_parts(
    location: Location,
    commit: Manifest,
    rank: int | None,
    trust: Trust,
    readers: list[Any],
) -> list[_Source]:
    """Every part this import needs, each opened and checked to be the one the commit names
    before any byte of any is written; their files must not overlap. On another world size a
    reshardable state needs every part (the engine reads what it needs)."""
    assert commit.parts is not None
    if rank is not None and rank >= commit.parts.world_size:
        rank = None
    sources: list[_Source] = []
    for ref in commit.parts.for_rank(rank):
        where = part_location(location, ref)
        with at_url(where.url):
            try:
                reader = where.reader()
                readers.append(reader)
                opened = open_manifest(reader, part_trust(trust), need_key=True)
            except NotFound:
                raise missing_part(ref, where.url) from None
            assert opened.manifest is not None
            assert opened.tail is not None
            digest = restore_point_digest(
                opened.manifest.id, opened.head.head_sha256, opened.tail.index_sha256
            )
            check_part(commit, ref, opened.manifest, digest=digest, size=reader.size, url=where.url)
        # An incremental part reads its frames from its bases, beside it (spec 28.7).
        bases = bases_for(where, opened.manifest)
        if bases is not None:
            readers.append(bases)
        sources.append((opened.manifest, reader, opened.head.data_start, opened.cipher, bases))
    check_part_paths(m for m, *_ in sources)
    return sources


def _check_space(target: str, total: int, files: int) -> None:
    parent = os.path.dirname(target)
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    need = total + 4096 * (files + 1)
    try:
        free = shutil.disk_usage(parent or ".").free
    except OSError:
        return
    if free < need:
        raise StorageError(
            f"not enough space for the payload: {need} bytes needed, {free} free",
            url=target,
            expected=need,
            found=free,
        )


def _check_memory(target: str, total: int) -> None:
    """An import in memory holds the plain bytes: refuse one that the memory available (the
    kernel's estimate, page cache it can reclaim included) cannot hold, before anything is
    written."""
    try:
        with open("/proc/meminfo", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        free = int(fields[b"MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return  # not Linux: the allocation itself is the check
    if free < total:
        raise StorageError(
            f"not enough memory for the payload: {total} bytes needed, {free} available",
            url=target,
            expected=total,
            found=free,
        )


# -- step 4: staging ------------------------------------------------------------------------


def _unpack(  # noqa: PLR0913, PLR0917 - steps U6-U9, from import_restore_point
    sources: Sequence[_Source],
    target: str,
    replacing: bool,
    threads: int | None,
    progress: Callable[[int], None] | None,
    kept: dict[str, Contents] | None,
) -> tuple[list[str], Staged | None]:
    """Steps U6-U9: every source's files (one object's, or a commit's parts') into one
    staging tree, then into place; with ``kept`` (an import in memory), every file's bytes
    kept there too, and U8-U9 left to the ``Staged`` returned."""
    entries = _checked_entries(sources)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = new_name(target, STAGING_MARK)
        # Made with DEST's mode first, to learn it (0755 less the umask, or what a default ACL
        # gives) without umask(2), which would change the mask of every thread for a moment;
        # then closed to others until the move (empty and not writable by others meanwhile).
        os.mkdir(staging, 0o755)
    except OSError as exc:
        raise StorageError(
            f"cannot create the staging directory ({exc.strerror})", url=target
        ) from None
    try:
        try:
            mode = stat.S_IMODE(os.lstat(staging).st_mode)
            os.chmod(staging, 0o700)
            writer = _stage(sources, staging, mode, target, threads, progress, kept)
        except OSError as exc:
            raise translate(exc, target) from None
        paths = None if writer is None else [e.path for e in entries]
        staged = Staged(staging, target, replacing, mode, paths, writer=writer)
        if writer is None:
            staged.finish()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [os.path.join(target, *e.path.split("/")) for e in entries], (
        None if kept is None else staged
    )


def _keep(
    sources: Sequence[_Source],
    threads: int | None,
    progress: Callable[[int], None] | None,
    kept: dict[str, Contents],
) -> tuple[list[str], None]:
    """Step U7 of an import in memory that makes no copy: every source's files decoded and
    verified into ``kept``, nothing written (no staging tree, so U5, U8 and U9 have nothing to
    do). Returns what ``_unpack`` does: no file, nothing staged."""
    _checked_entries(sources)
    _decode_all(sources, _NoCopy(), threads, progress, kept)
    return [], None


def _checked_entries(sources: Sequence[_Source]) -> list[Entry]:
    """Every source's entries, their paths checked again on exactly what will be unpacked
    (defence in depth: the reader checked them too)."""
    entries = [e for manifest, *_ in sources for e in manifest.payload or ()]
    for entry in entries:
        check_path(entry.path)
    check_paths(sorted((e.path for e in entries), key=lambda p: p.encode()))
    return entries


def _decode_all(
    sources: Sequence[_Source],
    sink: _Direct | StagingWriter | _NoCopy,
    threads: int | None,
    progress: Callable[[int], None] | None,
    kept: dict[str, Contents] | None,
) -> None:
    """Step U7 over every source, in order, into ``sink`` (and ``kept``)."""
    for manifest, reader, data_start, cipher, bases in sources:
        stream = reader.open_stream(data_start)
        try:
            _write_files(manifest, stream, sink, threads, progress, cipher, bases, kept)
        finally:
            stream.close()


def _stage(  # noqa: PLR0913, PLR0917 - step U7 (and U8 on disk), from _unpack
    sources: Sequence[_Source],
    staging: str,
    mode: int,
    target: str,
    threads: int | None,
    progress: Callable[[int], None] | None,
    kept: dict[str, Contents] | None,
) -> StagingWriter | None:
    """Every source's files into the staging tree, each verified. On disk (``kept`` None),
    written and fsynced here (U7, U8); in memory, kept, and written by a ``StagingWriter``,
    returned still writing: the caller has the bytes without waiting for the disk."""
    tree = Tree(staging)
    try:
        # In memory, the writes go to a thread of their own, which owns the tree from here
        # (and closes it when it ends).
        sink: _Direct | StagingWriter = (
            _Direct(tree) if kept is None else StagingWriter(tree, target)
        )
    except BaseException:
        tree.close()
        raise
    try:
        _decode_all(sources, sink, threads, progress, kept)
        if isinstance(sink, StagingWriter):
            sink.close()
            return sink
        # Before the fsyncs, so that DEST's mode is as durable as its entries.
        os.chmod(staging, mode)
        tree.sync_and_close()
        return None
    except BaseException:
        if isinstance(sink, StagingWriter):
            sink.stop()
        raise
    finally:
        if isinstance(sink, _Direct):
            sink.close()
            tree.close()


def _write_files(  # noqa: PLR0913, PLR0917 - unpack steps U4-U9, from import_restore_point
    manifest: Manifest,
    stream: Any,
    sink: _Direct | StagingWriter | _NoCopy,
    threads: int | None,
    progress: Callable[[int], None] | None,
    cipher: ChunkCipher | None,
    bases: Bases | None = None,
    kept: dict[str, Contents] | None = None,
) -> None:
    assert manifest.payload is not None
    # Without a copy, each file's chunks are decoded into one buffer of its own, which a
    # reader may then make its tensors of without copying them (``Contents.share``).
    placed: dict[str, tuple[memoryview, bool]] = {}

    def place(entry: Entry) -> memoryview:
        placed[entry.path] = file_buffer(entry.size)
        return placed[entry.path][0]

    decoder = PayloadDecoder(
        manifest,
        stream,
        threads=threads or default_threads(),
        cipher=cipher,
        bases=bases,
        held=kept is not None,
        places=place if kept is not None and isinstance(sink, _NoCopy) else None,
    )
    current = None
    # Every file is created in payload order, which is what lets the tree hold only one chain
    # of directories open: a file of size 0 when the decoder has checked its digest (that of
    # no bytes), any other at its first chunk.
    for entry, chunk in decoder.events():
        if chunk is None:
            if current is None:
                _create(sink, entry.path, kept)
            sink.close_file()
            current = None
            continue
        if entry is not current:
            _create(sink, entry.path, kept)
            current = entry
            if kept is not None and entry.path in placed:
                kept[entry.path].adopt(*placed.pop(entry.path))
        if kept is not None:
            kept[entry.path].append(chunk)
        sink.write(chunk)
        if progress is not None:
            progress(len(chunk))


def _create(
    sink: _Direct | StagingWriter | _NoCopy, path: str, kept: dict[str, Contents] | None
) -> None:
    """The file ``path`` created in the staging tree (and its bytes' place in ``kept``)."""
    index = sink.open(path)
    if kept is not None:
        assert not isinstance(sink, _Direct)
        kept[path] = Contents(sink if isinstance(sink, StagingWriter) else None, index)


class _NoCopy:
    """U7's sink of an import in memory that makes no copy: nothing is written."""

    def open(self, path: str) -> int:
        return -1

    def write(self, chunk: bytes | memoryview) -> None:
        pass

    def close_file(self) -> None:
        pass


class _Direct:
    """U7's writes on the reading thread (an import to disk): each file fsynced as it ends."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.fd = -1
        self.wrote = False

    def open(self, path: str) -> int:
        self.fd, self.wrote = self.tree.create(path), False
        return -1

    def write(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]
        self.wrote = True

    def close_file(self) -> None:
        fd, self.fd = self.fd, -1
        try:
            if self.wrote:  # a file of size 0 has nothing to sync (its entry is the directory's)
                os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """After a failure: the file being written, closed."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
