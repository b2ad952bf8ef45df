"""POSIX helpers, once: the fsync of a directory, the atomic write of a small file, whether a
process is alive, and when it started. Every module that needs one of these calls it here."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir", "pid_alive", "started_after"]


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
