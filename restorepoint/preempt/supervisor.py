"""``restorepoint run``: the supervisor that turns reclaim notices into published restore points.

    restorepoint run --store URL [--adapter NAME] [--watch aws|gcp|none]
        [--resume-from URL | --auto-resume] -- TRAINER ARGS...

1. Resume, if asked: import the restore point through the gate and start the trainer with the
   adapter's resume arguments (a restorepoint.torch run is told where the import lies).
2. Start the trainer. A SIGUSR1 is a snapshot request (``restorepoint snapshot``), held until
   the trainer is up; SIGHUP is passed on. An external trainer runs in the spot-queue loop
   (``external.ExternalLoop``): every committed snapshot is published with the run's whole
   identity, verified, and the local checkpoints cleaned.
3. Watch for notices. On one, send the snapshot request to every trainer process that has
   reported itself up and catches the signal (one that does not would die of it), wait for
   the snapshot and for it to be published in the store, before the notice's deadline; say early
   when that cannot be made, and what is done instead. A stop notice then stops the trainer.
4. The stop contract (docs/preempt.md, "The stop contract"): SIGTERM, SIGINT and SIGUSR2 are a
   stop, like a stop notice. The state at the stop is snapshotted and published (a trainer
   that cannot snapshot: its newest periodic checkpoint), the trainer is stopped (SIGTERM,
   then SIGKILL after ``kill_after_s``), and the supervisor exits 42, also when the publish
   did not land in time (the store's previous restore point stays the newest; the log says
   so). A stop, and a notice with a deadline, set the store deadline (spec 15.5) to the time
   the supervisor waits for the publish (the notice's deadline less the margin, or
   ``snapshot_timeout_s`` from the stop) until the supervisor ends: no store request of its
   publishes is retried past it. A trainer that exits 42 (resumable) makes the supervisor exit
   42 too; no signal death code of a stopped trainer is passed on.

Trainers report themselves up by writing ``$RESTOREPOINT_READY_DIR/PID.json`` (ResumableRun does,
once its handlers are installed). Telemetry is a JSON-lines file of counts and timings: never a
URL, a path or a credential.
"""

from __future__ import annotations

import contextlib
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
from ..errors import RestorePointError, UsageError
from ..ops.gate import Expectations
from ..ops.publish import HeadSpec, PackOptions
from ..ops.store import KeepBest
from ..runtime.contract import (
    EXIT_INCOMPATIBLE,
    EXIT_RESUMABLE,
    INCREMENTAL_ENV,
    KEEP_BEST_ENV,
    READY_ENV,
    RESUME_DIR_ENV,
    SIGNING_KEY_ENV,
    STOP_DIR_ENV,
    STORE_ENV,
    Ready,
    ended_by_refusal,
    leave_stop_deadline,
    read_ready,
)
from ..runtime.snapshot_request import SnapshotTarget, request_snapshot
from ..trust import Trust, load_signing_key
from .external import ExternalLoop
from .notices import NoticeSteps
from .resume import ResumeSteps
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
#: What the supervisor takes as a stop: a VM shutting down or ``scancel`` (TERM), Ctrl-C (INT),
#: the Slurm template's forwarded time-limit warning (USR2).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
#: Passed on to the trainer as it comes.
PASSED_ON = (signal.SIGHUP,)
HANDLED = (*STOP_SIGNALS, *PASSED_ON, signal.SIGUSR1)
#: Seconds from the SIGTERM that stops the trainer to the SIGKILL if it has not ended: below
#: Slurm's default KillWait (30 s), so that the escalation is ours, not Slurm's.
DEFAULT_KILL_AFTER = 25.0


def publishes_itself(adapter: Adapter | None) -> bool:
    """Whether the trainer publishes its snapshots itself (into $RESTOREPOINT_STORE), and gates
    its own resumes: no adapter (a restorepoint.torch run is assumed) or the torch adapter."""
    if adapter is None:
        return True
    declared = getattr(adapter, "self_publishing", None)
    return bool(declared) if declared is not None else adapter.name == "torch"


@dataclass
class Supervisor(ResumeSteps, NoticeSteps):
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
    #: retention by metric, for the supervisor's publishes and handed to the trainer
    #: (``KEEP_BEST_ENV``) for its own
    keep_best: KeepBest | None = None
    #: seconds from the SIGTERM that stops the trainer to a SIGKILL (``--kill-after``)
    kill_after_s: float = DEFAULT_KILL_AFTER
    #: ``--incremental`` (True), ``--full`` (False) or neither (None: incremental where it can
    #: be), for the supervisor's publishes and handed to the trainer (``INCREMENTAL_ENV``)
    incremental: bool | None = None

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
        # A stop signal received (handled by the main loop, not in the handler) and a
        # snapshot request (SIGUSR1) waiting to be passed on.
        self._stop_signal: int | None = None
        self._snapshot_asked = False
        # The stop taken (a signal's name or a notice's kind), when the trainer gets SIGKILL
        # if it has not ended, and whether it did.
        self._stop_taken: str | None = None
        self._kill_at: float | None = None
        self._killed = False
        # A resume a trainer that gates itself has still to accept: recorded in telemetry
        # once it did (its ``resumed`` event, or an exit other than 3), never before a refusal.
        self._pending_resume: dict[str, Any] | None = None
        self._resume_checked = 0.0
        self._marker = None
        self._marker_renewed = 0.0
        # The spot-queue loop around an external trainer (made by run_trainer).
        self._loop: ExternalLoop | None = None
        # The store deadlines a stop or a notice set (the earliest wins), undone when
        # run_trainer ends: the deadline is process-global and must not outlive the run.
        self._deadlines = contextlib.ExitStack()

    @property
    def self_publishing(self) -> bool:
        return publishes_itself(self.adapter)

    # -- the trainer's processes ------------------------------------------------------------

    def ready(self) -> list[Ready]:
        """Trainer processes that have reported themselves up (and are still alive)."""
        if self._ready_dir is None:
            return []
        return read_ready(self._ready_dir)

    def _snapshot_ready(self) -> int:
        """A snapshot request to each trainer process reported up, through the one request
        function: a process that does not catch its signal is not sent it."""
        sent = 0
        for r in self.ready():
            try:
                request_snapshot(SnapshotTarget(r.pid, r.snapshot_signal))
            except RestorePointError as exc:
                log.warning("snapshot request not sent: %s", exc)
                continue
            sent += 1
        return sent

    def _leave_deadline(self, when: float) -> None:
        """Tell the trainers until when (``time.time()``) this stop waits for their restore
        point, before they are asked to stop (``contract.stop_store_deadline``)."""
        if self._ready_dir is None:
            return
        try:
            leave_stop_deadline(self._ready_dir, when)
        except OSError as exc:
            log.warning("could not tell the trainer the stop's deadline: %s", exc)

    def _stop_ready(self) -> int:
        sent = 0
        for r in self.ready():
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.pid, signal.SIGTERM)
                sent += 1
        return sent

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        # Only flags here: the main loop acts on them (a handler that logs, reads /proc or
        # waits could deadlock the thread it interrupted).
        if signum == signal.SIGUSR1:
            self._snapshot_asked = True
            return
        if signum in STOP_SIGNALS:
            if self._stop_signal is None:
                self._stop_signal = signum
            return
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)

    def _ask_snapshot(self) -> None:
        """A snapshot request (SIGUSR1 to the supervisor, ``restorepoint snapshot``)."""
        if self._loop is not None:
            if self._loop.up and not self._loop.can_snapshot():
                log.warning(
                    "snapshot request: this trainer does not handle the snapshot signal: "
                    "not sent (it would kill it)"
                )
                return
            self._loop.request_snapshot()
        else:
            self._snapshot_ready()

    # -- stopping the trainer ----------------------------------------------------------------

    def _stop_trainer(self, deadline: float | None = None) -> None:
        """SIGTERM to the trainer, and the SIGKILL armed for ``kill_after_s`` later (or the
        notice's deadline, when that is later)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)
        self._arm_kill(deadline)

    def _arm_kill(self, deadline: float | None = None) -> None:
        if self._kill_at is None:
            self._kill_at = max(time.time() + self.kill_after_s, deadline or 0.0)

    def _escalate(self) -> None:
        """SIGKILL to a trainer that outlived its grace after SIGTERM (its whole process
        group when it runs in a session of its own, as an external trainer does)."""
        if self._kill_at is None or self._killed or self._proc is None:
            return
        if self._proc.poll() is not None or time.time() < self._kill_at:
            return
        self._killed = True
        log.warning("the trainer has not ended %g s after SIGTERM: SIGKILL", self.kill_after_s)
        self.telemetry.record("killed", seconds=self.kill_after_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._loop is not None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            else:
                self._proc.kill()

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
            incremental=self.incremental,
        )
        return ExternalLoop(
            self.adapter, self.workdir, self.store, head, options, self.telemetry,
            keep_last=self.keep_last, keep_local=self.keep_local, keep_best=self.keep_best,
        )  # fmt: skip

    # -- main ------------------------------------------------------------------------------

    def _trainer_env(self, ready_dir: Path) -> dict[str, str]:
        """The trainer's environment: this one's, and what a trainer that publishes itself
        takes from its supervisor (the store, retention, signing key, --full)."""
        env = os.environ.copy()
        env[READY_ENV] = str(ready_dir)
        env[STORE_ENV] = self.store
        env.update({KEEP_BEST_ENV: self.keep_best.to_text()} if self.keep_best else {})
        if self.signing_key is not None:
            env[SIGNING_KEY_ENV] = self.signing_key
        if self.incremental is not None:
            env[INCREMENTAL_ENV] = "1" if self.incremental else "0"
        return env

    def run_trainer(self) -> int:
        ready_dir = self._ready_dir = Path(tempfile.mkdtemp(prefix="restorepoint-ready-"))
        env = self._trainer_env(ready_dir)
        previous: dict[signal.Signals, Any] = {}
        code: int | None = None
        try:
            if threading.current_thread() is threading.main_thread():
                # Before the trainer starts (its exec resets them to the default): a stop
                # that comes during the resume's import is a stop, not the supervisor's death.
                for signum in HANDLED:
                    previous[signum] = signal.signal(signum, self._forward)
            else:
                log.info("not in the main thread: signals are not forwarded to the trainer")
            command = self._prepare_resume(env)
            if self._stop_signal is not None:
                log.warning(
                    "stop (%s) before the trainer started: nothing to snapshot; exit 42",
                    _signal_name(self._stop_signal),
                )
                code = EXIT_RESUMABLE
            else:
                code = self._supervise(command, env)
        except BaseException:
            # No orphan: a trainer left running would train on unsupervised after we are gone.
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(self.kill_after_s)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            raise
        finally:
            self._release_marker()
            self._deadlines.close()
            if self.watcher is not None:
                self.watcher.stop()
            for signum, handler in previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signum, handler)
            shutil.rmtree(ready_dir, ignore_errors=True)
            self._ready_dir = None
        self.telemetry.record("exit", exit_code=code, **self.telemetry.counts)
        return code

    def _supervise(self, command: list[str], env: dict[str, str]) -> int:  # noqa: PLR0912 - the main loop: signals, requests, notices, then the exit code
        """Start the trainer, act on signals and notices until it ends; its exit code under
        the stop contract."""
        if self.self_publishing:
            # SIGUSR2 and SIGINT (a stop of the supervisor, which stops the trainer with
            # SIGTERM) also reach the trainer from Slurm or a terminal: ignored from its
            # start, so that a plain command does not die of them; a ResumableRun or a
            # Lightning callback installs its own handler over it.
            # (signal.signal in the child takes no lock a thread of ours could hold.)
            self._proc = subprocess.Popen(command, env=env, preexec_fn=_ignore_stop_signals)  # noqa: PLW1509
        else:
            self._loop = self._external_loop()
            self._proc = self._loop.start(command, env).popen
        if self.watcher is not None:
            self.watcher.start()
        while self._proc.poll() is None:
            self._escalate()
            notice: Notice | None = None
            if self._stop_signal is not None and self._stop_taken is None:
                name = _signal_name(self._stop_signal)
                notice = Notice("stop", "signal", time.time(), None, name)
            elif self._snapshot_asked:
                self._snapshot_asked = False
                self._ask_snapshot()
                continue
            else:
                self._check_resumed()
                notice, self._deferred = self._deferred, None
            if notice is None:
                if self.watcher is None:
                    time.sleep(0.1)
                    continue
                try:
                    notice = self.watcher.notices.get(timeout=0.1)
                except queue.Empty:
                    continue
            try:
                self.handle(notice)
            except Exception as exc:  # supervision goes on: the trainer still runs
                log.warning("notice (%s) not handled: %s", notice.detail, exc)
                self.telemetry.count("upload_failures", kind=notice.kind)
                if notice.kind == "stop":
                    self._stop_trainer(notice.deadline)
        code = self._proc.wait()
        if self._stop_taken is None and self._stop_signal is not None:
            # The trainer ended before the stop was acted on (Slurm signals the whole step).
            self._stop_taken = _signal_name(self._stop_signal)
            log.warning(
                "stop (%s): the trainer ended before its snapshot was asked for: the store's "
                "newest restore point stays what it was; exit 42",
                self._stop_taken,
            )
        if self._loop is not None and not self._loop.finish(self.snapshot_timeout_s):
            log.warning("a publish was still running at the end; left to finish")
        code = _refused_through_launcher(code)
        if code == EXIT_INCOMPATIBLE:
            self._trainer_refused()
        else:
            self._record_resumed()
        died = code < 0 or 128 < code <= 128 + signal.SIGRTMAX
        if self._stop_taken is not None and (died or self._killed):
            # The stop contract: a trainer we stopped ends the run resumably, whatever
            # signal it died of; the scheduler requeues on 42 and never sees 128 + N.
            log.info(
                "the trainer ended by the stop (%s): exit 42",
                "SIGKILL" if self._killed else _signal_name(-code if code < 0 else code - 128),
            )
            return EXIT_RESUMABLE
        return 128 - code if code < 0 else code  # killed by a signal: the shell way


def _refused_through_launcher(code: int) -> int:
    """Exit 3 where a launcher failed (torchrun and accelerate launch exit 1 when a worker
    exits 3) because a worker's resume was refused: it left its marker in the stop
    directory."""
    stop_dir = os.environ.get(STOP_DIR_ENV)
    if code in (0, EXIT_RESUMABLE, EXIT_INCOMPATIBLE) or not stop_dir:
        return code
    if not ended_by_refusal(Path(stop_dir)):
        return code
    log.info("the trainer's launcher exited %d after a refused resume: exit 3", code)
    return EXIT_INCOMPATIBLE


def _ignore_stop_signals() -> None:
    for signum in (signal.SIGUSR2, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
