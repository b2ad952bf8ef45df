"""A ResumableRun's way out: save each snapshot to the run directory, then publish it to the
store, on the snapshot worker's thread (docs/adapters.md, "Snapshots and signals").

- One process: the snapshot is published as one restore point through ``ops.publish``, packed
  straight from its copy in memory (each byte read once: hashed, encoded and written to the
  store), while ``last.pt`` is written to the run directory from the same memory on a thread
  of its own (temporary file, fsync, rename: the publish process's where there is one, else
  this process's), then the position sidecar. Without a store it is saved only.
- With a process group: every rank saves and publishes its own part, rank 0 also the part the
  ranks hold alike, and rank 0 commits once every part is in (spec section 25). Every rank
  takes part in every collective whatever fails on the way, so a failure leaves no commit and
  the previous restore point stays the newest.

A failed snapshot never stops training: it is recorded (``uploads``, the ``upload_failed`` and
``snapshot_failed`` events) and training goes on. A snapshot that cannot be saved (a full
disk: ``StorageError``, "no space left on the device", naming the file) leaves the previous
one in place, whole, and no temporary file behind.

Before each save the free space of the run directory's file system is compared with what the
snapshot needs: the last snapshot's size, or before the first one the tracked state's bytes
(whichever is larger). Below ``LOW_SPACE_FACTOR`` times that, one warning is logged (and a
``disk_space_low`` event recorded), once per process (docs/reliability.md, "Full disks").
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .._posix import atomic_write, set_thread_nice, thread_nice
from ..errors import RestorePointError
from ..format import Position
from ..ops._source import BytesFile, InMemory
from ..ops.publish import HeadSpec, PackOptions, Rest, publish
from ..ops.publish_process import Peer, PublishProcess, RemoteResult, SaveJob, Unavailable
from ..ops.publish_process import available as process_available
from ..ops.resumed import ResumeMarker
from ..ops.store import KeepBest
from ..storage import deadline_left
from ._inflight import Flights, InFlight
from ._parts import save_and_publish_part, supersede_parts
from .contract import POSITION_FILE, RunDirectory
from .snapshot_file import SnapshotImage
from .state import (
    expected_reuse,
    save_image,
    save_state,
)
from .worker import Snapshot

__all__ = ["LOW_SPACE_FACTOR", "Publisher", "json_line", "rank_file", "state_bytes"]

log = logging.getLogger("restorepoint.torch")


#: Warn when the run directory's file system has less free space than this many snapshots:
#: a save writes the new file beside the old one, so below one the next save fails, and below
#: two one more snapshot (or anything else written there) is enough to fill it.
LOW_SPACE_FACTOR = 2


def state_bytes(value: Any) -> int:
    """The bytes of the tensors a state holds: what its save needs at least."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(v) for v in value)
    return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def json_line(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def rank_file(rank: int, world: int) -> str:
    """The name of a rank's snapshot file in ``checkpoints/``."""
    return "last.pt" if world == 1 else f"last.rank{rank}.pt"


#: The nice value of the thread that writes ``last.pt`` beside a periodic publish: the
#: lowest. Its work is a copy (through an aligned buffer, past the page cache where the file
#: system allows it: ``save_image``). Into the page cache, as it was written before, at the
#: background's nice (+10) it took the training thread's core for about 5% of its time
#: beside a 1 GiB publish (the kernel places it wherever a core is less busy, the training
#: thread's included) and at +19 about 1 to 2% (docs/performance.md, "The publish in a
#: process of its own"). A stop gives it the training priority back
#: (``Publisher.unthrottle``), as it does the publish.
SAVE_NICE = 19


def _peers(memory: Mapping[str, InMemory]) -> dict[str, Peer | bytes] | None:
    """The payload files in memory as the publish process reads them (a snapshot image: where
    its tensors lie in this process; a small file: its bytes), or None when one of them is
    neither."""
    out: dict[str, Peer | bytes] = {}
    for name, item in memory.items():
        if isinstance(item, SnapshotImage):
            out[name] = Peer(item.head, tuple(item.regions))
        elif isinstance(item, BytesFile):
            out[name] = item.data
        else:
            return None
    return out


class Publisher:
    """Saves and publishes the snapshots of one run (one rank of it). ``head`` gives the head
    of a restore point at a position; ``event`` appends to the run's events (rank 0 only);
    ``uploads`` records each publish's outcome, newest last."""

    def __init__(  # noqa: PLR0913 - the run's parts, handed over once by ResumableRun
        self,
        directory: RunDirectory,
        store: str | None,
        options: PackOptions,
        *,
        keep_last: int | None,
        rank: int,
        world: int,
        group: Any,
        head: Callable[[Position, Mapping[str, float]], HeadSpec],
        event: Callable[..., None],
        keep_best: KeepBest | None = None,
        background: str = "thread",
    ) -> None:
        self.directory = directory
        self.store = store
        self.options = options
        #: Its publishes rest after one that would reuse too little of its newest (spec 28.4).
        self.rest = Rest()
        self.keep_last = keep_last
        self.keep_best = keep_best
        #: The marker of the store's restore point this run resumed from (spec 19.9), renewed
        #: at each publish; None when it resumed from none (or is not rank 0).
        self.marker: ResumeMarker | None = None
        self.rank = rank
        self.world = world
        self.group = group
        self.head = head
        self.event = event
        self.uploads: list[dict[str, Any]] = []
        #: The snapshots that could not be saved: step -> the error, as one line.
        self.save_errors: dict[int, str] = {}
        self._space_warned = False
        #: Whether a publish process that cannot be had is worth a warning: asked for by name
        #: (``background="process"``), not taken where it could run (``auto``).
        self._asked = background == "process"
        #: The thread writing ``last.pt`` beside a publish (its native id), while it runs;
        #: whether a stop gave the priority back; the lock that orders the two.
        self._saver: int | None = None
        self._unthrottled = False
        self._nice_lock = threading.Lock()
        #: The publish in flight, which a stop's newer snapshot may supersede
        #: (``supersede``); None between publishes.
        self._flights = Flights()
        #: The publish in a process of its own (``background`` "process", or "auto" on Linux
        #: without encryption: one process, a store); None: on the worker's thread. Started by
        #: ``prepare`` on the worker's thread, which outlives every publish (the child dies
        #: with the thread that started it), and started again there after a child that died.
        wanted = background == "process" or (
            background == "auto" and process_available() and not options.encrypt_to
        )
        self.process: PublishProcess | None = (
            PublishProcess() if wanted and world == 1 and store is not None else None
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def prunes(self) -> bool:
        """Whether each publish prunes the run (keep-last or keep-best)."""
        return self.keep_last is not None or self.keep_best is not None

    def renew_marker(self) -> None:
        """Renew the resume marker's lease (after a publish): a failure only warns, and the
        marker then protects until its lease ends."""
        if self.marker is None:
            return
        try:
            self.marker.renew()
        except RestorePointError as exc:
            log.warning("could not renew the resume marker %s: %s", self.marker.url, exc)

    def rank_file(self) -> str:
        return rank_file(self.rank, self.world)

    def prepare(self) -> None:
        """On the worker's thread, before its first snapshot: start the publish process, so
        that the first publish does not wait for its start (or say at once that there can
        be none: every snapshot is then published on the thread)."""
        if self.process is None:
            return
        try:
            self.process.start()
        except Unavailable as exc:
            self._no_process(exc)

    def _no_process(self, exc: Unavailable) -> None:
        (log.warning if self._asked else log.info)(
            "%s; publishing in the training process instead", exc.message
        )
        self.event("publish_process_unavailable", error=exc.message)
        if self.process is not None:
            self.process.close()
        self.process = None

    def unthrottle(self) -> None:
        """A stop: the publish process, and a ``last.pt`` write in flight, take the training
        process's priority back too."""
        with self._nice_lock:
            self._unthrottled = True
            saver, base = self._saver, thread_nice(os.getpid())  # the main thread's
            if saver is not None and base is not None:
                set_thread_nice(saver, base)
        if self.process is not None:
            self.process.unthrottle()

    def supersede(self, newer: int, group: Any = None) -> None:
        """A stop's snapshot at step ``newer`` waits: abandon the publish in flight where the
        store deadline holds the stop's publish but not that one's rest before it
        (runtime/_inflight.py). With a process group, every rank calls it at the same
        boundary, and the ranks choose together on ``group`` (the training thread's).
        Said in the ``upload_superseded`` event."""
        if self.world > 1:
            figures = supersede_parts(self, newer, group) if self.store is not None else None
        else:
            figures = self._flights.supersede(newer, self.options.deadline_margin)
        if figures is not None:
            self.event("upload_superseded", **figures)

    def give_up(self, why: str) -> None:
        """The run is being left after a stop whose publish did not land in time: the
        publish in flight is given up at its next chunk, and any later one before its first
        (nothing of either committed). A stop's snapshot is the tracked state's own memory
        (``ResumableRun.snapshot(live=True)``), which nothing may go on reading once the run
        is left. The snapshot file in the run directory is still written."""
        self._flights.close(why)

    def _options(self) -> PackOptions:
        """The pack options of a publish that starts now: after a stop, which training waits
        for whole, on every core (``PackOptions.waited_for``); before, the run's."""
        with self._nice_lock:
            unthrottled = self._unthrottled
        return self.options.waited_for() if unthrottled else self.options

    def close(self) -> None:
        """End the publish process, if one was started (after the worker's last job)."""
        if self.process is not None:
            self.process.close()

    def outcome(self, step: int) -> dict[str, Any] | None:
        """The newest publish of the snapshot of ``step`` this process recorded, or None."""
        for upload in self.uploads[::-1]:
            if upload.get("step") == step:
                return upload
        return None

    # -- the worker's job ----------------------------------------------------------------------

    def save_and_publish(self, snap: Snapshot) -> None:
        """The worker's job for one snapshot; a failed snapshot must never stop training."""
        try:
            # Where the store holds nothing of the run to measure the reuse against, what the
            # training steps says whether the first restore point's (or commit's parts')
            # chunk names would serve (spec 28.4, 28.7).
            self.rest.expect(expected_reuse(snap.stepped, state_bytes(snap.state)))
            if self.world > 1:
                save_and_publish_part(self, snap)
            elif self.store is None:
                self._save(snap, self.directory.checkpoints / self.rank_file(), snap.state)
            else:
                self._publish_and_save(snap)
        except Exception as exc:
            step = snap.position.step
            log.warning("snapshot at step %d failed: %s", step, exc)
            self.save_errors[step] = str(exc)
            self.event("snapshot_failed", step=step, error=str(exc))

    def _save(
        self, snap: Snapshot, target: Path, state: Mapping[str, Any], *, sidecar: bool = True
    ) -> None:
        """A kill at any moment leaves the previous file or the new one, never a torn one."""
        self._check_space(snap, target, state)
        save_state(state, target, self.directory.path)
        if sidecar and self.is_main:
            # A small sidecar, so choosing where to resume from needs no load of the state.
            atomic_write(target.parent / POSITION_FILE, json_line(snap.position.to_dict()))

    def _check_space(self, snap: Snapshot, target: Path, state: Mapping[str, Any]) -> None:
        """Warn once, before a save, when the scratch file system is nearly full: the first
        snapshot is where a disk that is too small shows, so before it the tracked state's
        bytes stand for the snapshot's size."""
        if self._space_warned:
            return
        need = max(_size(target), state_bytes(state))
        try:
            st = os.statvfs(self.directory.path)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free >= LOW_SPACE_FACTOR * need:
            return
        self._space_warned = True
        log.warning(
            "restorepoint: low disk space for snapshots in %s: %d bytes free, a snapshot "
            "takes about %d; a snapshot that does not fit fails and the previous one stays",
            self.directory.path,
            free,
            need,
        )
        self.event(
            "disk_space_low",
            step=snap.position.step,
            path=str(self.directory.path),
            free=free,
            need=need,
        )

    def _publish_and_save(self, snap: Snapshot) -> None:
        """One process with a store: the restore point is packed straight from the snapshot's
        copy in memory, each byte read once (hashed, encoded and written to the store), while
        the snapshot file is written from the same memory to the run directory (temporary
        file, fsync, rename), then its position sidecar. The payload is the same as a pack of
        the run directory after the save: ``last.pt`` and the position sidecar, from memory,
        in the place of the directory's older ones (spec section 26).

        Side by side, neither waits for the other: the publish does not wait for a write and
        fsync of the whole state first, and the run directory gets its snapshot however slow
        the store is (a stop whose upload times out still leaves ``last.pt``). With a publish
        process, the child writes the file too, on a thread of its own (``SaveJob``): no
        thread of the training process then holds its GIL for it. Otherwise, and where the
        child did not write it (it died, or the publish was made here after all), a thread of
        this process does, started from the worker's thread, so at the background's
        priority."""
        target = self.directory.checkpoints / self.rank_file()
        self._check_space(snap, target, snap.state)
        position = json_line(snap.position.to_dict())
        image = SnapshotImage(dict(snap.state))
        memory: dict[str, InMemory] = {target.name: image, POSITION_FILE: BytesFile(position)}
        if self.process is not None:
            with self._nice_lock:
                nice = self._save_nice(threading.get_native_id())
            job = SaveJob(target.name, os.fspath(target), os.fspath(self.directory.path), nice)
            process = self.process
            self._publish(snap, memory, job)
            process.wait_saved(job)
            if not job.done:
                save_image(image, target, self.directory.path)
            elif job.error is not None:
                raise job.error
            atomic_write(target.parent / POSITION_FILE, position)
            return
        failed: list[BaseException] = []

        def save() -> None:
            me = threading.get_native_id()
            # Lowest beside a periodic publish (the worker's thread is throttled: this
            # thread inherited its nice, above the training thread's); after a stop at the
            # priority it inherited; raised by ``unthrottle`` while it runs.
            with self._nice_lock:
                self._saver = me
                if self._save_nice(me) is not None:
                    set_thread_nice(me, SAVE_NICE)
            try:
                save_image(image, target, self.directory.path)
            except BaseException as exc:  # handed to the worker's thread below
                failed.append(exc)
            finally:
                self._saver = None

        saver = threading.Thread(target=save, name="rp-save", daemon=True)
        saver.start()
        try:
            self._publish(snap, memory)
        finally:
            saver.join()
        if failed:
            raise failed[0]
        atomic_write(target.parent / POSITION_FILE, position)

    def _save_nice(self, native_id: int) -> int | None:
        """The nice value for a write of the snapshot file by thread ``native_id`` (the
        worker's, which started the publish process, or one it started, which inherited its
        nice), with ``_nice_lock`` held: SAVE_NICE beside a periodic publish (that thread
        throttled below the training thread), None (its own) after a stop."""
        mine, base = thread_nice(native_id), thread_nice(os.getpid())
        throttled = mine is not None and base is not None and mine > base
        return SAVE_NICE if throttled and not self._unthrottled else None

    def _publish(
        self,
        snap: Snapshot,
        memory: Mapping[str, InMemory] | None = None,
        save: SaveJob | None = None,
    ) -> None:
        started = time.perf_counter()
        step = snap.position.step
        flight = self._flights.begin(step) if self.world == 1 else None
        try:
            result = self._published(snap, memory, save, flight)
        except RestorePointError as exc:
            upload: dict[str, Any] = {"ok": False, "step": step, "error": str(exc)}
            if flight is not None and flight.superseded:
                # For a stop's newer snapshot (``supersede``, which said so): no failure.
                upload["superseded"] = True
                self.uploads.append(upload)
                return
            self.uploads.append(upload)
            self.event(
                "upload_failed", step=step, error_class=type(exc).__name__, error=exc.message
            )
            return
        finally:
            self._flights.end()
        seconds = time.perf_counter() - started
        self._flights.landed(seconds)
        upload = {"ok": True, "step": step, "url": result.url, "seconds": seconds}
        extra: dict[str, Any] = {}
        if result.incremental is not None:
            # Whether it referenced its newest, and why not (spec 28.4): a full fine-tune's
            # publishes say that they reused nothing, and when they rest.
            upload["incremental"] = extra["incremental"] = {
                "reason": result.incremental,
                "reused": result.reused,
            }
        if result.choices is not None:
            # What the adaptive codec chose, chunk by chunk (spec 13, W4b): in the telemetry.
            upload["codec_choices"] = extra["codec_choices"] = result.choices
        self.uploads.append(upload)
        self.renew_marker()
        self.event("uploaded", step=step, seconds=round(seconds, 6), bytes=result.size, **extra)
        if result.prune_error is not None:
            self.event(
                "prune_failed",
                step=step,
                error_class=type(result.prune_error).__name__,
                error=result.prune_error.message,
            )

    def _published(
        self,
        snap: Snapshot,
        memory: Mapping[str, InMemory] | None,
        save: SaveJob | None = None,
        flight: InFlight | None = None,
    ) -> RemoteResult:
        """The one publish of a snapshot: in the publish process where there is one and the
        memory is what it can read (with ``save``, the child also writes that file), else
        here. RestorePointError when it fails, or when ``flight`` is abandoned."""
        abandon = flight.abandon if flight is not None else None
        head = self.head(snap.position, snap.metrics)
        options = self._options()
        peers = _peers(memory) if self.process is not None and memory is not None else None
        if self.process is not None and peers is not None:
            left = deadline_left()
            try:
                return self.process.publish(
                    os.fspath(self.directory.checkpoints),
                    self.store or "",
                    head,
                    options,
                    memory=peers,
                    keep_last=self.keep_last,
                    keep_best=self.keep_best,
                    expect=self.rest.expected,
                    deadline=None if left is None else time.monotonic() + left,
                    save=save,
                    abandon=abandon,
                )
            except Unavailable as exc:
                # Said once; every later snapshot of the run publishes here.
                self._no_process(exc)
        result = publish(
            self.directory.checkpoints,
            self.store or "",
            head,
            options,
            keep_last=self.keep_last,
            keep_best=self.keep_best,
            memory=memory,
            rest=self.rest,
            progress=abandon,
        )
        pack = result.pack
        return RemoteResult(
            url=result.url,
            size=pack.size,
            incremental=pack.incremental,
            reused=pack.reused,
            choices=pack.choices.to_dict() if pack.choices is not None else None,
            prune_error=result.prune_error,
        )
