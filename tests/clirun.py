"""Run the CLI as a user does (a real subprocess) and check its one-line failures."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``restorepoint ARGS``; ``env`` replaces the environment, ``extra_env`` adds to it; a
    run longer than ``timeout`` seconds fails the test (subprocess.TimeoutExpired)."""
    return subprocess.run(
        [sys.executable, "-m", "restorepoint", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(env if env is not None else os.environ), **(extra_env or {})},
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failure (and never a traceback)."""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]
