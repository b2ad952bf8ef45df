"""The supervisor's notices (docs/preempt.md, "The stop contract"): a reclaim notice, a snapshot
request or a stop signal becomes a snapshot of every trainer process that reported itself up, a
wait for its restore point in the store before the notice's deadline (the store's retries bounded
by it), and for a stop, the trainer stopped and one line that says what landed."""

from __future__ import annotations

import contextlib
import logging
import queue
import subprocess
import time
from typing import Any

from ..errors import RestorePointError
from ..ops import list_store
from ..runtime.contract import Ready
from ..storage import store_deadline
from .external import ExternalLoop
from .telemetry import Telemetry
from .watchers import Notice, Watcher

__all__ = ["NoticeSteps"]

log = logging.getLogger("restorepoint.preempt")


class NoticeSteps:
    """The notice half of ``Supervisor`` (which supplies these fields and the trainer's
    process steps)."""

    store: str
    run: str | None
    storage_options: dict[str, Any] | None
    telemetry: Telemetry
    watcher: Watcher | None
    margin_s: float
    snapshot_timeout_s: float
    _proc: subprocess.Popen[bytes] | None
    _loop: ExternalLoop | None
    _last_publish_s: float | None
    _stopping: bool
    _deferred: Notice | None
    _stop_signal: int | None
    _stop_taken: str | None
    _deadlines: contextlib.ExitStack

    def ready(self) -> list[Ready]:
        raise NotImplementedError

    def _snapshot_ready(self) -> int:
        raise NotImplementedError

    def _stop_ready(self) -> int:
        raise NotImplementedError

    def _stop_trainer(self, deadline: float | None = None) -> None:
        raise NotImplementedError

    def _leave_deadline(self, when: float) -> None:
        raise NotImplementedError

    def _arm_kill(self, deadline: float | None = None) -> None:
        raise NotImplementedError

    def _escalate(self) -> None:
        raise NotImplementedError

    def _store_names(self, run: str | None) -> set[str]:
        try:
            return {
                e.name
                for e in list_store(self.store, run=run, storage_options=self.storage_options)
            }
        except RestorePointError:
            return set()

    def handle(self, notice: Notice) -> bool:  # noqa: PLR0912, PLR0915 - one branch per notice kind and adapter contract (docs/preempt.md)
        """Act on a notice (a stop signal is one too, source ``signal``); True when a restore
        point was published in time."""
        self.telemetry.count(
            "notices", kind=notice.kind, source=notice.source, seconds_left=notice.seconds_left
        )
        if self._stopping:
            # The trainer was already told to stop (and snapshots on the way out). A second
            # signal could reach it after its handlers are gone, and kill it.
            log.info("notice (%s): the trainer is already stopping", notice.detail)
            self.telemetry.record("missed", reason="already-stopping", kind=notice.kind)
            return False
        stop = notice.kind == "stop"
        if stop:
            self._stopping = True
            self._stop_taken = notice.detail
        deadline = self._deadline(notice)
        if stop and self._loop is None:
            # A trainer that publishes itself aims its stop's publish at the same deadline.
            self._leave_deadline(deadline)
        ready = self.ready()
        if self._loop is not None and self._loop.up and self._proc is not None:
            # An external trainer writes no ready file: its ready line says it is up.
            ready = [Ready(self._proc.pid, self.run, None)]
        if not ready:
            log.warning(
                "notice (%s) but no trainer has reported itself up: nothing to snapshot%s",
                notice.detail,
                "; the store's previous restore point stays the newest" if stop else "",
            )
            self.telemetry.record("missed", reason="no-trainer-up", kind=notice.kind)
            if stop:
                self._stop_trainer(notice.deadline)
            return False
        fallback = self._loop is not None and not self._loop.can_snapshot()
        if fallback and not stop:
            log.warning(
                "notice (%s): this trainer does not handle the snapshot signal: no snapshot "
                "(its periodic checkpoints are published as they come)",
                notice.detail,
            )
            self.telemetry.record("missed", reason="cannot-snapshot", kind=notice.kind)
            return False
        left = notice.seconds_left
        needed = self._last_publish_s
        if left is not None and left - self.margin_s < (needed or 0.0):
            why = (
                f"the last publish took {needed:.1f} s"
                if needed is not None and left - self.margin_s >= 0
                else f"less than the {self.margin_s:g} s margin"
            )
            log.warning(
                "notice (%s): %.1f s left, %s: the restore point may not land in time; "
                "requesting it anyway and waiting up to the deadline; if it does not land, "
                "the store's previous restore point stays the newest",
                notice.detail, left, why,
            )  # fmt: skip
        elif fallback:
            log.warning(
                "stop (%s): this trainer does not handle the snapshot signal: its newest "
                "periodic checkpoint (step %d) is published instead, then it is stopped",
                notice.detail,
                self._loop.newest_step() if self._loop is not None else -1,
            )
        else:
            log.info(
                "notice (%s): snapshot requested, %s s left",
                notice.detail,
                "?" if left is None else f"{left:.1f}",
            )
        runs = {r.run for r in ready}
        before = {run: self._store_names(run) for run in runs}
        started = time.perf_counter()
        published_before = -1
        if self._loop is None:
            if not stop:
                self._snapshot_ready()
            elif notice.source == "signal":
                # The trainer's own stop: it snapshots, publishes and exits 42 (SIGTERM for
                # every stop signal: a plain command dies of SIGUSR2 before anything).
                self._stop_trainer(notice.deadline)
            else:
                self._stop_ready()
                self._arm_kill(notice.deadline)
        elif not fallback:
            published_before = self._loop.newest_step()
            self._loop.request_snapshot()
        interruptible = not stop
        if self._loop is not None:
            give_way = self._stop_notice_waiting if interruptible else None
            if fallback:
                published = self._loop.wait_newest_published(deadline)
            else:
                published = self._loop.wait_published(published_before, deadline, give_way)
            if published and not fallback:
                self.telemetry.count("snapshots", step=self._loop.published_step())
        else:
            published = self._await_publication(runs, before, deadline, interruptible)
        elapsed = time.perf_counter() - started
        in_time = published and time.time() <= (notice.deadline or float("inf"))
        if published:
            self._last_publish_s = elapsed
            if self._loop is None:
                # An external trainer's publish is counted by its loop, once.
                self.telemetry.count("uploads", seconds=elapsed, kind=notice.kind)
            self.telemetry.record(
                "published",
                kind=notice.kind,
                notice_to_published_s=time.time() - notice.received,
                in_time=in_time,
            )
        elif self._deferred is not None or (interruptible and self._stop_signal is not None):
            self.telemetry.record("missed", reason="superseded-by-stop", kind=notice.kind)
        else:
            self.telemetry.count("upload_failures", kind=notice.kind)
            self.telemetry.record("missed", kind=notice.kind, in_time=False)
        if stop:
            self._say_stop(notice, published)
            if self._loop is not None:
                self._stop_trainer(notice.deadline)
        return in_time

    def _deadline(self, notice: Notice) -> float:
        """How long (time.time()) a notice waits for its restore point: its deadline less the
        margin (all of it inside the margin already), or ``snapshot_timeout_s``. A stop or a
        notice with a deadline bounds the store's retries by it too, from now on: the machine
        goes then, and every store request of this process (the listing here, the snapshot's
        publish, a publish still retrying against a failing store) gives up by it, its upload
        aborted while the process lives, rather than retry into the reclaim."""
        if notice.deadline:
            deadline = notice.deadline - self.margin_s
            if deadline <= time.time():
                deadline = notice.deadline
        else:
            deadline = time.time() + self.snapshot_timeout_s
        if notice.kind == "stop" or notice.deadline:
            when = time.monotonic() + max(0.0, deadline - time.time())
            self._deadlines.enter_context(store_deadline(when))
        return deadline

    def _say_stop(self, notice: Notice, published: bool) -> None:
        if published and self._loop is not None:
            log.info(
                "stop (%s): restore point at step %d published; stopping the trainer; exit 42",
                notice.detail, self._loop.published_step(),
            )  # fmt: skip
        elif published:
            # A trainer that publishes itself (a ResumableRun, a Lightning job) has said it in
            # its own one stop line, with the step and the URL: a second line would only repeat.
            log.debug("stop (%s): restore point published; exit 42", notice.detail)
        elif self._loop is not None and self._loop.newest_step() < 0:
            log.warning(
                "stop (%s): the trainer committed no snapshot: nothing published; exit 42",
                notice.detail,
            )
        else:
            log.warning(
                "stop (%s): no restore point landed before the deadline: the store's previous "
                "restore point stays the newest; exit 42",
                notice.detail,
            )

    def _await_publication(
        self, runs: set[str | None], before: dict[str | None, set[str]], deadline: float,
        interruptible: bool = False,
    ) -> bool:  # fmt: skip
        """Wait until each run has a new restore point in the store (the trainer published
        it). A wait for a snapshot (``interruptible``) gives way to a stop notice: a snapshot
        that does not land must not hold up the stop."""
        while time.time() < deadline:
            # Publication first: a stop notice queued just after the snapshot landed does not
            # make that snapshot a miss.
            if all(self._store_names(run) - before[run] for run in runs):
                self.telemetry.count("snapshots")
                return True
            if interruptible and self._stop_notice_waiting():
                return False
            self._escalate()
            if self._proc is not None and self._proc.poll() is not None:
                # The trainer exited (42 after a stop): its last upload is done or failed.
                return all(self._store_names(run) - before[run] for run in runs)
            time.sleep(0.1)
        return False

    def _stop_notice_waiting(self) -> bool:
        """Take the notices queued meanwhile: a stop notice is kept for right after this wait
        (True); a snapshot notice is covered by the snapshot being awaited."""
        if self._stop_signal is not None and self._stop_taken is None:
            return True  # a stop signal: handled by the main loop right after
        if self.watcher is None:
            return False
        while self._deferred is None:
            try:
                notice = self.watcher.notices.get_nowait()
            except queue.Empty:
                return False
            if notice.kind == "stop":
                self._deferred = notice
            else:
                log.info("notice (%s): a snapshot is already on its way", notice.detail)
        return True
