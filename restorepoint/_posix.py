"""POSIX helpers, once: the fsync of a directory, the atomic write of a small file, whether a
process is alive, and when it started. Every module that needs one of these calls it here."""

from __future__ import annotations

import contextlib
import enum
import os
import threading
from pathlib import Path

__all__ = [
    "Disposition",
    "atomic_write",
    "fsync_dir",
    "pid_alive",
    "signal_disposition",
    "started_after",
]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable (a rename or a create in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a small file so that a reader (or a crash) sees the old or the new one whole: a
    temporary file beside it (named after the process and the thread, so two writers never
    share one), fsync, rename, fsync of the directory."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        # No litter: a temporary file left in checkpoints/ would be packed with the state.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts: EPERM). A
    number no process can have (negative, zero, beyond what kill accepts) is not alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def started_after(pid: int, moment: float, slack: float = 60.0) -> bool:
    """Whether process ``pid`` started well after ``moment`` (seconds since the epoch); False
    where /proc cannot tell. The slack: the boot time is in whole seconds, and a file's mtime
    on a network file system comes from the server's clock; a pid comes round again far later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        # Fields after the command name (which may hold spaces and parentheses): the start
        # time, in clock ticks since boot, is field 22 of the line, 20th after the name.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return started > moment + slack


class Disposition(enum.Enum):
    """What a process does with a signal, as /proc/PID/status says."""

    GONE = "gone"
    DEFAULT = "default"
    IGNORED = "ignored"
    CAUGHT = "caught"
    #: no /proc to tell
    UNKNOWN = "unknown"


def signal_disposition(pid: int, signum: int) -> Disposition:
    """What process ``pid`` does with ``signum``: a signal it does not catch kills it (SIGUSR1
    and SIGUSR2 by default), so a snapshot request is sent only to a process that catches it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return Disposition.GONE if Path("/proc/self/status").exists() else Disposition.UNKNOWN
    except OSError:
        return Disposition.UNKNOWN
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith(("Z", "X")):
        return Disposition.GONE
    bit = 1 << (signum - 1)
    try:
        caught = int(fields["SigCgt"].strip(), 16)
        ignored = int(fields["SigIgn"].strip(), 16)
    except (KeyError, ValueError):
        return Disposition.UNKNOWN
    if caught & bit:
        return Disposition.CAUGHT
    return Disposition.IGNORED if ignored & bit else Disposition.DEFAULT
