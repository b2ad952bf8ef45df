"""Run the CLI as a user does (a real subprocess) and check its one-line failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Measured:
    """A CLI run and what it cost: the child's own peak resident set and CPU time."""

    proc: subprocess.CompletedProcess[str]
    max_rss: int  # bytes
    cpu: float  # user + system seconds


# The CLI is started by a small launcher that reports the CLI's rusage from wait4(2). Started
# from the test process itself, the CLI's ru_maxrss would include the test process's size at
# the fork (Linux keeps the high-water mark across exec), which says nothing about the CLI.
_LAUNCHER = """
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
with open(sys.argv[1], "w") as report:
    json.dump({"rss": usage.ru_maxrss * scale, "cpu": usage.ru_utime + usage.ru_stime}, report)
sys.exit(child.returncode if child.returncode >= 0 else 128 - child.returncode)
"""


def cli_measured(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Measured:
    """``restorepoint ARGS`` as ``cli`` runs it, measured."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "usage.json")
        launcher = [sys.executable, "-c", _LAUNCHER, report]
        proc = subprocess.run(
            [*launcher, sys.executable, "-m", "restorepoint", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env if env is not None else os.environ,
            check=False,
        )
        with open(report) as f:
            usage = json.load(f)
    proc.args = proc.args[len(launcher) :]
    return Measured(proc, int(usage["rss"]), float(usage["cpu"]))
