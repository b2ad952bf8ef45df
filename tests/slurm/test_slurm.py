"""The Slurm contract (docs/slurm.md) on a real single-node Slurm (conftest.py, cluster.sh).

The sbatch script is the one ``restorepoint slurm-template`` prints; the trainer is the real
PyTorch one (restorepoint.testing.trainer). One job lives through the two ways a run ends
early and comes back: the time-limit warning (USR1 to the batch shell, forwarded to the step as
USR2) and a preemption by a whole-node job of a higher partition. It must come back each time
from its restore point, replay no batch, and end with the weights of an uninterrupted run.

Not observed here (docs/slurm.md says why): the warning sent by the time limit itself, which
comes up to ~45 s early at a minute's granularity and then ends the run TIMEOUT; that is why
the test sends the same signal to the same process with ``scancel --signal=USR1 --batch``."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from clirun import cli

from restorepoint import list_store, verify

from .conftest import FINAL_STATES, Cluster, wait_for

pytestmark = pytest.mark.slow

#: Seconds per step: a run is long enough for the scheduler to preempt it before it ends.
STEP_DELAY = 0.4
#: restorepoint.testing.trainer's CONFIG: 3 epochs of 1024 samples / 16 per batch / 2 per step.
TOTAL_STEPS = 96
LEAD = 30
TRAINER = [sys.executable, "-m", "restorepoint.testing.trainer"]
REPORT_ENV = 'echo "trainer: SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset}" >&2'

START = re.compile(r"^restorepoint: job \d+ start, restart count (\d+)$")
STEP = re.compile(r"^step (\d+)$")
TRAINER_ENV = re.compile(r"^trainer: SLURM_RESTART_COUNT=(\S+)$")
EXITED = re.compile(r"^restorepoint: step exited (\d+)$")


@dataclass
class Attempt:
    """One run of the job, cut out of its (appended) output file."""

    restart_count: int
    lines: list[str]

    def _all(self, pattern: re.Pattern[str]) -> list[str]:
        return [m.group(1) for line in self.lines if (m := pattern.match(line))]

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self._all(STEP)]

    @property
    def trainer_env(self) -> list[str]:
        return self._all(TRAINER_ENV)

    @property
    def exit_code(self) -> int | None:
        codes = self._all(EXITED)
        return int(codes[-1]) if codes else None

    @property
    def requeued_itself(self) -> bool:
        return any(line.startswith("restorepoint: resumable exit: requeue") for line in self.lines)


def attempts(output: Path) -> list[Attempt]:
    found: list[Attempt] = []
    text = output.read_text(errors="replace") if output.exists() else ""
    for line in text.splitlines():
        if m := START.match(line):
            found.append(Attempt(int(m.group(1)), []))
        elif found:
            found[-1].lines.append(line)
    return found


def render(command: list[str], *options: str) -> str:
    proc = cli("slurm-template", *options, "--", *command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def events(run_root: Path) -> list[dict[str, Any]]:
    """The trainer's events.jsonl under one --root (one run directory)."""
    files = sorted(run_root.glob("*/events.jsonl"))
    assert len(files) == 1, f"expected one run directory under {run_root}: {files}"
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def one(evs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in evs if e["event"] == kind]
    assert len(found) == 1, f"expected one {kind} event: {evs}"
    return found[0]


@dataclass
class Submitted:
    """A templated job and what a failed assertion prints about it."""

    slurm: Cluster
    job: str
    output: Path
    others: list[str]

    def explain(self) -> str:
        out = self.output
        text = out.read_text(errors="replace") if out.exists() else "(no output yet)"
        return f"--- job output\n{text}\n" + self.slurm.describe(self.job, *self.others)

    def runs(self) -> list[Attempt]:
        return attempts(self.output)

    def seen(self, index: int, predicate: Callable[[Attempt], bool]) -> Callable[[], bool]:
        """A wait_for condition on run ``index`` of the job."""

        def check() -> bool:
            runs = self.runs()
            return len(runs) > index and predicate(runs[index])

        return check

    def wait_end(self, timeout: float) -> dict[str, str]:
        wait_for(
            lambda: self.slurm.job(self.job).get("JobState") in FINAL_STATES,
            timeout,
            "the job's end",
            self.explain,
        )
        return self.slurm.job(self.job)


def trainer_command(tmp_path: Path, *options: str) -> list[str]:
    """The real trainer, telling what SLURM_RESTART_COUNT the step sees. Every run of the job
    gets a fresh run directory (--root tmp_path/runs/attempt-N), as on node-local scratch where
    a requeued job may land on another node: a run can only come back from the store."""
    root = shlex.quote(str(tmp_path / "runs"))
    script = f'{REPORT_ENV}; exec "$@" --root {root}/attempt-"${{SLURM_RESTART_COUNT:-0}}"'
    store = f"{tmp_path / 'store'}/"
    trainer = [*TRAINER, "--out", str(tmp_path / "final.pt"), "--store", store]
    return ["sh", "-c", script, "sh", *trainer, "--step-delay", str(STEP_DELAY), *options]


def submit(
    slurm: Cluster, tmp_path: Path, command: list[str], *sbatch: str, max_resubmits: int = 3
) -> Submitted:
    """Render the template for ``command`` (partition low, output tmp_path/job.out) and submit
    it; ``sbatch`` options go on sbatch's command line, where they override the script's."""
    output = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(
        render(
            command,
            *("--sbatch", "partition=low", "--sbatch", f"output={output}"),
            *("--lead", str(LEAD), "--max-resubmits", str(max_resubmits)),
        )
    )
    job = slurm.sbatch(f"--chdir={tmp_path}", *sbatch, str(script))
    return Submitted(slurm, job, output, [])


def preempt(submitted: Submitted, tmp_path: Path) -> None:
    """A job of the high partition that needs the whole node."""
    high = submitted.slurm.sbatch(
        "--partition=high", "--exclusive", f"--output={tmp_path}/high.out", "--wrap", "sleep 3"
    )
    submitted.others.append(high)


def assert_same_state(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert torch.equal(got, want), f"{where} differs"
    elif isinstance(want, dict):
        assert isinstance(got, dict), where
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same_state(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_state(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_template_is_valid_bash_with_every_contract_line(tmp_path: Path) -> None:
    command = [*TRAINER, "--root", str(tmp_path / "runs dir"), "--out", "it's.pt"]
    text = render(
        command,
        *("--sbatch", "partition=low", "--sbatch", f"output={tmp_path}/job.out"),
        *("--lead", "45", "--max-resubmits", "3", "--job-name", "rp-test"),
    )
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr

    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    # sbatch reads #SBATCH lines only up to the first command.
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    sbatch = [line for line in lines[:first_command] if line.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=rp-test",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@45",
        "#SBATCH --open-mode=append",
        "#SBATCH --partition=low",
        f"#SBATCH --output={tmp_path}/job.out",
    ]
    assert not any(line.startswith("#SBATCH") for line in lines[first_command:])
    body = lines[first_command:]
    for contract_line in [
        "max_resubmits=3",
        'restarts="${SLURM_RESTART_COUNT:-0}"',
        "trap '' TERM",
        '        kill -s USR2 "$child" 2>/dev/null || true',
        "trap forward USR1",
        f"srun --kill-on-bad-exit=1 {shlex.join(command)} &",
        'if [ "$code" -eq 42 ]; then',
        '    if [ "$restarts" -lt "$max_resubmits" ]; then',
        '        if scontrol requeue "$SLURM_JOB_ID"; then',
        'exit "$code"',
    ]:
        assert contract_line in body, contract_line
    # TERM is ignored before USR1 is trapped, both before the step starts.
    assert (
        body.index("trap '' TERM")
        < body.index("trap forward USR1")
        < body.index(f"srun --kill-on-bad-exit=1 {shlex.join(command)} &")
    )


def test_requeue_is_bounded_by_max_resubmits(slurm: Cluster, tmp_path: Path) -> None:
    started = time.monotonic()
    # A trainer that always asks to be resumed.
    job = submit(slurm, tmp_path, ["sh", "-c", f"{REPORT_ENV}; exit 42"], max_resubmits=1)
    info = job.wait_end(120)
    print(f"\nslurm: requeue bound: {info['JobState']} after {time.monotonic() - started:.1f} s")
    runs = job.runs()
    assert [a.restart_count for a in runs] == [0, 1], job.explain()
    assert [a.trainer_env for a in runs] == [["unset"], ["1"]], job.explain()
    assert [a.exit_code for a in runs] == [42, 42], job.explain()
    assert runs[0].requeued_itself
    assert not runs[1].requeued_itself
    assert "restorepoint: resumable exit, but the resubmit limit (1) is reached" in runs[1].lines
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("FAILED", "1", "42:0")


def test_scancel_cancels(slurm: Cluster, tmp_path: Path) -> None:
    """scancel TERMs the step as well as the batch shell; the trainer answers TERM as it
    answers a stop request (publish, exit 42), but a cancelled job must stay cancelled."""
    started = time.monotonic()
    job = submit(slurm, tmp_path, trainer_command(tmp_path))
    wait_for(job.seen(0, lambda a: len(a.steps) >= 3), 120, "step 3", job.explain)
    proc = slurm.command("scancel", job.job)
    assert proc.returncode == 0, proc.stderr
    wait_for(job.seen(0, lambda a: a.exit_code is not None), 60, "the step's exit", job.explain)
    info = job.wait_end(60)
    print(f"\nslurm: scancel: {info['JobState']} after {time.monotonic() - started:.1f} s")
    runs = job.runs()
    assert len(runs) == 1, job.explain()
    assert runs[0].exit_code == 42, job.explain()
    assert not runs[0].requeued_itself, job.explain()
    assert any(re.match(r"restorepoint: .* the job is \w+: no requeue$", x) for x in runs[0].lines)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), job.explain()
    stop = one(events(tmp_path / "runs" / "attempt-0"), "graceful_shutdown")
    assert stop["signal"] == "SIGTERM"


def test_a_requeue_from_outside_is_left_to_slurm(slurm: Cluster, tmp_path: Path) -> None:
    """``scontrol requeue`` (like the end of a preemption's GraceTime) TERMs the step while the
    job is already ending. The trainer answers TERM as a stop request (publish, exit 42); the
    template sees the job is no longer RUNNING and leaves the requeue to Slurm, so the job
    comes back once, not twice, and resumes from that restore point. (A preemption whose USR1
    the batch shell loses takes this path; it cannot be forced deterministically here: at
    preemption Slurm signals the batch shell whatever --signal says.)"""
    started = time.monotonic()
    job = submit(slurm, tmp_path, trainer_command(tmp_path))
    wait_for(job.seen(0, lambda a: len(a.steps) >= 4), 120, "step 4", job.explain)
    proc = slurm.command("scontrol", "requeue", job.job)
    assert proc.returncode == 0, proc.stderr
    wait_for(job.seen(1, lambda a: len(a.steps) >= 1), 150, "the second run", job.explain)
    print(f"\nslurm: requeue from outside: back after {time.monotonic() - started:.1f} s")
    runs = job.runs()
    assert [a.restart_count for a in runs] == [0, 1], job.explain()
    assert runs[1].trainer_env == ["1"], job.explain()
    assert runs[0].exit_code == 42, job.explain()
    assert not runs[0].requeued_itself, job.explain()
    assert any(re.match(r"restorepoint: .* the job is \w+: no requeue$", x) for x in runs[0].lines)
    stop = one(events(tmp_path / "runs" / "attempt-0"), "graceful_shutdown")
    assert stop["signal"] == "SIGTERM"
    assert stop["upload_finished"] is True
    resumed = one(events(tmp_path / "runs" / "attempt-1"), "resumed")
    assert (resumed["step"], resumed["source"]) == (stop["step"], "store")
    assert runs[1].steps[0] == stop["step"] + 1, job.explain()
    assert slurm.job(job.job)["Restarts"] == "1", job.explain()
    assert slurm.command("scancel", job.job).returncode == 0


def test_warning_and_preemption_resume_to_the_uninterrupted_weights(
    slurm: Cluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    job = submit(slurm, tmp_path, trainer_command(tmp_path))
    # The reference: the same trainer, uninterrupted and outside Slurm, while the job runs.
    with (tmp_path / "reference.log").open("w") as log:
        reference = subprocess.Popen(
            [*TRAINER, "--root", str(tmp_path / "reference"), "--out", str(tmp_path / "ref.pt")],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=slurm.env(),
        )
    try:
        _warning_then_preemption(job, tmp_path, t0)
    finally:
        if reference.poll() is None:
            reference.kill()
        reference.wait()
    assert reference.returncode == 0, (tmp_path / "reference.log").read_text()
    got = torch.load(tmp_path / "final.pt", map_location="cpu", weights_only=False)
    want = torch.load(tmp_path / "ref.pt", map_location="cpu", weights_only=False)
    assert_same_state(got, want, "final")


def _warning_then_preemption(job: Submitted, tmp_path: Path, t0: float) -> None:
    slurm, explain = job.slurm, job.explain

    def phase(name: str) -> None:
        print(f"slurm: {time.monotonic() - t0:6.1f} s  {name}")

    print()
    # 1. The time-limit warning. Sent to the batch shell alone, as --signal=B:USR1@LEAD does;
    # one signal, so no two can race in the bash trap.
    wait_for(job.seen(0, lambda a: len(a.steps) >= 8), 120, "the first run's step 8", explain)
    phase(f"first run at step {job.runs()[0].steps[-1]}: scancel --signal=USR1 --batch")
    proc = slurm.command("scancel", "--signal=USR1", "--batch", job.job)
    assert proc.returncode == 0, proc.stderr
    wait_for(job.seen(1, lambda a: len(a.steps) >= 14), 120, "the second run's progress", explain)
    phase(f"second run (restart count 1) at step {job.runs()[1].steps[-1]}")

    # 2. Preemption: a job of the high partition that needs the whole node.
    preempt(job, tmp_path)
    phase(f"high-partition job {job.others[0]} submitted")
    wait_for(job.seen(2, lambda a: len(a.steps) >= 1), 150, "the third run", explain)
    phase(f"third run (restart count 2) at step {job.runs()[2].steps[-1]}")
    info = job.wait_end(150)
    phase(f"job {info['JobState']}")

    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "2", "0:0"), (
        explain()
    )
    assert slurm.job(job.others[0]).get("JobState") == "COMPLETED", explain()
    runs = job.runs()
    assert [a.restart_count for a in runs] == [0, 1, 2], explain()
    # The step sees the same count as the batch shell.
    assert [a.trainer_env for a in runs] == [["unset"], ["1"], ["2"]], explain()
    assert [a.exit_code for a in runs] == [42, 42, 0], explain()

    roots = tmp_path / "runs"
    first, second, third = (events(roots / f"attempt-{n}") for n in range(3))
    # The warning reached the trainer as the batch shell's USR2; it published, exited 42, and
    # the batch script requeued the job.
    stop1 = one(first, "graceful_shutdown")
    assert stop1["signal"] == "SIGUSR2"
    assert stop1["upload_finished"] is True
    assert runs[0].requeued_itself
    resumed = one(second, "resumed")
    assert (resumed["step"], resumed["source"]) == (stop1["step"], "store")
    # No batch replayed, none skipped: the first run's printed steps end just before the
    # snapshot's step (the stop comes inside commit, before the print), the second run's
    # start right after it.
    assert runs[0].steps == list(range(1, stop1["step"])), explain()
    assert runs[1].steps[0] == stop1["step"] + 1, explain()

    # At preemption the batch shell gets USR1 (and CONT in the same millisecond: bash has
    # been seen to lose one of the two), then TERM after GraceTime, which it ignores while the
    # step takes it. Either signal makes the trainer publish and exit 42; the template requeues
    # a job that is still running, Slurm's REQUEUE preemption one that is ending (the test
    # above takes that path with scontrol requeue). Which one happened is printed; both
    # resume from the store.
    stop2 = one(second, "graceful_shutdown")
    assert stop2["signal"] in {"SIGUSR2", "SIGTERM"}
    via = "the batch shell's USR2" if stop2["signal"] == "SIGUSR2" else "Slurm's TERM"
    by = "the template (exit 42)" if runs[1].requeued_itself else "Slurm (PreemptMode=REQUEUE)"
    phase(f"preemption: trainer stopped at step {stop2['step']} by {via}, requeued by {by}")
    assert runs[1].steps == list(range(stop1["step"] + 1, stop2["step"])), explain()
    resumed = one(third, "resumed")
    assert (resumed["step"], resumed["source"]) == (stop2["step"], "store")
    assert runs[2].steps == list(range(stop2["step"] + 1, TOTAL_STEPS + 1)), explain()

    entries = list_store(f"{tmp_path / 'store'}/")
    # The two stops' restore points, and the state at completion (a final snapshot).
    assert sorted(e.step for e in entries) == [stop1["step"], stop2["step"], TOTAL_STEPS]
    for entry in entries:
        verify(entry.url)


def test_torchrun_workers_stopped_by_the_contract_requeue_and_complete(
    slurm: Cluster, tmp_path: Path
) -> None:
    """torchrun exits 1 when its workers exit 42. Every worker left its stop marker in the
    template's RESTOREPOINT_STOP_DIR, so the template takes the step's 1 as 42: the job
    requeues, resumes from the store and ends COMPLETED, with the weights of an uninterrupted
    torchrun run. torchrun is told to handle USR2 (the template's stop signal) and pass it to
    its workers: by default USR2 would end torchrun itself (docs/slurm.md, "torchrun")."""
    script = Path(__file__).resolve().parents[1] / "runtime" / "_trainer_variants.py"
    store = f"{tmp_path / 'store'}/"

    def torchrun(out: str) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2",
            str(script), "ddp", "--out", out,
        ]  # fmt: skip

    root = shlex.quote(str(tmp_path / "runs"))
    wrapper = (
        f"{REPORT_ENV}; export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1; "
        f'exec "$@" --root {root}/attempt-"${{SLURM_RESTART_COUNT:-0}}"'
    )
    command = [*torchrun(f"{tmp_path}/final-{{rank}}.pt"), "--store", store]
    job = submit(slurm, tmp_path, ["sh", "-c", wrapper, "sh", *command, "--step-delay", "0.4"])
    ref_env = {**slurm.env(), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    reference = subprocess.run(
        [*torchrun(f"{tmp_path}/ref-{{rank}}.pt"), "--root", str(tmp_path / "reference")],
        capture_output=True, text=True, env=ref_env, timeout=240, check=False,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr
    wait_for(job.seen(0, lambda a: len(a.steps) >= 8), 150, "the first run's step 4", job.explain)
    proc = slurm.command("scancel", "--signal=USR1", "--batch", job.job)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_end(240)
    runs = job.runs()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        job.explain()
    )
    assert [a.exit_code for a in runs] == [1, 0], job.explain()
    assert "restorepoint: every process stopped by the contract: exit 42" in runs[0].lines
    assert runs[0].requeued_itself, job.explain()
    # Both workers print to the step's one output: their lines may run together.
    stopped = [int(n) for n in re.findall(r"exit 42 at step (\d+)", "\n".join(runs[0].lines))]
    assert len(stopped) == 2 and len(set(stopped)) == 1, job.explain()
    (line,) = [x for x in runs[0].lines if x.startswith("restorepoint: stop (SIGUSR2) at step")]
    assert "restore point published to" in line and line.endswith("exiting 42 (resumable)")
    resumed = [x for x in runs[1].lines if x.startswith("resumed ")]
    assert resumed == [f"resumed {stopped[0]} {resumed[0].split()[2]} {resumed[0].split()[3]}"] * 2
    for rank in (0, 1):
        got = torch.load(tmp_path / f"final-{rank}.pt", map_location="cpu", weights_only=False)
        want = torch.load(tmp_path / f"ref-{rank}.pt", map_location="cpu", weights_only=False)
        assert_same_state(got, want, f"rank {rank}")
