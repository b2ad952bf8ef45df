"""The run-directory contract, defined once: the files of a run directory, the environment a
supervisor (``restorepoint run``) hands a trainer, the ready files, the resumable exit code and
the stop markers that keep it through a launcher (torchrun), and asking a running trainer for a
snapshot. The runtime (ResumableRun), ``restorepoint
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

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._posix import Disposition, atomic_write, pid_alive, signal_disposition, started_after
from ..errors import NotFound, UsageError
from ..ops.local_view import CACHE_ROOT_ENV

__all__ = [
    "CACHE_ROOT_ENV",
    "CHECKPOINTS",
    "EVENTS_FILE",
    "EXIT_INCOMPATIBLE",
    "EXIT_RESUMABLE",
    "IDENTITY_FILE",
    "MAX_RESUBMITS_ENV",
    "POSITION_FILE",
    "READY_ENV",
    "REFUSED_FILE",
    "RESUME_DIR_ENV",
    "RESUME_HEAD_ENV",
    "RESUME_URL_ENV",
    "SIGNING_KEY_ENV",
    "STATUS_FILE",
    "STOP_DIR_ENV",
    "STORE_ENV",
    "TRAINER_FILE",
    "Ready",
    "RunDirectory",
    "leave_stop_marker",
    "max_resubmits_from_env",
    "now",
    "read_ready",
    "report_ready",
    "request_snapshot",
    "request_snapshot_of",
    "resumable_exit",
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
#: Written into the ready directory by a trainer whose resume the gate refused: the refused
#: field names, for the supervisor's telemetry.
REFUSED_FILE = "resume-refused.json"

IDENTITY_FILE = "config_identity.json"
STATUS_FILE = "run_status.json"
EVENTS_FILE = "events.jsonl"
TRAINER_FILE = "trainer.json"
TRACKER_FILE = "tracker_run_id"
CHECKPOINTS = "checkpoints"
POSITION_FILE = "position.json"


def max_resubmits_from_env() -> int | None:
    """``$RESTOREPOINT_MAX_RESUBMITS`` as a limit, or None when unset (or not a count)."""
    value = os.environ.get(MAX_RESUBMITS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        log.warning("%s=%r is not a count: ignored", MAX_RESUBMITS_ENV, value)
        return None
    return int(value)


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
        path = self.path / TRAINER_FILE
        atomic_write(path, _json_line(doc))
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


def report_ready(doc: Mapping[str, Any]) -> Path | None:
    """Write ``$RESTOREPOINT_READY_DIR/PID.json`` when a supervisor gave one; its path."""
    ready = os.environ.get(READY_ENV)
    if not ready:
        return None
    path = Path(ready) / f"{os.getpid()}.json"
    atomic_write(path, _json_line(doc))
    return path


def read_ready(ready_dir: Path) -> list[Ready]:
    """The trainers that reported themselves up in ``ready_dir`` and are still alive."""
    out: list[Ready] = []
    for path in sorted(ready_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            pid = int(doc["pid"])
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if pid_alive(pid):
            out.append(Ready(pid, doc.get("run"), doc.get("run_dir")))
    return out


# -- asking for a snapshot ---------------------------------------------------------------------


def request_snapshot(
    run_dir: str | os.PathLike[str], *, wait: float = 0.0
) -> tuple[int, int | None]:
    """Ask the process that takes this run's snapshot requests (``trainer.json``: the trainer
    itself, or its supervisor) for a snapshot now, without stopping it; with ``wait``, wait up
    to that many seconds for the snapshot to be taken. Returns the pid signalled and the step
    of the snapshot (None without ``wait``). NotFound when no live process took the report:
    ``trainer.json`` outlives a process killed by SIGKILL or the OOM killer, and its pid may be
    another process's by now (signalling that one would kill it)."""
    directory = RunDirectory(run_dir)
    record = directory.path / TRAINER_FILE
    try:
        doc = json.loads(record.read_text())
        pid = int(doc["pid"])
        signum = int(doc.get("snapshot_signal", signal.SIGUSR1))
    except FileNotFoundError:
        raise NotFound(
            "no running trainer reported in this run directory", url=str(run_dir)
        ) from None
    except (ValueError, KeyError, TypeError):
        raise UsageError("unreadable trainer.json", url=str(run_dir)) from None
    before = directory.events_size()
    if pid <= 0 or started_after(pid, record.stat().st_mtime):
        raise NotFound(
            f"the trainer (pid {pid}) is not running: that pid is another process's now",
            url=str(run_dir),
        )
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, OverflowError):
        raise NotFound(f"the trainer (pid {pid}) is not running", url=str(run_dir)) from None
    except PermissionError:
        raise NotFound(
            f"the trainer (pid {pid}) is not running: that pid is another user's process",
            url=str(run_dir),
        ) from None
    if wait <= 0:
        return pid, None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        for event in directory.events(before):
            if event.get("event") == "snapshot":
                return pid, int(event["step"])
        time.sleep(0.1)
    raise UsageError(f"no snapshot within {wait:g} s", url=str(run_dir))


def request_snapshot_of(pid: int, signum: int = signal.SIGUSR1) -> int:
    """Ask process ``pid`` (a supervisor, or a ResumableRun) for a snapshot: only where
    /proc says it catches the signal; a process that is not a trainer reported up (or not one
    of ours) does not, and would die of it."""
    state = signal_disposition(pid, signum) if pid > 0 else Disposition.GONE
    if state is Disposition.GONE:
        raise NotFound(f"no process {pid}")
    if state is not Disposition.CAUGHT:
        raise UsageError(
            f"process {pid} does not handle {signal.Signals(signum).name} "
            f"({state.value}): it is not a trainer that takes snapshot requests (or not up "
            "yet), and the signal could kill it"
        )
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise NotFound(f"no process {pid}") from None
    return pid


# -- the resumable exit through a launcher ------------------------------------------------------

#: ``stopped-LOCAL_RANK-of-LOCAL_WORLD_SIZE.json``: one per process of a node that stopped by
#: the contract. The Slurm template (restorepoint/slurm/template.py) reads the same names.
_STOP_MARKER = re.compile(r"stopped-(\d{1,6})-of-(\d{1,6})\.json")


def leave_stop_marker(doc: Mapping[str, Any]) -> Path | None:
    """This process ends by the stop contract (exit 42): say so in ``$RESTOREPOINT_STOP_DIR``,
    named after its local rank (torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; 0 of 1
    without a launcher). Nothing without the variable."""
    stop_dir = os.environ.get(STOP_DIR_ENV)
    if not stop_dir:
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    path = Path(stop_dir) / f"stopped-{local_rank}-of-{local_world}.json"
    atomic_write(path, _json_line({**doc, "exit": EXIT_RESUMABLE, "pid": os.getpid()}))
    return path


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
    contract; ``code`` otherwise."""
    if code not in (0, EXIT_RESUMABLE) and stopped_by_contract(stop_dir):
        return EXIT_RESUMABLE
    return code
