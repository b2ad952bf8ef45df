"""The spot-queue loop for an external trainer under the supervisor (docs/preempt.md, "External
trainers: the whole loop"):

1. the trainer runs with its snapshot-steps flag (``--save-steps a,b,...``, from ``--every`` or
   the config's checkpoint interval), its output copied to the log the adapter reads;
2. each committed snapshot (its log line, or a settled file) is packed with the run's whole
   identity (the local view: config and its identity, cache keys, cache root, the binary's own
   version, the profile's terms) and its step, published through the one publish path (the new
   restore point replaces the previous one, with ``keep_last``, only once it is complete),
   and verified;
3. then the local checkpoints are cleaned to the newest that verified (``keep_local``).

A publish that fails is logged and recorded (``upload_failure`` in telemetry,
``upload_failed`` in the work directory's events); training goes on, the next snapshot tries
again, and the checkpoint that failed stays until a later one is published. Snapshots are
published one at a time on a background thread; one that lands while another is published
waits, and a newer one replaces it (coalesced). Under a store deadline (a stop, or a notice
with a deadline), the publish in flight is abandoned for the newer snapshot where the time
left holds the newer's publish but not both (runtime/_inflight.py: ``upload_superseded`` in
the events), so that the newest state lands rather than an older one.

The loop keeps the run-directory contract in the trainer's work directory: ``trainer.json``
names the supervisor (which turns SIGUSR1 into the adapter's snapshot request, held until the
trainer is up), ``events.jsonl`` records ``snapshot``, ``uploaded`` and ``upload_failed``, so
``restorepoint snapshot WORKDIR [--wait]`` works for an external trainer as for a ResumableRun.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapters.base import Snapshot
from ..errors import RestorePointError
from ..ops import verify
from ..ops.publish import HeadSpec, PackOptions, PublishResult, Rest, publish
from ..ops.store import KeepBest, entry_name
from ..runtime._inflight import Flights
from ..runtime.contract import RunDirectory
from ..runtime.worker import SnapshotWorker
from .telemetry import Telemetry

if TYPE_CHECKING:
    from ..adapters.external import ExternalAdapter, TrainerProcess

__all__ = ["ExternalLoop"]

log = logging.getLogger("restorepoint.preempt")


class ExternalLoop:
    """Publishes every committed snapshot of one external trainer; see the module docstring."""

    def __init__(  # noqa: PLR0913, PLR0917 - the loop's store, head, retention and the trainer's process
        self,
        adapter: ExternalAdapter,
        workdir: Path,
        store: str,
        head: HeadSpec,
        options: PackOptions,
        telemetry: Telemetry,
        *,
        keep_last: int | None = 1,
        keep_local: int | None = 1,
        keep_best: KeepBest | None = None,
    ) -> None:
        self.adapter = adapter
        self.workdir = workdir
        self.store = store
        self.head = head
        self.options = options
        self._rest = Rest()  # its publishes rest after one that would reuse too little (28.4)
        self.telemetry = telemetry
        self.keep_last = keep_last
        self.keep_local = keep_local
        self.keep_best = keep_best
        self.directory = RunDirectory(workdir)
        self.trainer: TrainerProcess | None = None
        #: every snapshot published, oldest first
        self.published: list[Snapshot] = []
        #: the newest committed snapshot seen
        self.newest: Snapshot | None = None
        self._cv = threading.Condition()
        self._worker: SnapshotWorker[Snapshot] = SnapshotWorker(self._publish, nice=None)
        self._watcher: threading.Thread | None = None
        self._report: Path | None = None
        #: The publish in flight, which a newer snapshot under a deadline may supersede; the
        #: times the publishes took, which that choice estimates from.
        self._flights = Flights()

    # -- starting and ending -----------------------------------------------------------------

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> TrainerProcess:
        """Start the trainer and the loop around it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The stop signals the supervisor takes for the trainer (Slurm signals every process
        # of a step, the trainer too): ignored by it from its start, unless it is its own
        # snapshot signal, so that a stop ends in the snapshot the supervisor asks for.
        ignore = {int(signal.SIGUSR2), int(signal.SIGINT)} - {self.adapter.profile.snapshot_signal}
        trainer = self.adapter.start(
            command, self.workdir, echo=sys.stdout, env=env, ignore=sorted(ignore)
        )
        self.trainer = trainer
        # Who takes this run's snapshot requests: the supervisor (it holds the request until
        # the trainer is up, where a signal would kill it).
        self._report = self.directory.write_trainer_report(
            {
                "kind": "supervisor",
                "pid": os.getpid(),
                "run": self.head.run,
                "run_dir": str(self.workdir.resolve()),
                "snapshot_signal": int(signal.SIGUSR1),
                # Checked by ``restorepoint snapshot`` before it asks the supervisor: the
                # request is passed on to this process, which must catch its signal.
                "trainer_pid": trainer.pid,
                "trainer_signal": int(self.adapter.profile.snapshot_signal),
            }
        )
        self._worker.start()
        self._watcher = threading.Thread(target=self._watch, name="rp-external", daemon=True)
        self._watcher.start()
        return trainer

    def finish(self, timeout: float | None) -> bool:
        """After the trainer exited: wait for the snapshots seen to be published (up to
        ``timeout``); False when one was still in flight."""
        if self._watcher is not None:
            self._watcher.join(timeout)
        done = self._worker.finish(timeout)
        if self._report is not None:
            with contextlib.suppress(OSError):
                self._report.unlink()
            self._report = None
        return done

    # -- snapshots -----------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.trainer is not None and self.trainer.ready.is_set()

    def request_snapshot(self) -> None:
        """A snapshot now if the trainer is up, else as soon as it is (never a signal that
        the trainer does not catch: see ``TrainerProcess``)."""
        if self.trainer is not None and self.trainer.returncode is None:
            self.trainer.ask_for_snapshot()

    def can_snapshot(self) -> bool:
        """Whether the trainer takes a snapshot request now (up, and catching the signal)."""
        return self.trainer is not None and self.trainer.can_snapshot()

    def wait_newest_published(self, deadline: float) -> bool:
        """The fallback of a trainer that cannot snapshot: wait until the newest committed
        snapshot seen (a periodic one) is published, up to ``deadline``; True when the store's
        newest is it (or nothing was ever committed: nothing to wait for)."""
        newest = self.newest_step()
        if newest < 0 or self.published_step() >= newest:
            return newest >= 0
        return self.wait_published(newest - 1, deadline)

    def newest_step(self) -> int:
        snap = self.newest
        return snap.step if snap is not None else -1

    def published_step(self) -> int:
        with self._cv:
            return self.published[-1].step if self.published else -1

    def wait_published(self, after: int, deadline: float, give_way: Any = None) -> bool:
        """Wait until a snapshot newer than step ``after`` is published, up to ``deadline``
        (time.time()); ``give_way()`` returning True ends the wait early (a stop notice)."""
        with self._cv:
            while True:
                if self.published and self.published[-1].step > after:
                    return True
                if time.time() >= deadline:
                    return False
                if give_way is not None and give_way():
                    return False
                if self.trainer is not None and self.trainer.returncode is not None:
                    if not self._worker.wait(0):
                        self._cv.wait(0.1)
                        continue
                    return bool(self.published and self.published[-1].step > after)
                self._cv.wait(0.1)

    def _watch(self) -> None:
        """Committed snapshots as they land: from the trainer's log lines (read as it writes
        them), or, for a profile without a log, from settled files (polled)."""
        trainer = self.trainer
        assert trainer is not None
        polled = not self.adapter.log_files
        while True:
            if polled:
                if trainer.returncode is not None:
                    snap = self.adapter.newest_snapshot(self.workdir)
                    self._seen(snap)
                    return
                self._seen(self.adapter.newest_snapshot(self.workdir))
                time.sleep(0.5)
                continue
            try:
                snap = trainer.next_snapshot(timeout=1.0)
            except TimeoutError:
                continue
            if snap is None:
                return
            self._seen(snap)

    def _seen(self, snap: Snapshot | None) -> None:
        if snap is None or snap.step <= self.newest_step():
            return
        self.newest = snap
        self.telemetry.count("checkpoints", step=snap.step)
        self.directory.append_event("snapshot", step=snap.step)
        self._worker.submit(snap)
        # Under a store deadline only (a stop, a notice with one): the newest should land.
        figures = self._flights.supersede(snap.step, self.options.deadline_margin)
        if figures is not None:
            log.info(
                "the publish of step %d is abandoned for step %d: only one lands in time",
                figures["step"], snap.step,
            )  # fmt: skip
            self.directory.append_event("upload_superseded", **figures)

    # -- publishing ------------------------------------------------------------------------------

    def _publish(self, snap: Snapshot) -> None:
        """Pack, publish, verify, clean: the worker's job for one snapshot. Never raises."""
        started = time.perf_counter()
        flight = self._flights.begin(snap.step)
        try:
            result = publish(
                snap.root,
                self.store,
                self.head.at(snap.position),
                self.options,
                include=snap.files,
                keep_last=self.keep_last,
                keep_best=self.keep_best,
                rest=self._rest,
                progress=flight.abandon,
            )
            self._verify(result)
        except RestorePointError as exc:
            if flight.superseded:
                # For a newer snapshot, which ``upload_superseded`` named: no failure.
                log.info("the snapshot at step %d was not published: %s", snap.step, exc)
                return
            log.warning("the snapshot at step %d was not published: %s", snap.step, exc)
            self.telemetry.count("upload_failures", step=snap.step, reason=type(exc).__name__)
            self.directory.append_event(
                "upload_failed", step=snap.step, error_class=type(exc).__name__, error=exc.message
            )
            return
        finally:
            self._flights.end()
        seconds = time.perf_counter() - started
        self._flights.landed(seconds)
        self.telemetry.count(
            "uploads", step=snap.step, seconds=seconds, bytes=result.pack.size, kind="checkpoint"
        )
        self.directory.append_event(
            "uploaded", step=snap.step, seconds=round(seconds, 6), bytes=result.pack.size
        )
        if result.prune_error is not None:
            log.warning("published step %d; the prune failed: %s", snap.step, result.prune_error)
        with self._cv:
            self.published.append(snap)
            self._cv.notify_all()
        self._clean()

    def _verify(self, result: PublishResult) -> None:
        """The new restore point, read back end to end, before a local checkpoint goes. The
        prune after the publish verifies the run's newest in full: when that was the new one,
        it is not read a second time."""
        report = result.pruned
        name = entry_name(result.manifest)
        if report is not None and any(plan.verified == name for plan in report.runs):
            return
        verify(result.url, storage_options=self.options.storage_options)

    def _clean(self) -> None:
        """The local checkpoints, to the newest ``keep_local`` that were published and
        verified (the trainer's newer ones, not yet published, stay)."""
        if not self.keep_local:
            return
        with self._cv:
            if len(self.published) < self.keep_local:
                return
            keep = self.published[-self.keep_local]
        try:
            removed = self.adapter.clean_project(self.workdir, keep=keep)
        except RestorePointError as exc:  # the checkpoint went: nothing older is removed
            log.warning("local checkpoints not cleaned: %s", exc)
            return
        if removed:
            log.info("removed %d older local checkpoint(s)", len(removed))
