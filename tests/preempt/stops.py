"""The stop matrix's shared helpers (docs/preempt.md, "The stop contract"): which cells run,
how each stop is delivered, and the supervisor run as a user runs it. A trainer kind's own
test file (test_stop_matrix.py here; a Lightning one elsewhere) imports these:

    from .stops import Supervised, cells, deliver, emulators, until, watch_args

    @pytest.mark.parametrize("stop", cells("lightning", default={"sigusr2"}))
    def test_lightning_stop(stop, tmp_path, ...):
        with emulators(stop) as metadata:
            run = Supervised(tmp_path, [*watch_args(stop, metadata), "--store", ..., "--", ...])
            ...  # wait until it is up and has a periodic restore point
            deliver(stop, run, metadata, run_dir)
            assert run.wait() == 42

By default only the cells named in ``default`` run (CI); ``RESTOREPOINT_FULL_MATRIX=1`` runs
every stop for every trainer kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clirun import cli

from .emulators import AwsEmulator, GcpEmulator

__all__ = [
    "FULL_MATRIX_ENV",
    "STOPS",
    "Supervised",
    "cells",
    "deliver",
    "emulators",
    "full_matrix",
    "until",
    "watch_args",
]

#: Every stop source the matrix delivers: a signal to ``restorepoint run`` (SIGTERM: a VM
#: shutting down, ``scancel``; SIGUSR2: the Slurm template's forwarded time-limit warning), a
#: stop notice from the metadata emulator, and a snapshot by hand followed by SIGTERM.
STOPS = ("sigterm", "sigusr2", "aws", "gcp", "manual+sigterm")
FULL_MATRIX_ENV = "RESTOREPOINT_FULL_MATRIX"
WAIT = 180.0


def full_matrix() -> bool:
    return os.environ.get(FULL_MATRIX_ENV, "") not in ("", "0")


def cells(kind: str, default: set[str], stops: tuple[str, ...] = STOPS) -> list[Any]:
    """The stops of one trainer kind as pytest params (ids ``kind-stop``): those in
    ``default`` always, the others only under the full matrix (skipped with the reason)."""
    out = []
    for stop in stops:
        marks = []
        if stop not in default and not full_matrix():
            marks.append(pytest.mark.skip(reason=f"full matrix only ({FULL_MATRIX_ENV}=1)"))
        out.append(pytest.param(stop, id=f"{kind}-{stop}", marks=marks))
    return out


def until(condition: Callable[[], object], timeout: float = WAIT, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.05)


@contextlib.contextmanager
def emulators(stop: str) -> Iterator[AwsEmulator | GcpEmulator | None]:
    """The metadata emulator a notice stop needs (None for the other stops)."""
    if stop == "aws":
        with AwsEmulator() as aws:
            yield aws
    elif stop == "gcp":
        with GcpEmulator() as gcp:
            yield gcp
    else:
        yield None


def watch_args(stop: str, metadata: AwsEmulator | GcpEmulator | None) -> list[str]:
    """``restorepoint run`` options for the stop: the watcher of a notice stop."""
    if metadata is None:
        return []
    return ["--watch", stop, "--metadata-url", metadata.url]


class Supervised:
    """``restorepoint run ARGS`` as a subprocess; its stderr in a file to read while it runs."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str], name: str = "run"):
        self.err_path = tmp / f"{name}.stderr"
        self.out_path = tmp / f"{name}.stdout"
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "restorepoint", "run", *args],
                stdout=out, stderr=err, env=env,
            )  # fmt: skip

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def deliver(
    stop: str, run: Supervised, metadata: AwsEmulator | GcpEmulator | None, run_dir: Path
) -> int | None:
    """Deliver ``stop`` to the supervised run; for ``manual+sigterm``, the step of the manual
    snapshot (``restorepoint snapshot RUN_DIR --wait``) taken before the SIGTERM."""
    manual = None
    if stop == "manual+sigterm":
        asked = cli("snapshot", str(run_dir), "--wait", "60", "--json")
        assert asked.returncode == 0, asked.stderr
        manual = int(json.loads(asked.stdout)["step"])
    if stop in ("sigterm", "manual+sigterm"):
        run.proc.send_signal(signal.SIGTERM)
    elif stop == "sigusr2":
        run.proc.send_signal(signal.SIGUSR2)
    elif stop == "aws":
        assert isinstance(metadata, AwsEmulator)
        metadata.arm_instance_action("terminate", seconds=90)
    elif stop == "gcp":
        assert isinstance(metadata, GcpEmulator)
        metadata.arm_preempted()
    else:
        raise AssertionError(f"unknown stop {stop!r}")
    return manual
