"""The stop contract for a Lightning job (docs/preempt.md, docs/adapters.md "Lightning"): a real
Trainer in a process of its own (lightning_job.py), real signals, a store on the local disk.

Without submitit, a stop (SIGUSR2, SIGTERM, SIGTERM after a manual snapshot) ends with
``last.ckpt`` saved, the stop's snapshot the store's newest, and exit 42; a rerun resumes to
the end. With an earlier handler (a stand-in for submitit's) the chain is kept. A
``last.ckpt`` of another config is exit 3, one line. ``restorepoint run --adapter lightning``
passes the 42 on. Lightning starts slowly: one job is signalled several times in turn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

pytest.importorskip("lightning")

import torch

from restorepoint import list_store, verify

JOB = Path(__file__).with_name("lightning_job.py")
TOTAL = 3 * 8  # lightning_job.py: 3 epochs of 8 steps
STOPPED = "restorepoint: stop ({}) at step {}: last.ckpt saved, published and verified"

pytestmark = pytest.mark.slow


class Job:
    """lightning_job.py (or a command around it) as a process; its stdout lines, read as they
    come."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._err: list[str] = []
        # Both pipes read by threads of their own (communicate would race the stdout reader).
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: IO[str] | None, into: list[str]) -> None:
        assert pipe is not None
        for line in pipe:
            into.append(line.rstrip("\n"))

    @property
    def steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines if line.startswith("step ")]

    def wait_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.steps or self.steps[-1] < step:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no step {step}: {self.finish()}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:
            reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return self.proc.returncode, "\n".join(self._err)


def job(ckpt: Path, *options: str) -> list[str]:
    return [sys.executable, str(JOB), "--ckpt", str(ckpt), *options]


def ckpt_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def newest(store: str) -> tuple[int, str]:
    entries = list_store(store)
    entry = max(entries, key=lambda e: e.step)
    return entry.step, entry.url


def test_without_submitit_every_stop_saves_publishes_and_exits_42(tmp_path: Path) -> None:
    ckpt, store = tmp_path / "ckpt", f"{tmp_path / 'store'}/"

    # 1. SIGUSR2 (what the Slurm template forwards): saved at the next step's end, exit 42.
    first = Job(job(ckpt, "--store", store))
    first.wait_step(3)
    first.proc.send_signal(signal.SIGUSR2)
    code, err = first.finish()
    assert code == 42, err
    stopped_at = ckpt_step(ckpt / "last.ckpt")
    # Acted on at the next step's end (the callback's hook comes before the step's print),
    # or at the epoch's end.
    assert stopped_at - first.steps[-1] in (0, 1)
    assert stopped_at < TOTAL
    assert STOPPED.format("SIGUSR2", stopped_at) in err
    step, url = newest(store)
    assert step == stopped_at
    verify(url)

    # 2. The same directory under another config: refused, one line, exit 3, not resumed.
    code, err = Job(job(ckpt, "--store", store, "--lr", "0.1")).finish()
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("restorepoint: error: "), err
    assert lines[0].endswith("last.ckpt: refused: 1 expectation not met (config.lr)"), err
    assert ckpt_step(ckpt / "last.ckpt") == stopped_at

    # 3. Resumed; a manual snapshot (SIGUSR1: training goes on), then SIGTERM: the stop's
    # snapshot is the store's newest, newer than the manual one.
    second = Job(job(ckpt, "--store", store))
    second.wait_step(stopped_at + 2)
    assert second.steps[0] == stopped_at + 1  # resumed where the stop left it
    second.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 60
    while newest(store)[0] == stopped_at and time.monotonic() < deadline:
        time.sleep(0.1)
    snapshot_at = newest(store)[0]
    assert snapshot_at > stopped_at
    second.wait_step(snapshot_at + 2)
    second.proc.send_signal(signal.SIGTERM)
    code, err = second.finish()
    assert code == 42, err
    stopped_again = ckpt_step(ckpt / "last.ckpt")
    assert STOPPED.format("SIGTERM", stopped_again) in err
    assert stopped_again > snapshot_at
    assert newest(store)[0] == stopped_again

    # 4. A rerun on another machine (a fresh directory): from the store, to the end.
    code, err = (third := Job(job(tmp_path / "elsewhere", "--store", store))).finish()
    assert code == 0, err
    assert third.steps[0] == stopped_again + 1
    assert third.lines[-1] == f"done {TOTAL}"


def test_an_earlier_handler_is_chained_and_ends_the_job(tmp_path: Path) -> None:
    """submitit's requeue, stood in for: saved first, then the earlier handler, which exits
    its own way (17): no exit 42 of ours."""
    ckpt, record = tmp_path / "ckpt", tmp_path / "standin.log"
    proc = Job(job(ckpt, "--standin", str(record)))
    proc.wait_step(2)
    proc.proc.send_signal(signal.SIGUSR2)
    code, err = proc.finish()
    assert code == 17, err
    saved = ckpt_step(ckpt / "last.ckpt")
    assert record.read_text().splitlines() == [f"called SIGUSR2 last.ckpt step {saved}"]
    assert "restorepoint: stop" not in err


def test_restorepoint_run_adapter_lightning_passes_the_stop_on(tmp_path: Path) -> None:
    """The supervisor hands its store to the job ($RESTOREPOINT_STORE) and forwards SIGTERM;
    the job publishes and exits 42, and so does the supervisor."""
    ckpt, store = tmp_path / "ckpt", f"{tmp_path / 'store'}/"
    command = [
        sys.executable, "-m", "restorepoint", "run", "--store", store, "--adapter", "lightning",
        "--", *job(ckpt),
    ]  # fmt: skip
    run = Job(command)
    run.wait_step(3)
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 42, err
    stopped_at = ckpt_step(ckpt / "last.ckpt")
    assert STOPPED.format("SIGTERM", stopped_at) in err
    step, url = newest(store)
    assert step == stopped_at

    # --resume-from: the supervisor imports, the job gates the import with the head handed
    # over and resumes from it (its command as given), in a directory of its own.
    command = [*command[: command.index("--")], "--resume-from", url, "--", *job(tmp_path / "b")]
    code, err = (resumed := Job(command)).finish()
    assert code == 0, err
    assert resumed.steps[0] == stopped_at + 1
    assert resumed.lines[-1] == f"done {TOTAL}"
