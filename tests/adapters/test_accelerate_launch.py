"""restorepoint.adapters.accelerate under the real ``accelerate launch`` with two CPU processes
on gloo (tests/adapters/_accelerate_job.py), under ``restorepoint run`` with a store on moto's S3
server. A SIGTERM mid-loop ends the job with 42, and the stop's state is ONE multi-part restore
point (each process's RNG states its own part, the rest the shared part, one commit). A fresh
directory resumes from it, each process its own files, and ends bit for bit where an
uninterrupted run ends. A changed config is then refused naming its field: exit 3, through
the launcher (which exits 1 when a process exits 3).

``accelerate launch --cpu`` starts one process (its several CPU processes need MPI); with
``--multi_gpu`` on a machine without GPUs it starts torch.distributed's launcher, and the
script's ``Accelerator(cpu=True)`` then runs MULTI_CPU over gloo."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from restorepoint.ops import list_store  # noqa: E402
from restorepoint.ops.verify import inspect_restore_point  # noqa: E402

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("_accelerate_job.py")
WAIT = 240.0
STEPS = 8


def job_env(s3_env: dict[str, str]) -> dict[str, str]:
    base = {
        k: v
        for k, v in s3_env.items()
        if not k.startswith(("RESTOREPOINT_", "SUBMITIT_", "TORCHELASTIC_", "ACCELERATE_"))
    }
    if Path("/sys/class/net/lo").exists():
        # gloo picks an interface by the host name otherwise, which need not resolve.
        base["GLOO_SOCKET_IFNAME"] = "lo"
    return {**base, "OMP_NUM_THREADS": "1"}


def launch(work: Path, tag: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", "0", str(JOB), "--dir", str(work / tag), "--out",
        str(work / tag), "--run", "acc", "--steps", str(STEPS), *args,
    ]  # fmt: skip


def assert_same_as_reference(work: Path, tag: str) -> None:
    for rank in (0, 1):
        got = torch.load(work / f"{tag}-{rank}.pt", weights_only=True)
        want = torch.load(work / f"ref-{rank}.pt", weights_only=True)
        for key, value in want["model"].items():
            assert torch.equal(got["model"][key], value), (tag, rank, key)
        assert torch.equal(got["rng"], want["rng"]), (tag, rank)
        for index, state in want["optimizer"]["state"].items():
            for name, value in state.items():
                got_value = got["optimizer"]["state"][index][name]
                assert torch.equal(got_value, value), (tag, rank, name)


def supervised(store: str, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "restorepoint", "run", "--store", store, "--", *command]


def test_two_processes_one_multipart_restore_point_sigterm_42_and_a_bit_for_bit_resume(
    tmp_path: Path, s3_bucket: str, s3_env: dict[str, str], s3_storage_options: dict[str, Any]
) -> None:
    env = job_env(s3_env)
    store = f"s3://{s3_bucket}/runs/"
    reference = subprocess.run(
        launch(tmp_path, "ref"), capture_output=True, text=True, env=env, timeout=WAIT,
        check=False,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr

    out, err = tmp_path / "stopped.out", tmp_path / "stopped.err"
    command = supervised(store, launch(tmp_path, "a", "--step-delay", "0.3"))
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + WAIT
        while "step 3\n" not in out.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "no step 3"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr_text = err.read_text()
    assert code == 42, stderr_text
    (entry,) = list_store(store, storage_options=s3_storage_options)
    assert 3 <= entry.step < STEPS
    # One restore point of both processes: a commit naming each one's part and the shared one.
    commit = inspect_restore_point(entry.url, storage_options=s3_storage_options).manifest
    assert commit.parts is not None and commit.parts.world_size == 2
    assert sorted(ref.name for ref in commit.parts.objects) == [
        "rank-00000.rp", "rank-00001.rp", "shared.rp",
    ]  # fmt: skip
    stop = [ln for ln in stderr_text.splitlines() if ln.startswith("restorepoint: stop (")]
    assert stop == [
        f"restorepoint: stop (SIGTERM) at step {entry.step}: restore point published to "
        f"{entry.url} and verified; exiting 42 (resumable)"
    ]

    # Another machine: a fresh directory, the same store.
    resumed = subprocess.run(
        supervised(store, launch(tmp_path, "b")),
        capture_output=True, text=True, env=env, timeout=WAIT, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    # Both processes write to one pipe, so their lines may interleave: count the words.
    assert len(re.findall(rf"start {entry.step}(?!\d)", resumed.stdout)) == 2, resumed.stdout
    assert sorted(os.listdir(tmp_path / "b")) == [
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl",
        "restorepoint-state.json", "scheduler.bin",
    ]  # fmt: skip
    assert_same_as_reference(tmp_path, "b")

    # The same run with another learning rate, under the launcher: refused, naming the field;
    # exit 3, though accelerate launch exits 1 when a process exits 3.
    refused = subprocess.run(
        supervised(store, launch(tmp_path, "c", "--lr", "0.5")),
        capture_output=True, text=True, env=env, timeout=WAIT, check=False,
    )  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("restorepoint: error:")]
    assert "config.lr" in line
    assert "restorepoint:   config.lr: here 0.5 (config=), in the restore point 0.05" in (
        refused.stderr
    )
    assert "start" not in refused.stdout
