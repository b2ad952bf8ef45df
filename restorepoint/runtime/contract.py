"""The run-directory contract, defined once: the files of a run directory, the environment a
supervisor (``restorepoint run``) hands a trainer, the ready files, the resumable exit code and
the stop markers that keep it through a launcher (torchrun); asking a running trainer for a
snapshot is ``snapshot_request``'s. The runtime (ResumableRun), ``restorepoint
snapshot`` and the supervisor read and write these through this module and nowhere else
(docs/adapters.md, "Files in the run directory").

    RUN_DIR/
      config_identity.json   config, identity, operational keys, run id, seed (written once)
      run_status.json        running / preempted / completed / failed, resubmit count, ...
      events.jsonl           one JSON object a line, in time order, fsynced
      trainer.json           who to signal for a snapshot: the trainer, or its supervisor
      tracker_run_id         a tracker's run id, best effort
      checkpoints/           last.pt (last.rankN.pt), position.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._posix import (
    atomic_write,
    pid_alive,
    process_start_time,
    read_regular,
)
from .._text import printable
from ..errors import RestorePointError
from ..ops.local_view import CACHE_ROOT_ENV

__all__ = [
    "CACHE_ROOT_ENV",
    "CHECKPOINTS",
    "EVENTS_FILE",
    "EVENTS_LIMIT",
    "EVENTS_READ_LIMIT",
    "EXIT_INCOMPATIBLE",
    "EXIT_RESUMABLE",
    "IDENTITY_FILE",
    "INCREMENTAL_ENV",
    "KEEP_BEST_ENV",
    "MAX_RESUBMITS_ENV",
    "POSITION_FILE",
    "READY_ENV",
    "REFUSED_FILE",
    "RESUME_DIR_ENV",
    "RESUME_HEAD_ENV",
    "RESUME_URL_ENV",
    "SIGNING_KEY_ENV",
    "STATUS_FILE",
    "STOP_DEADLINE_FILE",
    "STOP_DIR_ENV",
    "STORE_ENV",
    "TRAINER_FILE",
    "TRAINER_RECORD_LIMIT",
    "Ready",
    "RunDirectory",
    "ended_by_refusal",
    "incremental_from_env",
    "is_int",
    "leave_refusal_marker",
    "leave_stop_deadline",
    "leave_stop_marker",
    "max_resubmits_from_env",
    "now",
    "read_ready",
    "report_ready",
    "report_refusal",
    "resumable_exit",
    "stop_store_deadline",
    "stopped_by_contract",
]

log = logging.getLogger("restorepoint.torch")

#: The documented exit code of a run that stopped on request and can be resumed (42).
EXIT_RESUMABLE = 42
#: A resume the gate refused: the trainer did not train; a scheduler must not requeue it.
EXIT_INCOMPATIBLE = 3

#: Where a supervised trainer reports itself up: ``$RESTOREPOINT_READY_DIR/PID.json``.
READY_ENV = "RESTOREPOINT_READY_DIR"
#: The store a supervisor publishes to, handed to a trainer that publishes itself.
STORE_ENV = "RESTOREPOINT_STORE"
#: A supervisor's retention by metric (``run --keep-best K --metric NAME --mode MODE``), as
#: ``K NAME MODE``: a ResumableRun or a PreemptionCallback given none of its own prunes by it.
KEEP_BEST_ENV = "RESTOREPOINT_KEEP_BEST"
#: A restore point the supervisor imported for the trainer: the payload directory ...
RESUME_DIR_ENV = "RESTOREPOINT_RESUME_DIR"
#: ... and its head, which a trainer that gates itself compares with its own local view.
RESUME_HEAD_ENV = "RESTOREPOINT_RESUME_HEAD"
#: ... and where it came from (the URL), which the trainer names in what it prints.
RESUME_URL_ENV = "RESTOREPOINT_RESUME_URL"
#: The resubmit limit the Slurm template enforces (``--max-resubmits``): a ResumableRun that
#: is given no ``max_resubmit_attempts`` takes it, so that the template and the trainer bound
#: the same count (each stop is one resubmit).
MAX_RESUBMITS_ENV = "RESTOREPOINT_MAX_RESUBMITS"
#: Where each process that ends by the stop contract (exit 42) leaves a marker, so that a
#: launcher which turns a worker's 42 into its own 1 (torchrun) can be mapped back to 42.
STOP_DIR_ENV = "RESTOREPOINT_STOP_DIR"
#: The Ed25519 private key a supervised trainer signs its restore points with.
SIGNING_KEY_ENV = "RESTOREPOINT_SIGNING_KEY"
#: A supervisor's ``--full`` (0) or ``--incremental`` (1), for a trainer that publishes itself
#: and is given no choice of its own (``incremental_from_env``).
INCREMENTAL_ENV = "RESTOREPOINT_INCREMENTAL"
#: Written into the ready directory by a trainer whose resume the gate refused: the refused
#: field names, for the supervisor's telemetry.
REFUSED_FILE = "resume-refused.json"

#: Written into the ready directory by a supervisor before it stops its trainer: until when
#: (``time.time()``) it waits for the trainer's restore point (a notice's deadline less the
#: margin; a stop without one, its snapshot timeout). Not named ``*.json``: no ready file.
STOP_DEADLINE_FILE = "stop-deadline"
STOP_DEADLINE_LIMIT = 4096

IDENTITY_FILE = "config_identity.json"
STATUS_FILE = "run_status.json"
EVENTS_FILE = "events.jsonl"
TRAINER_FILE = "trainer.json"
TRACKER_FILE = "tracker_run_id"
CHECKPOINTS = "checkpoints"
POSITION_FILE = "position.json"
#: Size caps of the run-directory files read as hostile: trainer.json and a ready file, and
#: events.jsonl (as a whole, and what a snapshot request reads of it while waiting).
TRAINER_RECORD_LIMIT = 64 * 1024
EVENTS_LIMIT = 256 * 1024 * 1024
EVENTS_READ_LIMIT = 4 * 1024 * 1024


def is_int(value: object) -> bool:
    """An int of a JSON document, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def max_resubmits_from_env() -> int | None:
    """``$RESTOREPOINT_MAX_RESUBMITS`` as a limit, or None when unset (or not a count)."""
    value = os.environ.get(MAX_RESUBMITS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        log.warning("%s=%r is not a count: ignored", MAX_RESUBMITS_ENV, value)
        return None
    return int(value)


def incremental_from_env(given: bool | None = None) -> bool | None:
    """``given``, or when None the supervisor's choice in ``$RESTOREPOINT_INCREMENTAL``: 0
    (``run --full``) is False; anything else, 1 (``run --incremental``) or unset, is None,
    the default: incremental into a store where it can be, so that a multi-rank trainer
    under ``run --incremental`` publishes full parts rather than fail."""
    if given is not None:
        return given
    return False if os.environ.get(INCREMENTAL_ENV, "").strip() == "0" else None


def now() -> str:
    """The time as the run directory's files record it (UTC, microseconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_line(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


class RunDirectory:
    """One run's directory and the files of the contract. Small files are written atomically
    (a reader, or a crash, sees the old or the new one whole); events are appended one line
    at a time and fsynced, stamped and written under one lock so that the training thread and
    the snapshot worker keep them in time order."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._events = threading.Lock()

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    # -- identity --------------------------------------------------------------------------

    def identity_record(self) -> dict[str, Any] | None:
        try:
            doc = json.loads((self.path / IDENTITY_FILE).read_text())
        except FileNotFoundError:
            return None
        return doc if isinstance(doc, dict) else {}

    def write_identity_record(self, doc: Mapping[str, Any]) -> None:
        atomic_write(self.path / IDENTITY_FILE, json.dumps(doc, indent=2).encode() + b"\n")

    # -- status and events -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``run_status.json`` (mutable control state), or {} when it is missing or torn."""
        try:
            data = json.loads((self.path / STATUS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_status(self, doc: Mapping[str, Any]) -> None:
        atomic_write(self.path / STATUS_FILE, json.dumps(doc, indent=2).encode() + b"\n")

    def append_event(self, kind: str, **fields: Any) -> None:
        # One write of one line, then fsync: a crash leaves whole lines (at most one torn last
        # line, which readers skip).
        with self._events:
            line = _json_line({"event": kind, "time": now(), **fields})
            fd = os.open(self.path / EVENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def events_size(self) -> int:
        try:
            return (self.path / EVENTS_FILE).stat().st_size
        except FileNotFoundError:
            return 0

    def events(self, offset: int = 0) -> Iterator[dict[str, Any]]:
        """The events from byte ``offset`` on; a torn or foreign line is skipped."""
        try:
            with open(self.path / EVENTS_FILE, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return
        for line in data.decode(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                yield doc

    # -- who takes snapshot requests -------------------------------------------------------

    def write_trainer_report(self, doc: Mapping[str, Any]) -> Path:
        """Write ``trainer.json``: who takes this run's snapshot requests. Each pid in it is
        recorded with its start time (/proc), so that ``restorepoint snapshot`` signals that
        process and never another one that got the pid later."""
        record = dict(doc)
        for pid_key, time_key in (("pid", "start_time"), ("trainer_pid", "trainer_start_time")):
            pid = record.get(pid_key)
            if isinstance(pid, int) and time_key not in record:
                started = process_start_time(pid)
                if started is not None:
                    record[time_key] = started
        path = self.path / TRAINER_FILE
        atomic_write(path, _json_line(record))
        return path

    # -- the tracker -----------------------------------------------------------------------

    @property
    def tracker_run_id(self) -> str | None:
        try:
            return (self.path / TRACKER_FILE).read_text().strip() or None
        except OSError:
            return None

    def set_tracker_run_id(self, value: str) -> None:
        atomic_write(self.path / TRACKER_FILE, value.encode() + b"\n")


# -- ready files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """A trainer process that has reported itself up (its handlers installed)."""

    pid: int
    run: str | None
    run_dir: str | None
    snapshot_signal: int = int(signal.SIGUSR1)


def report_refusal(exc: RestorePointError, *, main: bool = True) -> None:
    """A trainer's own gate refused (or could not read) the restore point it was to resume:
    one line and the mismatches on stderr, as the CLI prints them, and (``main``: one process
    of the run does it) the refused field names beside the ready file, for the supervisor's
    telemetry. Every trainer that gates itself ends a refusal this way."""
    lines = [f"restorepoint: error: {printable(str(exc))}"]
    lines += [f"restorepoint:   {printable(d)}" for d in getattr(exc, "details", ())]
    print("\n".join(lines), file=sys.stderr, flush=True)
    if exc.exit_code == EXIT_INCOMPATIBLE:
        # (A restore point that could not be read, exit 1, stays exit 1 through a launcher.)
        with contextlib.suppress(OSError, ValueError):
            leave_refusal_marker(exc)
    ready = os.environ.get(READY_ENV)
    if ready and main:
        fields = [m["field"] for m in getattr(exc, "mismatches", ())]
        doc = {"class": type(exc).__name__, "fields": fields, "pid": os.getpid()}
        with contextlib.suppress(OSError):
            atomic_write(Path(ready) / REFUSED_FILE, json.dumps(doc).encode() + b"\n")


def ready_document(
    run: str | None, run_dir: Path, *, rank: int | None = None, snapshot_signal: int | None = None
) -> dict[str, Any]:
    """What a trainer says of itself when its handlers are up (``report_ready``, the run
    directory's trainer.json): its pid, run and run directory, and where known its rank and
    the signal that asks it for a snapshot (``read_ready`` reads them back)."""
    doc: dict[str, Any] = {"pid": os.getpid(), "run": run, "run_dir": str(run_dir.resolve())}
    if rank is not None:
        doc["rank"] = rank
    if snapshot_signal is not None:
        doc["snapshot_signal"] = snapshot_signal
    return doc


def report_ready(doc: Mapping[str, Any]) -> Path | None:
    """Write ``$RESTOREPOINT_READY_DIR/PID.json`` when a supervisor gave one; its path."""
    ready = os.environ.get(READY_ENV)
    if not ready:
        return None
    path = Path(ready) / f"{os.getpid()}.json"
    atomic_write(path, _json_line(doc))
    return path


def leave_stop_deadline(ready_dir: Path, when: float) -> None:
    """A supervisor's side of ``stop_store_deadline``: say until when (``time.time()``) it
    waits for the restore point of the stop it is about to ask for."""
    atomic_write(ready_dir / STOP_DEADLINE_FILE, _json_line({"deadline": when}))


def stop_store_deadline(upload_timeout: float) -> tuple[float, bool]:
    """The store deadline (``time.monotonic()``) of a stop that waits ``upload_timeout`` for
    its publish, and whether a supervisor's deadline set it. Under ``restorepoint run`` it is
    the deadline the supervisor left (``leave_stop_deadline``) where that is sooner and still
    ahead: the publish then aims at the time the supervisor waits for it (a termination
    notice's deadline less the margin), its codec chosen and its retries bounded by it (spec
    15.5, 13 W4b). The file is read as hostile (a regular file, capped, one finite number); a
    missing, unreadable or past one leaves ``upload_timeout``."""
    own = time.monotonic() + upload_timeout
    ready = os.environ.get(READY_ENV)
    if not ready:
        return own, False
    try:
        when = json.loads(read_regular(Path(ready) / STOP_DEADLINE_FILE, limit=STOP_DEADLINE_LIMIT))
        when = when["deadline"]
    except (ValueError, KeyError, TypeError, OSError, RecursionError):
        return own, False
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not math.isfinite(when):
        return own, False
    theirs = time.monotonic() + (when - time.time())
    if not time.monotonic() < theirs < own:
        return own, False
    return theirs, True


def read_ready(ready_dir: Path) -> list[Ready]:
    """The trainers that reported themselves up in ``ready_dir`` and are still alive."""
    out: list[Ready] = []
    for path in sorted(ready_dir.glob("*.json")):
        try:
            doc = json.loads(read_regular(path, limit=TRAINER_RECORD_LIMIT))
            pid = doc["pid"]
            signum = doc.get("snapshot_signal", int(signal.SIGUSR1))
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if not (is_int(pid) and is_int(signum)):
            continue
        if pid_alive(pid):
            out.append(Ready(pid, doc.get("run"), doc.get("run_dir"), signum))
    return out


# -- the resumable exit through a launcher ------------------------------------------------------

#: ``stopped-LOCAL_RANK-of-LOCAL_WORLD_SIZE.json``: one per process of a node that stopped by
#: the contract. The Slurm template (restorepoint/slurm/template.py) reads the same names.
_STOP_MARKER = re.compile(r"stopped-(\d{1,6})-of-(\d{1,6})\.json")
#: ``refused-LOCAL_RANK-of-LOCAL_WORLD_SIZE.json``: a process whose resume was refused (exit 3).
_REFUSAL_MARKER = re.compile(r"refused-(\d{1,6})-of-(\d{1,6})\.json")


def leave_stop_marker(doc: Mapping[str, Any]) -> Path | None:
    """This process ends by the stop contract (exit 42): say so in ``$RESTOREPOINT_STOP_DIR``,
    named after its local rank (torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; 0 of 1
    without a launcher). Nothing without the variable."""
    stop_dir = os.environ.get(STOP_DIR_ENV)
    if not stop_dir:
        return None
    path = _local_marker(stop_dir, "stopped")
    atomic_write(path, _json_line({**doc, "exit": EXIT_RESUMABLE, "pid": os.getpid()}))
    return path


def _local_marker(stop_dir: str, kind: str) -> Path:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return Path(stop_dir) / f"{kind}-{local_rank}-of-{local_world}.json"


def leave_refusal_marker(exc: RestorePointError) -> Path | None:
    """This process ends by a refused resume (exit 3): say so in ``$RESTOREPOINT_STOP_DIR``
    (``refused-LOCAL_RANK-of-LOCAL_WORLD_SIZE.json``), so that a launcher's failure (torchrun
    and ``accelerate launch`` exit 1 when a worker exits 3) is still exit 3. Nothing without
    the variable."""
    stop_dir = os.environ.get(STOP_DIR_ENV)
    if not stop_dir:
        return None
    path = _local_marker(stop_dir, "refused")
    doc = {"class": type(exc).__name__, "exit": exc.exit_code, "pid": os.getpid()}
    atomic_write(path, _json_line(doc))
    return path


def ended_by_refusal(stop_dir: Path) -> bool:
    """Whether a process of this node refused its resume (left a refusal marker in
    ``stop_dir``) and none stopped by the contract. Only the names are read."""
    try:
        names = [p.name for p in stop_dir.iterdir()]
    except OSError:
        return False
    refused = [n for n in names if n.startswith("refused-")]
    return (
        bool(refused)
        and all(_REFUSAL_MARKER.fullmatch(n) for n in refused)
        and not any(n.startswith("stopped-") for n in names)
    )


def stopped_by_contract(stop_dir: Path) -> bool:
    """Whether every process of a node left a stop marker in ``stop_dir``: local ranks 0 to
    N-1 of one N, and nothing else. Only the names are read."""
    try:
        names = [p.name for p in stop_dir.iterdir()]
    except OSError:
        return False
    markers = [name for name in names if name.startswith("stopped-")]
    found = [m for m in map(_STOP_MARKER.fullmatch, markers) if m is not None]
    if len(found) != len(markers):
        return False
    worlds = {int(m.group(2)) for m in found}
    if len(worlds) != 1:
        return False
    (world,) = worlds
    return {int(m.group(1)) for m in found} == set(range(world))


def resumable_exit(code: int, stop_dir: Path) -> int:
    """A launcher's exit code as the scheduler should see it: 42 where the launcher failed
    (torchrun exits 1 when a worker exits 42) but every worker of this node ended by the stop
    contract; 3 where it failed because a worker's resume was refused (and none stopped);
    ``code`` otherwise."""
    if code in (0, EXIT_RESUMABLE, EXIT_INCOMPATIBLE):
        return code
    if stopped_by_contract(stop_dir):
        return EXIT_RESUMABLE
    if ended_by_refusal(stop_dir):
        return EXIT_INCOMPATIBLE
    return code
