"""What the benchmark scripts share (they run as scripts: this directory is on sys.path)."""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

#: The checkout these scripts are in.
ROOT = str(Path(__file__).resolve().parent.parent)


def use_checkout() -> None:
    """Measure this checkout: it goes first on ``sys.path`` and on ``PYTHONPATH`` (which every
    process a benchmark starts inherits, the CLI's included), not whichever restorepoint the
    interpreter has installed; and its modules are compiled first, as an install compiles them
    (``compile_tree``)."""
    if ROOT not in sys.path:
        sys.path.insert(1, ROOT)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *rest])
    compile_tree(ROOT)


def compile_tree(root: str | Path) -> None:
    """Byte-compile the restorepoint package under ``root`` into its ``__pycache__``, as pip
    does when it installs a wheel: a process that finds no cache compiles every module it
    imports (0.03 to 0.07 s of a CLI command's start-up here), and one run under
    ``PYTHONDONTWRITEBYTECODE`` never writes one."""
    compileall.compile_dir(str(Path(root) / "restorepoint"), quiet=1)


def measured() -> str:
    """Which restorepoint a benchmark measured: its version, and whether it is this
    checkout's."""
    import restorepoint

    where = Path(restorepoint.__file__).resolve().parent.parent
    return f"{restorepoint.__version__} ({'this checkout' if str(where) == ROOT else 'installed'})"


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
