"""The Slurm template around a transformers.Trainer job (tests/adapters/hf_job.py), on a real
single-node Slurm (conftest.py): the time-limit warning (USR1 to the batch shell, forwarded to
the step as USR2) makes the job's RestorePointCallback save checkpoint-N at the next step's
end, publish it and exit 42; the template requeues the job, which resumes from the store (its
output directory is another one: node-local scratch) and ends COMPLETED with Restarts=1.

As in test_slurm.py, the warning is sent with ``scancel --signal=USR1 --batch``."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from restorepoint import list_store, verify

from .conftest import Cluster, wait_for
from .test_slurm import REPORT_ENV, submit

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "adapters" / "hf_job.py"
TOTAL_STEPS = 12  # hf_job.py's default max_steps


def trainer_command(tmp_path: Path) -> list[str]:
    root = shlex.quote(str(tmp_path / "runs"))
    script = f'{REPORT_ENV}; exec "$@" {root}/attempt-"${{SLURM_RESTART_COUNT:-0}}"'
    job = [sys.executable, str(JOB), "--store", f"{tmp_path / 'store'}/", "--delay", "0.3"]
    return ["sh", "-c", script, "sh", *job]


def test_the_warning_stops_requeues_and_resumes_a_trainer_job(
    slurm: Cluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    job = submit(slurm, tmp_path, trainer_command(tmp_path))
    wait_for(job.seen(0, lambda a: len(a.steps) >= 4), 180, "the first run's step 4", job.explain)
    proc = slurm.command("scancel", "--signal=USR1", "--batch", job.job)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_end(240)
    print(f"\nslurm: transformers job {info['JobState']} after {time.monotonic() - t0:.1f} s")

    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        job.explain()
    )
    first, second = job.runs()
    assert [first.exit_code, second.exit_code] == [42, 0], job.explain()
    assert first.requeued_itself, job.explain()
    stop = [line for line in first.lines if line.startswith("restorepoint: stop (SIGUSR2)")]
    assert len(stop) == 1, job.explain()
    stopped = int(stop[0].split(" at step ")[1].split(":")[0])
    assert f"checkpoint-{stopped} published to" in stop[0], job.explain()
    assert stopped - first.steps[-1] in (0, 1), job.explain()
    # Resumed from the store right after the stop's step, trained to the end, published.
    assert second.steps == list(range(stopped + 1, TOTAL_STEPS + 1)), job.explain()
    steps = sorted(e.step for e in list_store(f"{tmp_path / 'store'}/"))
    assert stopped in steps, steps
    assert steps[-1] == TOTAL_STEPS, steps
    verify(list_store(f"{tmp_path / 'store'}/")[0].url)
