"""The import's staging tree and its commit (spec section 18, U5 to U9): files created under a
staging directory beside DEST without following any link, made durable, then renamed into place
whole; and the removal of what killed imports left beside DEST."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
import time

from .._posix import fsync_dir, rename_exchange
from ..errors import StorageError
from ..storage import OLD_MARK, leftover_name, parse_leftover, this_host, translate

__all__ = ["STALE_AFTER_S", "Staged", "Tree", "clean_leftovers", "new_name"]

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


class Staged:
    """A staging tree whose files are all written and verified (U7), not yet durable: U8 and
    U9 on request, once."""

    def __init__(
        self, staging: str, target: str, replacing: bool, mode: int, paths: list[str] | None
    ) -> None:
        self.staging, self.target, self.replacing = staging, target, replacing
        #: The files to sync at U8; None: they were synced as they were written (U7).
        self.mode, self.paths = mode, paths
        self._lock = threading.Lock()
        self._done = False

    def finish(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                try:
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
