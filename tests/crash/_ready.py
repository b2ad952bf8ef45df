"""Start a crash-test child (_packer.py, _importer.py, _store_worker.py) and wait for it to say
``ready``: the moment from which a kill is a kill of the real work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def trials(default: int) -> int:
    """Kills a scenario runs: ``default`` (enough stratified kill points for CI to cover the
    whole operation, both ways, every run), or ``$RESTOREPOINT_CRASH_TRIALS`` for a longer
    hunt."""
    return int(os.environ.get("RESTOREPOINT_CRASH_TRIALS", default))


def spawn_ready(
    script: Path, args: list[str], what: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the {what} did not start: {line!r} {err[-2000:]}")
    return proc
