"""``restorepoint run``: the supervisor that turns reclaim notices into published restore points.

    restorepoint run --store URL [--adapter NAME] [--watch aws|gcp|none]
        [--resume-from URL | --auto-resume] -- TRAINER ARGS...

1. Resume, if asked: import the restore point through the gate and start the trainer with the
   adapter's resume arguments (a restorepoint.torch run is told where the import lies).
2. Start the trainer and forward the signals the supervisor gets (TERM, INT, HUP, USR2); a
   SIGUSR1 is a snapshot request (``restorepoint snapshot``), held until the trainer is up. An
   external trainer runs in the spot-queue loop (``external.ExternalLoop``): every committed
   snapshot is published with the run's whole identity, verified, and the local checkpoints
   cleaned.
3. Watch for notices. On one, send the snapshot request to every trainer process that has
   reported itself up (a process without its handler installed would die of SIGUSR1), wait for
   the snapshot and for it to be published in the store, before the notice's deadline; say early
   when that cannot be made, and what is done instead. A stop notice then stops the trainer.
4. A trainer that exits 42 (resumable) makes the supervisor exit 42 too, once the upload in
   flight is done, so that the scheduler above it requeues.

Trainers report themselves up by writing ``$RESTOREPOINT_READY_DIR/PID.json`` (ResumableRun does,
once its handlers are installed). Telemetry is a JSON-lines file of counts and timings: never a
URL, a path or a credential.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ..adapters.base import Adapter
from ..errors import IncompatibleRestorePoint, RestorePointError, UsageError
from ..ops import list_store
from ..ops.gate import Expectations
from ..ops.publish import HeadSpec, PackOptions
from ..ops.resume import choose, resume_import, write_head_file
from ..runtime.contract import (
    EXIT_INCOMPATIBLE,
    EXIT_RESUMABLE,
    READY_ENV,
    REFUSED_FILE,
    RESUME_DIR_ENV,
    RESUME_HEAD_ENV,
    SIGNING_KEY_ENV,
    STORE_ENV,
    Ready,
    read_ready,
)
from ..trust import Trust, load_signing_key, trust_policy
from .external import ExternalLoop
from .telemetry import Telemetry
from .watchers import Notice, Watcher

__all__ = [
    "READY_ENV",
    "RESUME_ENV",
    "STORE_ENV",
    "Supervisor",
    "Telemetry",
    "publishes_itself",
]

log = logging.getLogger("restorepoint.preempt")

RESUME_ENV = RESUME_DIR_ENV
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def publishes_itself(adapter: Adapter | None) -> bool:
    """Whether the trainer publishes its snapshots itself (into $RESTOREPOINT_STORE), and gates
    its own resumes: no adapter (a restorepoint.torch run is assumed) or the torch adapter."""
    if adapter is None:
        return True
    declared = getattr(adapter, "self_publishing", None)
    return bool(declared) if declared is not None else adapter.name == "torch"


@dataclass
class Supervisor:
    command: Sequence[str]
    store: str
    adapter: Adapter | None = None
    watcher: Watcher | None = None
    resume_from: str | None = None
    auto_resume: bool = False
    run: str | None = None
    workdir: Path | None = None
    telemetry: Telemetry = field(default_factory=lambda: Telemetry(None))
    #: seconds kept in hand before a notice's deadline
    margin_s: float = 5.0
    #: how long to wait for a snapshot to be published when the notice states no deadline
    snapshot_timeout_s: float = 600.0
    storage_options: dict[str, Any] | None = None
    #: this machine's views for the gate of the resume (spec section 16): every field the
    #: restore point records is compared with one, except ``defer``: the fields a trainer that
    #: gates itself compares (a ResumableRun knows its trainer, config and cache keys)
    views: Sequence[Expectations] = ()
    defer: frozenset[str] = frozenset()
    #: forensics only (``--no-gate --force``): import for the trainer without a gate
    gate: bool = True
    accept_older: bool = False
    trust: Trust | None = None
    #: the key the trainer and the supervisor sign restore points with
    signing_key: str | None = None
    #: an external trainer's restore points: their identity (the local view, at step 0), how
    #: many to keep in the store, how many local checkpoints to keep
    head: HeadSpec | None = None
    keep_last: int | None = 1
    keep_local: int | None = 1

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("give the trainer's command after --")
        if not self.store.endswith("/"):
            self.store += "/"
        if not self.self_publishing and self.workdir is None:
            raise UsageError(
                f"the {self.adapter.name if self.adapter else ''} adapter leaves publishing to "
                "the supervisor, which needs the trainer's output directory: give --workdir"
            )
        # Made by run_trainer (and removed at its end): a Supervisor never run leaves nothing.
        self._ready_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._last_publish_s: float | None = None
        self._publishing: threading.Thread | None = None
        self._stopping = False
        # A stop notice that came while a snapshot was awaited: handled right after.
        self._deferred: Notice | None = None
        # We stopped an external trainer after publishing its snapshot: resumable.
        self._resumable_stop = False
        # The spot-queue loop around an external trainer (made by run_trainer).
        self._loop: ExternalLoop | None = None

    @property
    def self_publishing(self) -> bool:
        return publishes_itself(self.adapter)

    # -- the trainer's processes ------------------------------------------------------------

    def ready(self) -> list[Ready]:
        """Trainer processes that have reported themselves up (and are still alive)."""
        if self._ready_dir is None:
            return []
        return read_ready(self._ready_dir)

    def _signal_ready(self, signum: int) -> int:
        sent = 0
        for r in self.ready():
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.pid, signum)
                sent += 1
        return sent

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            # A snapshot request (restorepoint snapshot), never a raw SIGUSR1: a trainer that
            # does not handle it yet would die of it.
            if self._loop is not None:
                self._loop.request_snapshot()
            else:
                self._signal_ready(signal.SIGUSR1)
            return
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)

    # -- resume --------------------------------------------------------------------------------

    def _prepare_resume(self, env: dict[str, str]) -> list[str]:
        """The one gated import for the trainer: the strict gate against this machine's
        views (a refusal is exit 3 before the trainer starts), under the trust policy."""
        command = list(self.command)
        url = self.resume_from
        try:
            if url is None and self.auto_resume:
                if self.run is None:
                    return command  # a ResumableRun finds its own run in the store
                entry = choose(
                    self.store,
                    run=self.run,
                    views=self.views,
                    defer=self.defer,
                    accept_older=self.accept_older,
                    trust=self.trust,
                    storage_options=self.storage_options,
                )
                if entry is None:
                    log.warning("no restore point of run %s in the store: starting fresh", self.run)
                    return command
                url = entry.url
            if url is None:
                return command
            assert self._ready_dir is not None
            dest = self._ready_dir / "resume"
            started = time.perf_counter()
            result = (
                resume_import(
                    url,
                    dest,
                    views=self.views if self.gate else (),
                    defer=self.defer if self.gate else frozenset(),
                    trust=self.trust,
                    storage_options=self.storage_options,
                )
                if self.gate
                else _ungated_import(url, dest, self.trust, self.storage_options)
            )
        except IncompatibleRestorePoint as exc:
            self._record_refusal(exc)
            raise
        self.telemetry.count(
            "resumes",
            step=result.manifest.position.step,
            seconds=time.perf_counter() - started,
            bytes=result.bytes,
        )
        head = self._ready_dir / "resume.head.json"
        write_head_file(result.manifest, head)
        env[RESUME_DIR_ENV] = str(dest)
        env[RESUME_HEAD_ENV] = str(head)
        if self.adapter is not None and not self.self_publishing:
            # A trainer that publishes itself finds the import through the environment (a
            # Lightning job's resume_checkpoint, a ResumableRun): its command stays as given.
            command = self.adapter.resume_command(dest, result.manifest, command)
        return command

    def _record_refusal(self, exc: RestorePointError) -> None:
        fields = [str(m.get("field", "")) for m in getattr(exc, "mismatches", ())]
        self.telemetry.record(
            "resume_refused", reason=type(exc).__name__, fields=",".join(sorted(set(fields)))
        )

    def _trainer_refused(self) -> None:
        """The trainer ended with exit 3: its own gate refused the restore point handed to it
        (it wrote the refused field names beside its ready file)."""
        assert self._ready_dir is not None
        try:
            doc = json.loads((self._ready_dir / REFUSED_FILE).read_text())
            fields = [str(f) for f in doc.get("fields", [])]
            reason = str(doc.get("class", "IncompatibleRestorePoint"))
        except (OSError, ValueError, AttributeError):
            fields, reason = [], "IncompatibleRestorePoint"
        self.telemetry.record("resume_refused", reason=reason, fields=",".join(sorted(set(fields))))

    # -- notices ---------------------------------------------------------------------------

    def _store_names(self, run: str | None) -> set[str]:
        try:
            return {
                e.name
                for e in list_store(self.store, run=run, storage_options=self.storage_options)
            }
        except RestorePointError:
            return set()

    def handle(self, notice: Notice) -> bool:  # noqa: PLR0912, PLR0915 - one branch per notice kind and adapter contract (docs/preempt.md)
        """Act on a notice; True when a restore point was published in time."""
        self.telemetry.count(
            "notices", kind=notice.kind, source=notice.source, seconds_left=notice.seconds_left
        )
        if self._stopping:
            # The trainer was already told to stop (and snapshots on the way out). A second
            # signal could reach it after its handlers are gone, and kill it.
            log.info("notice (%s): the trainer is already stopping", notice.detail)
            self.telemetry.record("missed", reason="already-stopping", kind=notice.kind)
            return False
        ready = self.ready()
        if self._loop is not None and self._loop.up and self._proc is not None:
            # An external trainer writes no ready file: its ready line says it is up.
            ready = [Ready(self._proc.pid, self.run, None)]
        if not ready:
            log.warning(
                "notice (%s) but no trainer has reported itself up: nothing to snapshot",
                notice.detail,
            )
            self.telemetry.record("missed", reason="no-trainer-up", kind=notice.kind)
            if notice.kind == "stop":
                self._stopping = True
                self._terminate()
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
        else:
            log.info(
                "notice (%s): snapshot requested, %s s left",
                notice.detail,
                "?" if left is None else f"{left:.1f}",
            )
        runs = {r.run for r in ready}
        before = {run: self._store_names(run) for run in runs}
        started = time.perf_counter()
        self_publishing = self._loop is None
        if notice.kind == "stop":
            self._stopping = True
        published_before = -1
        if self._loop is None:
            signum = signal.SIGTERM if notice.kind == "stop" else signal.SIGUSR1
            self._signal_ready(signum)
        else:
            published_before = self._loop.newest_step()
            self._loop.request_snapshot()
        if notice.deadline:
            # Inside the margin already: what is left of the time up to the deadline is
            # still worth waiting for.
            deadline = notice.deadline - self.margin_s
            if deadline <= time.time():
                deadline = notice.deadline
        else:
            deadline = time.time() + self.snapshot_timeout_s
        interruptible = notice.kind == "snapshot"
        if self._loop is not None:
            give_way = self._stop_notice_waiting if interruptible else None
            published = self._loop.wait_published(published_before, deadline, give_way)
            if published:
                self.telemetry.count("snapshots", step=self._loop.published_step())
        else:
            published = self._await_publication(runs, before, deadline, interruptible)
        elapsed = time.perf_counter() - started
        in_time = published and time.time() <= (notice.deadline or float("inf"))
        if published:
            self._last_publish_s = elapsed
            self.telemetry.count("uploads", seconds=elapsed, kind=notice.kind)
            self.telemetry.record(
                "published",
                kind=notice.kind,
                notice_to_published_s=time.time() - notice.received,
                in_time=in_time,
            )
        elif self._deferred is not None:
            self.telemetry.record("missed", reason="superseded-by-stop", kind=notice.kind)
        else:
            self.telemetry.count("upload_failures", kind=notice.kind)
            self.telemetry.record("missed", kind=notice.kind, in_time=False)
        if notice.kind == "stop" and not self_publishing:
            self._resumable_stop = published
            self._terminate()
        return in_time

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
            if self._proc is not None and self._proc.poll() is not None:
                # The trainer exited (42 after a stop): its last upload is done or failed.
                return all(self._store_names(run) - before[run] for run in runs)
            time.sleep(0.1)
        return False

    def _stop_notice_waiting(self) -> bool:
        """Take the notices queued meanwhile: a stop notice is kept for right after this wait
        (True); a snapshot notice is covered by the snapshot being awaited."""
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

    def _external_loop(self) -> ExternalLoop:
        from ..adapters.external import ExternalAdapter

        assert self.workdir is not None
        if not isinstance(self.adapter, ExternalAdapter):
            raise UsageError(
                f"the {self.adapter.name if self.adapter else ''} adapter is neither a trainer "
                "that publishes itself nor an external trainer"
            )
        head = self.head or HeadSpec(0, run=self.run)
        if head.run is None:
            raise UsageError(
                "an external trainer's restore points need a run: give --run or --config"
            )
        options = PackOptions(
            sign=(load_signing_key(self.signing_key),) if self.signing_key else (),
            storage_options=self.storage_options,
        )
        return ExternalLoop(
            self.adapter, self.workdir, self.store, head, options, self.telemetry,
            keep_last=self.keep_last, keep_local=self.keep_local,
        )  # fmt: skip

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    # -- main ------------------------------------------------------------------------------

    def run_trainer(self) -> int:  # noqa: PLR0912, PLR0915 - the supervisor's lifecycle in order: gate, start, watch, publish, exit
        env = os.environ.copy()
        ready_dir = self._ready_dir = Path(tempfile.mkdtemp(prefix="restorepoint-ready-"))
        env[READY_ENV] = str(ready_dir)
        env[STORE_ENV] = self.store
        if self.signing_key is not None:
            env[SIGNING_KEY_ENV] = self.signing_key
        previous: dict[signal.Signals, Any] = {}
        try:
            command = self._prepare_resume(env)
            if self.self_publishing:
                self._proc = subprocess.Popen(command, env=env)
            else:
                self._loop = self._external_loop()
                self._proc = self._loop.start(command, env).popen
            if threading.current_thread() is threading.main_thread():
                for signum in FORWARDED:
                    previous[signum] = signal.signal(signum, self._forward)
            else:
                log.info("not in the main thread: signals are not forwarded to the trainer")
            if self.watcher is not None:
                self.watcher.start()
            while self._proc.poll() is None:
                if self.watcher is None:
                    time.sleep(0.2)
                    continue
                notice, self._deferred = self._deferred, None
                if notice is None:
                    try:
                        notice = self.watcher.notices.get(timeout=0.2)
                    except queue.Empty:
                        continue
                try:
                    self.handle(notice)
                except Exception as exc:  # supervision goes on: the trainer still runs
                    log.warning("notice (%s) not handled: %s", notice.detail, exc)
                    self.telemetry.count("upload_failures", kind=notice.kind)
            code = self._proc.wait()
            if self._loop is not None and not self._loop.finish(self.snapshot_timeout_s):
                log.warning("a publish was still running at the end; left to finish")
            if code == EXIT_INCOMPATIBLE:
                self._trainer_refused()
        except BaseException:
            # No orphan: a trainer left running would train on unsupervised after we are gone.
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(self.snapshot_timeout_s)
            raise
        finally:
            if self.watcher is not None:
                self.watcher.stop()
            for signum, handler in previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signum, handler)
            shutil.rmtree(ready_dir, ignore_errors=True)
            self._ready_dir = None
        if self._resumable_stop and code in (-signal.SIGTERM, 128 + signal.SIGTERM):
            # An external trainer knows nothing of 42; we stopped it after its restore point
            # was published, so the run can be resumed and the scheduler should requeue it.
            log.info("trainer stopped after its restore point was published: exit 42")
            code = EXIT_RESUMABLE
        elif code < 0:  # killed by a signal: report it the shell way
            code = 128 - code
        self.telemetry.record("exit", exit_code=code, **self.telemetry.counts)
        return code


def _ungated_import(
    url: str, dest: Path, trust: Trust | None, storage_options: dict[str, Any] | None
) -> Any:
    """``--no-gate --force``: forensics. Integrity and the trust policy still hold."""
    from ..ops import import_restore_point

    return import_restore_point(
        url, dest, trust=trust_policy(trust), storage_options=storage_options
    )
