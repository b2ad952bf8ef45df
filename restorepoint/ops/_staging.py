"""The import's staging tree and its commit (spec section 18, U5 to U9): files created under a
staging directory beside DEST without following any link, made durable, then renamed into place
whole; and the removal of what killed imports left beside DEST."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import stat
import threading
import time
from typing import Any

from .._posix import fsync_dir, rename_exchange
from ..errors import StorageError
from ..storage import OLD_MARK, leftover_name, parse_leftover, this_host, translate

__all__ = ["STALE_AFTER_S", "Staged", "StagingWriter", "Tree", "clean_leftovers", "new_name"]

#: A leftover whose writer may still be alive on another host is removed only when this old.
STALE_AFTER_S = 24 * 3600


def new_name(target: str, mark: str) -> str:
    return os.path.join(os.path.dirname(target), leftover_name(os.path.basename(target), mark))


def clean_leftovers(target: str) -> None:
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


class Tree:
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

    def sync_file(self, path: str) -> None:
        """fsync a file this import created (found as it was created: relative to its
        directory's descriptor, no link followed)."""
        *directories, name = path.split("/")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=self._enter(directories))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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


#: The end of the writer's queue (and what ``stop`` puts in it).
_END = object()


class StagingWriter:
    """U7's writes of an import in memory, on a thread of its own (``rp-stage``): the reading
    thread hands over each file's chunks in payload order (the bytes it keeps anyway, so the
    queue holds no copy), and neither waits for the disk nor spends its CPU on the copy into
    the page cache; the caller has the verified bytes as soon as every file passed R10, while
    the copy may still be on its way. Files are not fsynced here (U8 does that, after
    ``join``).

    ``written(index, offset)``: whether the writer is past byte ``offset`` of the ``index``-th
    file it was given, or done (finished or failed); ``wait_written`` blocks until it is. A
    failure (a full disk, a planted link) is kept and raised by ``join``; the writer then
    drops what it is handed, so that the bytes it held are let go. The thread ends at
    ``close`` (or ``stop``), after every file it was given; it is a daemon: a process that
    ends without joining it leaves the staging directory, as a kill would (U5 of the next
    import removes it)."""

    def __init__(self, tree: Tree, target: str) -> None:
        self._tree, self._target = tree, target
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cond = threading.Condition()
        #: (file index, bytes of it written); the index is -1 before the first file.
        self._at = (-1, 0)
        self._over = False
        self._stopping = False
        self._error: BaseException | None = None
        self._files = 0
        self._thread = threading.Thread(target=self._run, name="rp-stage", daemon=True)
        self._thread.start()

    # -- the reading thread's side: the same calls as a direct write --------------------------

    def open(self, path: str) -> int:
        """A file created (in order); returns its index."""
        self._queue.put(path)
        self._files += 1
        return self._files - 1

    def write(self, chunk: bytes | memoryview) -> None:
        self._queue.put(chunk)

    def close_file(self) -> None:
        self._queue.put(None)

    def close(self) -> None:
        """No more files: the thread ends once it has written them."""
        self._queue.put(_END)

    # -- the caller's side ------------------------------------------------------------------

    def written(self, index: int, offset: int) -> bool:
        at = self._at  # one tuple, replaced whole
        return (
            self._over
            or self._error is not None
            or at[0] > index
            or (at[0] == index and at[1] >= offset)
        )

    def wait_written(self, index: int, offset: int) -> None:
        if self.written(index, offset):
            return
        with self._cond:
            self._cond.wait_for(lambda: self.written(index, offset))

    def join(self) -> None:
        """Wait for every write; raise the first failure (StorageError)."""
        self._thread.join()
        if self._error is not None:
            raise translate(self._error, self._target) from None

    def stop(self) -> None:
        """Drop the writes not yet made and wait for the thread (its descriptors closed)."""
        self._stopping = True
        self._queue.put(_END)
        self._thread.join()

    def _run(self) -> None:
        fd, index = -1, -1
        try:
            while (item := self._queue.get()) is not _END:
                if self._stopping or self._error is not None:
                    item = None  # let go of what is handed over
                    continue
                try:
                    if isinstance(item, str):
                        fd, index = self._tree.create(item), index + 1
                        self._advance(index, 0)
                    elif item is None:
                        os.close(fd)
                        fd = -1
                        self._advance(index + 1, 0)
                    else:
                        self._advance(index, self._at[1] + _write(fd, item))
                except OSError as exc:
                    self._error = exc
                    self._advance(index, self._at[1])
                item = None  # the chunk goes as soon as it is written (and read)
        except BaseException as exc:
            # Anything else ends the writes too, and is reported as their failure: a tree
            # that is not whole must never be moved into place.
            self._error = exc
        finally:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._tree.close()
            with self._cond:
                self._over = True
                self._cond.notify_all()

    def _advance(self, index: int, done: int) -> None:
        with self._cond:
            self._at = (index, done)
            self._cond.notify_all()


def _write(fd: int, chunk: bytes | memoryview) -> int:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]
    return len(chunk)


class Staged:
    """A staging tree whose files are all verified (U7), not yet durable: U8 and U9 on
    request, once. With a ``writer`` (an import in memory), the files may still be on their
    way: U8 waits for it first."""

    def __init__(  # noqa: PLR0913 - the staging tree's state, from _unpack
        self,
        staging: str,
        target: str,
        replacing: bool,
        mode: int,
        paths: list[str] | None,
        *,
        writer: StagingWriter | None = None,
    ) -> None:
        self.staging, self.target, self.replacing = staging, target, replacing
        #: The files to sync at U8; None: they were synced as they were written (U7).
        self.mode, self.paths = mode, paths
        self.writer = writer
        self._lock = threading.Lock()
        self._done = False

    def finish(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                try:
                    if self.writer is not None:
                        self.writer.join()
                    if self.paths is not None:
                        tree = Tree(self.staging)
                        try:
                            for path in self.paths:
                                tree.sync_file(path)
                            os.chmod(self.staging, self.mode)
                            tree.sync_and_close()
                        finally:
                            tree.close()
                except OSError as exc:
                    raise translate(exc, self.target) from None
                _commit(self.staging, self.target, self.replacing)
            except BaseException:
                shutil.rmtree(self.staging, ignore_errors=True)
                raise

    def discard(self) -> None:
        with self._lock:
            if not self._done:
                self._done = True
                if self.writer is not None:
                    self.writer.stop()
                shutil.rmtree(self.staging, ignore_errors=True)


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
            old = new_name(target, OLD_MARK)
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
