"""The Slurm template around a Lightning job without submitit, on a real single-node Slurm
(conftest.py): the time-limit warning (USR1 to the batch shell, forwarded to the step as USR2)
makes the job's PreemptionCallback save, publish and exit 42; the template requeues the job,
which resumes from the store and ends COMPLETED with Restarts=1.

As in test_slurm.py, the warning is sent with ``scancel --signal=USR1 --batch`` (the one the
time limit sends comes up to ~45 s early and is not observed here)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from restorepoint import list_store, verify

from .conftest import Cluster, wait_for
from .test_slurm import REPORT_ENV, submit

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "adapters" / "lightning_job.py"
TOTAL_STEPS = 3 * 8  # lightning_job.py: 3 epochs of 8 steps


def lightning_command(tmp_path: Path) -> list[str]:
    """The job, with a checkpoint directory of its own per run of the job (node-local scratch,
    where a requeued job may land on another node): a run can only come back from the store."""
    root = shlex.quote(str(tmp_path / "runs"))
    script = f'{REPORT_ENV}; exec "$@" --ckpt {root}/attempt-"${{SLURM_RESTART_COUNT:-0}}"'
    job = [sys.executable, str(JOB), "--store", f"{tmp_path / 'store'}/", "--step-delay", "0.3"]
    return ["sh", "-c", script, "sh", *job]


def test_the_warning_stops_requeues_and_resumes_a_lightning_job(
    slurm: Cluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    job = submit(slurm, tmp_path, lightning_command(tmp_path))
    wait_for(job.seen(0, lambda a: len(a.steps) >= 4), 180, "the first run's step 4", job.explain)
    proc = slurm.command("scancel", "--signal=USR1", "--batch", job.job)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_end(240)
    print(f"\nslurm: lightning job {info['JobState']} after {time.monotonic() - t0:.1f} s")

    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        job.explain()
    )
    first, second = job.runs()
    assert [first.exit_code, second.exit_code] == [42, 0], job.explain()
    assert first.requeued_itself, job.explain()
    stop = [line for line in first.lines if line.startswith("restorepoint: stop (SIGUSR2)")]
    assert len(stop) == 1, job.explain()
    (entry,) = list_store(f"{tmp_path / 'store'}/")
    verify(entry.url)
    # Stopped at a step's end, resumed from the store right after it, trained to the end.
    assert f"at step {entry.step}: last.ckpt saved, published and verified" in stop[0]
    assert entry.step - first.steps[-1] in (0, 1), job.explain()
    assert second.steps == list(range(entry.step + 1, TOTAL_STEPS + 1)), job.explain()
