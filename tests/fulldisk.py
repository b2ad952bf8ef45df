"""A full disk for the tests, for real: a tmpfs of a given size mounted by the test (which needs
root, or CAP_SYS_ADMIN), unmounted at the end. Where mounting is not permitted the test is
skipped, saying why (docs/reliability.md, "Full disks")."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["fill", "free_bytes", "small_disk"]


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A file system of ``size`` bytes mounted at ``path`` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no full-disk test here: no mount command to make a small tmpfs")
    proc = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        reason = proc.stderr.strip() or f"exit {proc.returncode}"
        pytest.skip(f"no full-disk test here: mounting a small tmpfs is not permitted ({reason})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


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
