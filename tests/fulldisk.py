"""A full disk for the tests (docs/reliability.md, "Full disks").

For real where the test may mount: a tmpfs of a given size mounted by the test (root, or
CAP_SYS_ADMIN), unmounted at the end. Where mounting is not permitted (or with
``RESTOREPOINT_TEST_NO_MOUNT=1``, to exercise this path) the reason is printed and the test
falls back to a fault-injecting file wrapper: a plain directory of the given capacity, whose
writes (``os.write``, and files opened for writing with ``open``) fail with ENOSPC once the
files under it would exceed it, and whose ``os.statvfs`` (so ``shutil.disk_usage``) reports
the capacity left. It is installed in the test process, and in the CLI's through a
``sitecustomize`` on ``PYTHONPATH`` (``cli_env``).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["cli_env", "fill", "free_bytes", "inject", "small_disk"]

NO_MOUNT_ENV = "RESTOREPOINT_TEST_NO_MOUNT"
_INJECT_ENV = "RESTOREPOINT_TEST_FULL_DISK"
#: The injected disks of this process: root -> capacity in bytes.
_injected: dict[str, int] = {}
_kept: list[contextlib.AbstractContextManager[None]] = []


def _mount(path: Path, size: int) -> str | None:
    """Mount a tmpfs of ``size`` bytes at ``path``; the reason when that is not possible."""
    if os.environ.get(NO_MOUNT_ENV):
        return f"${NO_MOUNT_ENV} is set"
    mount = shutil.which("mount")
    if mount is None:
        return "no mount command"
    proc = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A file system of ``size`` bytes at ``path`` for the block: a tmpfs, or the injected
    fallback (the reason printed)."""
    path.mkdir(parents=True, exist_ok=True)
    reason = _mount(path, size)
    if reason is None:
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)
        return
    # Printed past pytest's capture: a run that did not use a real file system says so.
    print(
        f"\nno tmpfs for the full-disk test ({reason}): a fault-injecting file wrapper instead",
        file=sys.__stderr__,
    )
    with inject(str(path), size):
        yield path


def _used(root: str) -> int:
    total = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _disk_of(path: str) -> str | None:
    for root in _injected:
        if path == root or path.startswith(root + os.sep):
            return root
    return None


class _Raw(io.RawIOBase):
    """A file opened for writing on an injected disk: every write goes through ``os.write``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return os.write(self._fd, data)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


@contextlib.contextmanager
def inject(root: str, capacity: int) -> Iterator[None]:
    """Make ``root`` a disk of ``capacity`` bytes in this process for the block."""
    root = os.path.realpath(root)
    real_write, real_statvfs, real_open = os.write, os.statvfs, builtins.open

    def write(fd: int, data: Any) -> int:
        try:
            where = _disk_of(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            where = None
        if where is not None and len(data) > _injected[where] - _used(where):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def statvfs(path: Any) -> os.statvfs_result:
        st = real_statvfs(path)
        where = _disk_of(os.path.realpath(os.fsdecode(path)))
        if where is None:
            return st
        free = max(0, _injected[where] - _used(where)) // st.f_frsize
        fields = list(st)
        fields[2], fields[3], fields[4] = _injected[where] // st.f_frsize, free, free
        return os.statvfs_result(fields)

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if (
            isinstance(file, (str, os.PathLike))
            and any(c in mode for c in "wax+")
            and _disk_of(os.path.realpath(os.fsdecode(file))) is not None
        ):
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
            flags |= os.O_APPEND if "a" in mode else os.O_EXCL if "x" in mode else os.O_TRUNC
            raw = _Raw(os.open(file, flags, 0o666))
            return (
                io.BufferedWriter(raw) if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw))
            )
        return real_open(file, mode, *args, **kwargs)

    _injected[root] = capacity
    os.write, os.statvfs, builtins.open = write, statvfs, open_  # type: ignore[assignment]
    try:
        yield
    finally:
        os.write, os.statvfs, builtins.open = real_write, real_statvfs, real_open
        del _injected[root]


def cli_env(disk: Path) -> dict[str, str]:
    """What a CLI subprocess needs to see ``disk`` as the test does (nothing on a tmpfs)."""
    root = os.path.realpath(disk)
    if root not in _injected:
        return {}
    # Beside the disk, in the test's own temporary directory.
    site = Path(root).parent / "fulldisk-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fulldisk\n"
        "fulldisk.inject_from_env()\n"
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, _INJECT_ENV: f"{_injected[root]}:{root}"}


def inject_from_env() -> None:
    """In a CLI subprocess started with ``cli_env``: the test's injected disk, for good."""
    spec = os.environ.get(_INJECT_ENV)
    if spec:
        capacity, root = spec.split(":", 1)
        # Kept: a context manager that is collected runs its exit.
        _kept.append(inject(root, int(capacity)))
        _kept[-1].__enter__()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave: int = 0, name: str = "filler") -> Path:
    """Grow the file ``name`` on ``disk`` until at most ``leave`` bytes are free there."""
    filler = disk / name
    block = b"\0" * (64 << 10)
    with open(filler, "ab") as f:
        while (free := free_bytes(disk)) > leave:
            try:
                f.write(block[: min(len(block), free - leave)])
                f.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler
