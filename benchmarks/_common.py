"""What the benchmark scripts share (they run as scripts: this directory is on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path


def fs_type(path: Path) -> str:
    """The file system type of the mount that holds ``path`` (ext4, tmpfs, ...)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return kind
    for point, fs in mounts:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    return kind
