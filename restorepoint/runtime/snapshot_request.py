"""Asking a running trainer for a snapshot (``restorepoint snapshot``, the supervisor, the
adapters): who to signal is read from the run directory's ``trainer.json`` (written by the
runtime or a supervisor, capped in size and checked as hostile), the process is checked to be
the one recorded and to catch the signal, the signal is sent, and the request waits for the
``snapshot`` event in ``events.jsonl``. Part of the run-directory contract (``contract``),
which names the files."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .._posix import (
    Disposition,
    pid_alive,
    process_start_time,
    read_regular,
    signal_disposition,
)
from ..errors import NotFound, UsageError
from .contract import (
    EVENTS_FILE,
    EVENTS_LIMIT,
    EVENTS_READ_LIMIT,
    TRAINER_FILE,
    TRAINER_RECORD_LIMIT,
    is_int,
)

__all__ = [
    "SNAPSHOT_SIGNALS",
    "SnapshotTarget",
    "Watched",
    "request_snapshot",
    "trainer_record",
]

#: The signals a snapshot request may be: SIGUSR1, and the real-time signals. Never a stop
#: signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR2, ...) or one that cannot be caught: a run
#: directory naming one is refused. A profile's own signal is allowed for the trainer its
#: adapter started (``SnapshotTarget.allowed``).
SNAPSHOT_SIGNALS = frozenset({int(signal.SIGUSR1), *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)})
#: The largest pid Linux hands out (PID_MAX_LIMIT, 2**22).
_PID_MAX = 1 << 22


@dataclass(frozen=True)
class Watched:
    """A process that must catch its snapshot signal before a request is sent to a process
    that will pass it on (an external trainer behind its supervisor)."""

    pid: int
    signum: int
    start_time: int | None = None


@dataclass(frozen=True)
class SnapshotTarget:
    """Whom a snapshot request goes to: the process (``pid``, with its start time when a
    record gave one), the signal, the signals allowed for it, and the processes behind it
    that must catch theirs too."""

    pid: int
    signum: int = int(signal.SIGUSR1)
    start_time: int | None = None
    allowed: frozenset[int] = SNAPSHOT_SIGNALS
    behind: tuple[Watched, ...] = ()
    #: what the record came from, for the refusal lines
    url: str | None = None


def trainer_record(run_dir: str | os.PathLike[str]) -> SnapshotTarget:
    """Read ``RUN_DIR/trainer.json`` as what it is: hostile until checked. Read through the
    non-blocking regular-file reader with a size cap (a FIFO, a directory or a huge file is
    refused, never waited on); every field must have its type (no float or string pid, no
    boolean signal)."""
    from .._posix import FileTooLarge, NotRegularFile

    where = str(run_dir)
    path = Path(run_dir) / TRAINER_FILE
    try:
        raw = read_regular(path, limit=TRAINER_RECORD_LIMIT)
    except FileNotFoundError:
        raise NotFound("no running trainer reported in this run directory", url=where) from None
    except NotRegularFile:
        raise UsageError("trainer.json is not a regular file: not read", url=where) from None
    except FileTooLarge:
        raise UsageError(
            f"trainer.json is larger than {TRAINER_RECORD_LIMIT} bytes: not read", url=where
        ) from None
    except OSError as exc:
        raise UsageError(f"trainer.json cannot be read ({exc.strerror})", url=where) from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UsageError("unreadable trainer.json", url=where) from None
    if not isinstance(doc, dict):
        raise UsageError("unreadable trainer.json: not an object", url=where)

    def integer(name: str, default: int | None = None) -> int | None:
        value = doc.get(name, default)
        if value is None or is_int(value):
            return value
        raise UsageError(f"trainer.json: {name} is not an integer", url=where)

    pid = integer("pid")
    if pid is None:
        raise UsageError("unreadable trainer.json: no pid", url=where)
    signum = integer("snapshot_signal", int(signal.SIGUSR1))
    assert signum is not None
    start_time = integer("start_time")
    behind: tuple[Watched, ...] = ()
    trainer_pid = integer("trainer_pid")
    if trainer_pid is not None:
        trainer_signal = integer("trainer_signal", int(signal.SIGUSR1))
        assert trainer_signal is not None
        behind = (Watched(trainer_pid, trainer_signal, integer("trainer_start_time")),)
    return SnapshotTarget(pid, signum, start_time, behind=behind, url=where)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _check_pid(pid: int, url: str | None) -> None:
    if not is_int(pid) or not 0 < pid <= _PID_MAX:
        raise UsageError(f"pid {pid!r} is not a process id", url=url)


def _check_process(pid: int, start_time: int | None, url: str | None, who: str) -> None:
    """The process is alive, the one the record names (its start time), and this user's:
    the uid from /proc, so that root is refused another user's process too."""
    from .._posix import process_owner

    if not pid_alive(pid):
        raise NotFound(f"{who} (pid {pid}) is not running", url=url)
    started = process_start_time(pid)
    if start_time is None and started is not None and url is not None:
        # A record that cannot say which process wrote it: its pid may be anyone's by now.
        raise NotFound(
            f"trainer.json records no start time for pid {pid}: cannot tell that it is still "
            "the trainer (a record of an older restorepoint, or not written by one)",
            url=url,
        )
    if start_time is not None and started != start_time:
        raise NotFound(
            f"{who} (pid {pid}) is not running: that pid is another process's now", url=url
        )
    owner = process_owner(pid)
    uid = os.getuid()
    if owner is None or owner[0] != uid or owner[1] != uid:
        raise NotFound(
            f"{who} (pid {pid}) is not yours: that pid is another user's process", url=url
        )


def _check_catches(pid: int, signum: int, url: str | None) -> None:
    state = signal_disposition(pid, signum)
    if state is Disposition.GONE:
        raise NotFound(f"the trainer (pid {pid}) is not running", url=url)
    if state is not Disposition.CAUGHT:
        raise UsageError(
            f"this trainer does not handle the snapshot signal: pid {pid} does not catch "
            f"{_signal_name(signum)} ({state.value}; not up yet, or not a trainer that takes "
            "snapshot requests), and the signal would kill it: not sent",
            url=url,
        )


def _send(target: SnapshotTarget) -> None:
    """Every check, then the signal, to the very process checked: a pidfd is opened first, so
    a pid that comes round again between the checks and the signal is not signalled."""
    url, pid, signum = target.url, target.pid, target.signum
    _check_pid(pid, url)
    if not is_int(signum) or signum not in target.allowed:
        raise UsageError(
            f"{_signal_name(signum) if is_int(signum) else repr(signum)} is not a snapshot "
            "signal: only SIGUSR1 (or a real-time signal) is ever sent for a snapshot",
            url=url,
        )
    for other in target.behind:
        _check_pid(other.pid, url)
        _check_process(other.pid, other.start_time, url, "the trainer")
        _check_catches(other.pid, other.signum, url)
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise NotFound(f"the trainer (pid {pid}) is not running", url=url) from None
    except (OSError, AttributeError):
        pidfd = None  # no pidfds here: the checks and the kill race a pid reused in between
    try:
        _check_process(pid, target.start_time, url, "the trainer")
        _check_catches(pid, signum, url)
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            raise NotFound(f"the trainer (pid {pid}) is not running", url=url) from None
        except PermissionError:
            raise NotFound(
                f"the trainer (pid {pid}) is not yours: that pid is another user's process",
                url=url,
            ) from None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _events_offset(run_dir: Path, url: str) -> int:
    from .._posix import FileTooLarge, NotRegularFile

    path = run_dir / EVENTS_FILE
    try:
        # Nothing read: the file's kind and size checked on its descriptor (a FIFO is never
        # waited on), then where the events of this request will start.
        read_regular(path, limit=0, offset=EVENTS_LIMIT)
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
    except NotRegularFile:
        raise UsageError("events.jsonl is not a regular file: cannot wait", url=url) from None
    except FileTooLarge:
        raise UsageError(
            f"events.jsonl is larger than {EVENTS_LIMIT} bytes: cannot wait", url=url
        ) from None
    except OSError as exc:
        raise UsageError(f"events.jsonl cannot be read ({exc.strerror})", url=url) from None


def _new_snapshot(run_dir: Path, offset: int, url: str) -> int | None:
    from .._posix import FileTooLarge, NotRegularFile

    try:
        data = read_regular(run_dir / EVENTS_FILE, limit=EVENTS_READ_LIMIT, offset=offset)
    except FileNotFoundError:
        return None
    except (NotRegularFile, FileTooLarge, OSError):
        raise UsageError("events.jsonl changed under the wait: not read", url=url) from None
    for line in data.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "snapshot":
            step = event.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step
    return None


def request_snapshot(
    source: str | os.PathLike[str] | SnapshotTarget, *, wait: float = 0.0
) -> tuple[int, int | None]:
    """Ask a running trainer for a snapshot now, without stopping it: the one way a snapshot
    request is sent (``restorepoint snapshot RUN_DIR``, ``--pid``, the supervisor). ``source``
    is a run directory, whose ``trainer.json`` names the process that takes its requests (the
    trainer itself, or its supervisor), or a target already known.

    Nothing is sent unless every check passes (docs/preempt.md, "restorepoint snapshot"): the
    signal is a snapshot signal; the pid an integer, alive, the process that wrote the record
    (its start time), this user's (the uid in /proc, also for root), and catching the signal,
    as must every process behind it that will be passed the request. A refusal is NotFound
    (exit 4: nothing of ours to ask) or UsageError (exit 2).

    With ``wait`` (a run directory only), wait up to that many seconds for the snapshot event.
    Returns the pid signalled and the step of the snapshot (None without ``wait``)."""
    if isinstance(source, SnapshotTarget):
        if wait:
            raise UsageError("--wait needs the run directory, where snapshots are recorded")
        _send(source)
        return source.pid, None
    run_dir = Path(source)
    target = trainer_record(run_dir)
    url = str(source)
    before = _events_offset(run_dir, url) if wait > 0 else 0
    _send(target)
    if wait <= 0:
        return target.pid, None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        step = _new_snapshot(run_dir, before, url)
        if step is not None:
            return target.pid, step
        time.sleep(0.1)
    raise UsageError(f"no snapshot within {wait:g} s", url=url)
