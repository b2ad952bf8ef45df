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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._posix import fsync_dir, rename_exchange
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
    Manifest,
    PayloadDecoder,
    check_path,
    check_paths,
    restore_point_digest,
)
from ..storage import (
    OLD_MARK,
    STAGING_MARK,
    Location,
    leftover_name,
    parse_leftover,
    resolve,
    this_host,
    translate,
)
from ._delta import bases_for
from ._multipart import check_part, check_part_paths, missing_part, part_location, part_trust
from ._open import NO_TRUST, Trust, open_head, open_manifest
from .gate import (
    CLI_HINTS,
    CheckResult,
    Expectations,
    decide,
    recorded_world,
    refuse,
    world_mismatch,
)
from .pack import default_threads

__all__ = ["ImportResult", "import_restore_point"]

#: What an import unpacks: a manifest, the reader of its object, where its payload starts, and
#: the cipher that opens it (one object's, or each of a commit's parts).
#: A manifest, its reader, its data start, its cipher, and (incremental) its bases.
_Source = tuple[Manifest, Any, int, ChunkCipher | None, Bases | None]
#: A leftover whose writer may still be alive on another host is removed only when this old.
STALE_AFTER_S = 24 * 3600


@dataclass(frozen=True)
class ImportResult:
    """A restore point unpacked and verified in ``dest``."""

    url: str
    dest: str
    manifest: Manifest
    files: list[str]
    bytes: int
    seconds: float
    check: CheckResult

    @property
    def gated(self) -> bool:
        return self.check.gated

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
) -> ImportResult:
    """Import the restore point at ``url`` into the local directory ``dest``.

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
            replacing = _check_destination(target, force)
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
                _check_space(target, total, sum(m.file_count for m, *_ in sources))
                if on_start is not None:
                    on_start(total)
                _clean_leftovers(target)
                files = _unpack(sources, target, replacing, threads, progress)
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
        sources.append((opened.manifest, reader, opened.head.data_start, opened.cipher, None))
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


# -- step 4: staging ------------------------------------------------------------------------


def _new_name(target: str, mark: str) -> str:
    return os.path.join(os.path.dirname(target), leftover_name(os.path.basename(target), mark))


def _clean_leftovers(target: str) -> None:
    """Remove staging (and replaced) directories of earlier imports into DEST whose importer is
    gone: on this host when its process no longer exists, from elsewhere when a day old. The
    names beside DEST are anyone's: one that does not parse is kept until it is a day old, and
    no error here stops the import (U5)."""
    parent = os.path.dirname(target)
    final = os.path.basename(target)
    host = this_host()
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        leftover = parse_leftover(name, final)
        if leftover is None:
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue  # never removed (and never followed)
        gone = leftover.host == host and leftover.pid is not None and not leftover.writer_alive
        if gone or time.time() - st.st_mtime > STALE_AFTER_S:
            shutil.rmtree(path, ignore_errors=True)


class _Tree:
    """Directories under a staging root, each opened relative to its parent's descriptor
    without following any link: nothing planted on the way can redirect a write outside the
    root.

    Files arrive in payload order (strictly increasing UTF-8 bytes), so the files below any
    directory come one after another: the tree is walked depth first, with descriptors open
    only for the directories from the root to the current file (at most MAX_PATH_DEPTH, never
    one per directory of the payload, which a wide tree would run out of), no recursion, and
    each directory fsynced and closed once the walk has left it, after everything in it."""

    FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def __init__(self, root: str) -> None:
        self.root = root
        #: (name, descriptor) from the root (named "") down to the current directory
        self.chain: list[tuple[str, int]] = [("", os.open(root, self.FLAGS))]

    def _enter(self, directories: list[str]) -> int:
        depth = 0
        while (
            depth < len(directories)
            and depth + 1 < len(self.chain)
            and self.chain[depth + 1][0] == directories[depth]
        ):
            depth += 1
        while len(self.chain) > depth + 1:
            self._leave()
        for name in directories[depth:]:
            parent_fd = self.chain[-1][1]
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent_fd)
            self.chain.append((name, os.open(name, self.FLAGS, dir_fd=parent_fd)))
        return self.chain[-1][1]

    def _leave(self) -> None:
        _, fd = self.chain.pop()
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def create(self, path: str) -> int:
        *directories, name = path.split("/")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o644, dir_fd=self._enter(directories))

    def sync_and_close(self) -> None:
        # Deepest first, the root last, so that each directory's entries are durable before
        # its parent's.
        while self.chain:
            self._leave()

    def close(self) -> None:
        for _, fd in self.chain:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.chain.clear()


def _unpack(
    sources: Sequence[_Source],
    target: str,
    replacing: bool,
    threads: int | None,
    progress: Callable[[int], None] | None,
) -> list[str]:
    """Steps U4-U9: every source's files (one object's, or a commit's parts') into one
    staging tree, then into place."""
    entries = [e for manifest, *_ in sources for e in manifest.payload or ()]
    # The path rules again, on exactly what will be written (defence in depth: the reader
    # checked them too).
    for entry in entries:
        check_path(entry.path)
    check_paths(sorted((e.path for e in entries), key=lambda p: p.encode()))
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = _new_name(target, STAGING_MARK)
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
            tree = _Tree(staging)
            try:
                for manifest, reader, data_start, cipher, bases in sources:
                    stream = reader.open_stream(data_start)
                    try:
                        _write_files(manifest, stream, tree, threads, progress, cipher, bases)
                    finally:
                        stream.close()
                # Before the fsyncs, so that DEST's mode is as durable as its entries.
                os.chmod(staging, mode)
                tree.sync_and_close()
            finally:
                tree.close()
        except OSError as exc:
            raise translate(exc, target) from None
        _commit(staging, target, replacing)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [os.path.join(target, *e.path.split("/")) for e in entries]


def _write_files(  # noqa: PLR0913, PLR0917 - unpack steps U4-U9, from import_restore_point
    manifest: Manifest,
    stream: Any,
    tree: _Tree,
    threads: int | None,
    progress: Callable[[int], None] | None,
    cipher: ChunkCipher | None,
    bases: Bases | None = None,
) -> None:
    assert manifest.payload is not None
    decoder = PayloadDecoder(
        manifest, stream, threads=threads or default_threads(), cipher=cipher, bases=bases
    )
    fd = -1
    current = None
    try:
        # Every file is created in payload order, which is what lets the tree hold only one
        # chain of directories open: a file of size 0 when the decoder has checked its digest
        # (that of no bytes), any other at its first chunk.
        for entry, chunk in decoder.events():
            if chunk is None:
                if fd >= 0:
                    os.fsync(fd)
                    os.close(fd)
                    fd = -1
                elif entry.size == 0:
                    os.close(tree.create(entry.path))
                current = None
                continue
            if entry is not current:
                fd = tree.create(entry.path)
                current = entry
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            if progress is not None:
                progress(len(chunk))
    finally:
        if fd >= 0:
            os.close(fd)


# -- step 5: into place ---------------------------------------------------------------------


def _commit(staging: str, target: str, replacing: bool) -> None:
    parent = os.path.dirname(target)
    try:
        if not replacing:
            # rename(2) also replaces an empty directory atomically.
            os.rename(staging, target)
        elif rename_exchange(staging, target):
            shutil.rmtree(staging, ignore_errors=True)  # now the previous contents
        else:
            # No atomic exchange on this file system: move the old tree aside under a
            # recognisable name first. A crash between the two renames leaves DEST absent
            # and the old tree beside it, never a mixture.
            old = _new_name(target, OLD_MARK)
            os.rename(target, old)
            try:
                os.rename(staging, target)
            except BaseException:
                # Put the old tree back: a failure that is not a crash must not leave DEST
                # absent (nor the old tree under a name the next cleanup removes).
                with contextlib.suppress(OSError):
                    os.rename(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(parent)
    except OSError as exc:
        raise StorageError(
            f"cannot move the import into place ({exc.strerror})", url=target
        ) from None
