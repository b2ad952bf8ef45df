"""The Slurm template around an external trainer on a real single-node Slurm (docs/preempt.md,
"The stop contract"): ``restorepoint run --adapter lichtfeld ... --auto-resume`` with the fake
LichtFeld Studio. The time-limit warning (USR1 to the batch shell, forwarded to the step as
USR2) makes the supervisor snapshot, publish, stop the trainer and exit 42; the template
requeues; the second run resumes from the store to the end, bit for bit; the job ends COMPLETED
with Restarts=1."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from restorepoint import list_store

from .conftest import Cluster, wait_for
from .test_slurm import LEAD, Submitted, render

pytestmark = pytest.mark.slow

FAKE = [sys.executable, "-m", "restorepoint.testing.fake_lichtfeld"]
ITERATIONS = 4000
JOB = "scene: garden\ntrain:\n  checkpoint_every: 500\n"


def make_data(root: Path) -> Path:
    data = root / "data"
    (data / "images").mkdir(parents=True)
    for i in range(3):
        (data / "images" / f"DSC{i:04d}.JPG").write_bytes(bytes([i]) * 64)
    (data / "sparse.txt").write_text("cameras\n")
    return data


def test_the_time_limit_warning_requeues_an_external_trainer_and_it_resumes(
    slurm: Cluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    data, store = make_data(tmp_path), f"{tmp_path / 'store'}/"
    (tmp_path / "job.yaml").write_text(JOB)
    # Each run of the job gets an output directory of its own: it can only come back from
    # the store.
    out = f"{shlex.quote(str(tmp_path))}/out-${{SLURM_RESTART_COUNT:-0}}"
    supervisor = [
        sys.executable, "-m", "restorepoint", "run", "--store", store, "--adapter", "lichtfeld",
        "--adapter-option", f"binary={shlex.join(FAKE)}", "--config", str(tmp_path / "job.yaml"),
        "--cache-root", "/cache", "--run", "splat", "--auto-resume",
    ]  # fmt: skip
    trainer = [*FAKE, "--headless", "-d", str(data), "-i", str(ITERATIONS)]
    script = (
        f'o={out}; exec {shlex.join(supervisor)} --workdir "$o" -- '
        f'{shlex.join(trainer)} -o "$o" --step-delay "${{DELAY}}"'
    )
    # The first run trains slowly (the warning must find it training), the resume at once.
    command = ["sh", "-c", f'DELAY=0.01; [ -n "$SLURM_RESTART_COUNT" ] && DELAY=0; {script}']
    output = tmp_path / "job.out"
    (tmp_path / "job.sh").write_text(
        render(
            command,
            *("--sbatch", "partition=low", "--sbatch", f"output={output}"),
            *("--lead", str(LEAD), "--max-resubmits", "3"),
        )
    )
    job = Submitted(
        slurm, slurm.sbatch(f"--chdir={tmp_path}", str(tmp_path / "job.sh")), output, []
    )
    first = tmp_path / "out-0"

    def uploaded() -> bool:
        path = first / "events.jsonl"
        return path.exists() and '"uploaded"' in path.read_text()

    wait_for(uploaded, 120, "the first periodic upload", job.explain)
    print(f"\nslurm: {time.monotonic() - t0:5.1f} s  first upload: scancel --signal=USR1 --batch")
    proc = slurm.command("scancel", "--signal=USR1", "--batch", job.job)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_end(240)
    print(f"slurm: {time.monotonic() - t0:5.1f} s  job {info['JobState']}")
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        job.explain()
    )
    runs = job.runs()
    assert [a.exit_code for a in runs] == [42, 0], job.explain()
    assert runs[0].requeued_itself, job.explain()
    text = output.read_text(errors="replace")
    assert "stop (SIGUSR2)" in text and "exit 42" in text, job.explain()
    # The stop's snapshot was published last, newer than every periodic one, and the second
    # run resumed from it.
    lines = (first / "events.jsonl").read_text().splitlines()
    uploads = [json.loads(x)["step"] for x in lines if '"uploaded"' in x]
    assert len(uploads) >= 2 and uploads[-1] > max(uploads[:-1]), uploads
    assert "Checkpoint loaded" in text and f"iter {uploads[-1]})" in text, job.explain()
    reference = tmp_path / "reference"
    subprocess.run(
        [*FAKE, "--headless", "-d", str(data), "-o", str(reference), "-i", str(ITERATIONS)],
        check=True, timeout=120, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    # The resumed run's own snapshots go on; the one it resumed from was marked while it ran
    # (spec 19.9), so its prunes kept it beside the newest.
    newest, resumed_from = list_store(store, run="splat")
    assert newest.step > uploads[-1] == resumed_from.step
    final = f"splat_{ITERATIONS}.ply"
    assert (tmp_path / "out-1" / final).read_bytes() == (reference / final).read_bytes()
