"""Where a ResumableRun resumes from, besides its own run directory: a restore point a supervisor
imported for it (``restorepoint run --resume-from``), or the store's newest restore point of the
run. Each passes the strict gate against the run's local view first (spec section 16.4); a
refusal names the restore point by its URL, never by a private directory."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import NotFound, RestorePointError
from ..ops import Expectations, latest
from ..ops.gate import decide, refuse
from ..ops.resume import choose, read_head_file, resume_import
from ..ops.resumed import ResumeMarker
from ..ops.store import _store
from ..ops.unpack import ImportResult
from ..storage import LocalLocation, resolve
from .contract import RESUME_DIR_ENV, RESUME_HEAD_ENV, RESUME_URL_ENV
from .held import Held

if TYPE_CHECKING:
    from .run import ResumableRun

__all__ = [
    "RUNTIME_HINTS",
    "Landing",
    "display",
    "gate_handed",
    "handed",
    "mark",
    "store_snapshot",
]

log = logging.getLogger("restorepoint.torch")

#: What a refusal says to give, in the runtime's words.
RUNTIME_HINTS = {
    "trainer": "give ResumableRun(trainer=...)",
    "terms": "give ResumableRun(terms=...)",
    "cache_root": "give ResumableRun(cache_root=...) or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give ResumableRun(cache_keys=...)",
    "config": "give ResumableRun(config)",
}


def handed(rank_file: str) -> Path | None:
    """The payload of a restore point a supervisor imported for this run, if any."""
    directory = os.environ.get(RESUME_DIR_ENV)
    if directory and (Path(directory) / rank_file).exists():
        return Path(directory)
    return None


def display(path: Path, rank_file: str) -> str:
    """What a message calls ``path``: a supervisor's import by its URL (the supervisor's
    private directory means nothing to the user), anything else by its path."""
    imported, url = handed(rank_file), os.environ.get(RESUME_URL_ENV)
    if url and imported is not None and path.is_relative_to(imported):
        return url
    return str(path)


def gate_handed(imported: Path, view: Expectations, rank_file: str) -> None:
    """A supervisor's import, gated here: the supervisor compared what it knows; the run knows
    the rest (its trainer, config, cache keys) and compares everything again."""
    head_file = os.environ.get(RESUME_HEAD_ENV) or str(imported) + ".head.json"
    head = read_head_file(head_file)
    url = display(imported, rank_file)
    result = decide(url, head, [view], strict=True, hints=RUNTIME_HINTS)
    if not result.compatible:
        raise refuse(result)


def store_snapshot(run: ResumableRun, local_step: int) -> tuple[Path, str, Landing | None] | None:
    """The store's newest restore point of this run, imported, when it is further on than the
    run directory's snapshot. Imported in memory (an import's in-memory sink): its files are
    verified and held, and the run loads them from there (the ``Landing``) while their copy
    in the run directory, for a later resume here, is moved into place afterwards. A store
    that is a local path (a disk of this machine, or a file system it shares) is as near as
    the copy would be: no copy is made, and a later resume imports from the store again."""
    if run.store is None:
        return None
    storage = run.options.storage_options
    try:
        newest = latest(run.store, run=run.run_id, storage_options=storage)
    except NotFound:
        newest = None
    entry = None
    view = run.local_view()
    if newest is not None and newest.step > local_step:
        entry = choose(
            run.store,
            run=run.run_id,
            views=[view],
            accept_older=run.accept_older,
            trust=run.trust,
            storage_options=storage,
            hints=RUNTIME_HINTS,
        )
    if entry is None or entry.step <= local_step:
        return None
    rank, world = run.publisher.rank, run.publisher.world
    # Named after the restore point itself: another object of the same step (a step packed
    # again) is another import, gated on its own.
    name = entry.name.rsplit("/", 1)[-1].removesuffix(".rp")
    if world > 1:
        # Each rank imports the shared part and its own (spec 25.4).
        name += f".rank{rank}"
    dest = run.run_dir / "imports" / name
    landing = None
    if not dest.exists():

        def gated_import(in_memory: bool, copy: bool = True) -> ImportResult:
            return resume_import(
                entry.url,
                dest,
                views=[view],
                trust=run.trust,
                storage_options=storage,
                hints=RUNTIME_HINTS,
                rank=rank if world > 1 else None,
                world_size=world,
                in_memory=in_memory,
                copy=copy,
            )

        copy = not isinstance(resolve(entry.url, storage), LocalLocation)
        try:
            result = gated_import(True, copy)
        except RestorePointError:
            # Ranks sharing the run directory import at once; the import is renamed into
            # place whole, so one that is there is the winner's.
            if not dest.exists():
                raise
        else:
            # Without a copy, files are made only when the held bytes cannot be loaded as
            # they are (an older release's pickle, which is read from a file).
            landing = Landing(result, None if copy else lambda: gated_import(False))
    if run.is_main:
        mark(run, entry.name)
    return dest / run.publisher.rank_file(), "store", landing


class Landing:
    """An import in memory on its way into the run directory: ``held`` is every file's
    verified bytes by the path it will have; ``start`` moves the copy into place on a thread
    of its own (fsync and rename: the first step need not wait for them), ``join`` waits for
    it, ``discard`` drops it. A copy that cannot be moved into place costs only a later
    resume here its shortcut (it imports from the store again). An import from a local store
    makes no copy (``to_disk`` given): ``start`` has nothing to move, and ``land`` (files
    needed after all) imports to disk then."""

    def __init__(
        self, result: ImportResult, to_disk: Callable[[], ImportResult] | None = None
    ) -> None:
        self.result = result
        #: An import that made no copy: how to make the files after all (``land``).
        self._to_disk = to_disk
        dest = Path(result.dest)
        contents = result.contents or {}
        self.held: dict[Path, Held] = {
            dest.joinpath(*path.split("/")): data for path, data in contents.items()
        }
        self._thread: threading.Thread | None = None

    def land(self) -> None:
        """Move the copy into place now, on this thread (an import that made none: import the
        files now)."""
        if self._to_disk is not None:
            to_disk, self._to_disk = self._to_disk, None
            try:
                self.result = to_disk()
            except RestorePointError:
                # The resume needs these files: a failure is the resume's, unless another
                # rank's import (the same restore point) is in place.
                if not Path(self.result.dest).exists():
                    raise
            return
        try:
            self.result.finish()
        except RestorePointError as exc:
            if not Path(self.result.dest).exists():  # another rank's copy is as good
                log.warning(
                    "could not keep the imported restore point in the run directory: %s", exc
                )

    def start(self) -> None:
        self.held = {}
        if self._to_disk is not None:
            return  # no copy to land: the store is as near
        self._thread = threading.Thread(target=self.land, name="rp-land", daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def discard(self) -> None:
        self.held = {}
        self.result.discard()


def mark(run: ResumableRun, name: str) -> None:
    """Write the resume marker of the store's restore point ``name`` (spec 19.9): prune keeps
    it while this run lives, whether it was the run's newest or an older branch (the publisher
    renews the lease at each publish; the run removes the marker when it ends). A store that
    refuses the marker only costs the protection."""
    try:
        marker = ResumeMarker(_store(run.store or "", run.options.storage_options), name)
        marker.renew()
    except RestorePointError as exc:
        log.warning("could not write a resume marker for %s: %s", name, exc)
        return
    run.publisher.marker = marker
