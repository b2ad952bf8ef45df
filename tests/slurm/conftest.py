"""A real single-node Slurm for the contract tests (cluster.sh beside this file).

The cluster is one per machine (slurmd runs the jobs of the whole node): pytest-xdist workers
share it. The first worker that needs it starts it, the last one stops it (a count under a
file lock in the directory the workers share), and each test holds a second lock for as long
as it runs, so that one test's whole-node job never preempts another test's job.

When Slurm cannot start here (not root, no apt-get and no Slurm, no network for the install)
the tests are skipped with cluster.sh's reason; RESTOREPOINT_REQUIRE_SLURM=1 makes that a
failure instead, for a CI machine that is meant to run them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"
#: A first start may install the packages (seconds from a mirror, minutes from a slow one).
START_TIMEOUT_S = 600
#: Jobs that are over: Slurm changes them no more (MinJobAge keeps them visible for 300 s).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"}
)


@dataclass
class Cluster:
    """The running cluster: its directory and the environment its clients need."""

    directory: Path

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    def env(self) -> dict[str, str]:
        """The environment for sbatch and scontrol, and so (sbatch exports it) for the job.
        Variables that would change which signal the trainer takes as its stop request, or
        point it at another store or run, are left out."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_", "RESTOREPOINT_"))
        }
        env["SLURM_CONF"] = str(self.conf)
        return env

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False
        )

    def sbatch(self, *args: str) -> str:
        """Submit; returns the job id."""
        proc = self.command("sbatch", "--parsable", *args)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol show job, as a dict (JobState, Restarts, ExitCode, ...); {} when unknown."""
        proc = self.command("scontrol", "-o", "show", "job", job_id)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def describe(self, *job_ids: str) -> str:
        """What Slurm says about the jobs and the node, and the daemons' last log lines: what
        a failed test prints."""
        parts = []
        for job_id in job_ids:
            parts.append(self.command("scontrol", "show", "job", job_id).stdout)
        parts.append(self.command("scontrol", "show", "node").stdout)
        for log in sorted((self.directory / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-25:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def cancel_all(self) -> None:
        """Nothing of a test outlives it: cancel every job and wait until none runs."""
        self.command("scancel", "--full", "--quiet", f"--user={os.getuid()}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proc = self.command("squeue", "-h", "-t", "running,completing,pending", "-o", "%i")
            if proc.returncode == 0 and not proc.stdout.strip():
                return
            time.sleep(0.5)


def wait_for(
    predicate: Callable[[], object], timeout: float, what: str, explain: Callable[[], str]
) -> None:
    """Poll until ``predicate`` holds. Slurm is late by design (its scheduler looks every
    sched_interval seconds, a requeued job waits out its credential), so the bounds are
    generous; ``explain`` says what was seen when one is passed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{explain()}")
        time.sleep(0.2)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # Each xdist worker has its own basetemp inside the session's; the session's is shared.
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _give_up(reason: str, detail: str = "") -> NoReturn:
    if os.environ.get("RESTOREPOINT_REQUIRE_SLURM") == "1":
        pytest.fail(f"{reason}\n{detail}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shared = _shared_dir(tmp_path_factory)
    cluster = Cluster(shared / "slurm")
    users = shared / "slurm.users"
    failed = shared / "slurm.failed"
    with _locked(shared / "slurm.lock"):
        if failed.exists():
            # Another worker tried: the same machine gives the same answer.
            _give_up(failed.read_text())
        count = int(users.read_text() or 0) if users.exists() else 0
        if count == 0:
            started = time.monotonic()
            proc = subprocess.run(
                ["bash", str(CLUSTER_SH), "start", str(cluster.directory)],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
            if proc.returncode != 0:
                reason = "Slurm cannot start here: " + (
                    " | ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit {proc.returncode}"
                )
                failed.write_text(reason)
                _give_up(reason, proc.stderr)
            print(f"\nslurm: cluster started in {time.monotonic() - started:.1f} s")
        users.write_text(str(count + 1))
    try:
        yield cluster
    finally:
        with _locked(shared / "slurm.lock"):
            count = int(users.read_text() or 0) - 1
            users.write_text(str(count))
            if count == 0:
                subprocess.run(
                    ["bash", str(CLUSTER_SH), "stop", str(cluster.directory)],
                    capture_output=True,
                    timeout=120,
                    check=False,
                )


@pytest.fixture
def slurm(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, to this test alone while it runs; its jobs are cancelled at the end."""
    with _locked(_shared_dir(tmp_path_factory) / "slurm-test.lock"):
        try:
            yield slurm_cluster
        finally:
            slurm_cluster.cancel_all()
