"""The spot-queue loop for an external trainer from one command (docs/preempt.md, "External
trainers: the whole loop"): the fake LichtFeld Studio under ``restorepoint run --adapter
lichtfeld --config job.yaml``, the real CLI, a store on moto's S3 server.

- a run with ``train.checkpoint_every: 500`` over 3,000 iterations publishes each snapshot;
  the store ends with the newest only, the output directory with one checkpoint;
- the S3 server stopped in the middle: one upload failure, training goes on, the next snapshot
  is published once the server is back (the checkpoint that failed stays until then);
- a stop notice from the metadata emulator publishes in time and exits 42;
- a second machine (another output directory) passes the gate with the same binary, data and
  cache root and resumes, and is refused after one input image changed;
- ``restorepoint snapshot OUT`` by hand adds a restore point without stopping the trainer.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers.faults import FaultProxy, Faults
from _servers.s3 import s3_env_for, s3_options
from clirun import cli

from restorepoint import config_identity, list_store, read_manifest, verify

from .emulators import AwsEmulator
from .test_supervisor import until

pytestmark = [pytest.mark.s3, pytest.mark.slow]

FAKE = [sys.executable, "-m", "restorepoint.testing.fake_lichtfeld"]
RUN = "splat"
JOB = "scene: garden\ntrain:\n  checkpoint_every: 500\n"


class OwnS3:
    """A moto S3 server of this test's own, on a port it keeps across a stop and a start (so
    that a store on it can go away in the middle of a run and come back)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._make = lambda: ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server = self._make()
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # Few retries, short timeouts: a store that is down fails a publish in seconds.
        self.options = s3_options(
            self.endpoint, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10
        )
        import boto3

        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        )  # fmt: skip
        # moto keeps every bucket of this process in one backend: a bucket of this test's own.
        self.bucket = f"jobs-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=self.bucket)
        self.store = f"s3://{self.bucket}/runs/"

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = self._make()
        self.server.start()


@pytest.fixture
def s3() -> Iterator[OwnS3]:
    pytest.importorskip("moto.server")
    own = OwnS3()
    try:
        yield own
    finally:
        own.stop()


def make_data(root: Path) -> Path:
    data = root / "data"
    (data / "images").mkdir(parents=True)
    for i in range(3):
        (data / "images" / f"DSC{i:04d}.JPG").write_bytes(bytes([i]) * 64)
    (data / "sparse.txt").write_text("cameras\n")
    return data


class Run:
    """``restorepoint run --adapter lichtfeld ...`` as a subprocess."""

    def __init__(self, tmp: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.err = tmp / f"{name}.stderr"
        self.out = tmp / f"{name}.stdout"
        with open(self.err, "w") as err, open(self.out, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "restorepoint", "run", *args],
                stdout=out, stderr=err, env=env,
            )  # fmt: skip

    def wait(self, timeout: float = 180) -> int:
        return self.proc.wait(timeout)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for r in started:
        r.kill()


def events(out: Path, kind: str) -> list[dict[str, Any]]:
    path = out / "events.jsonl"
    if not path.exists():
        return []
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [d for d in docs if d["event"] == kind]


def telemetry(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    return [d for d in docs if d["event"] == kind]


def loop_args(
    tmp: Path, store: str, out: Path, data: Path, *extra: str, iterations: int = 3000,
    delay: float = 0.004,
) -> list[str]:  # fmt: skip
    job = tmp / "job.yaml"
    job.write_text(JOB)
    return [
        "--store", store, "--adapter", "lichtfeld", "--adapter-option",
        f"binary={shlex.join(FAKE)}", "--workdir", str(out), "--config", str(job),
        "--cache-root", "/cache", "--run", RUN, "--telemetry", str(tmp / f"{out.name}.tel"),
        *extra, "--",
        *FAKE, "--headless", "-d", str(data), "-o", str(out), "-i", str(iterations),
        "--step-delay", str(delay),
    ]  # fmt: skip


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("checkpoint_*.resume"))


def test_every_snapshot_is_published_and_the_store_and_the_project_keep_the_newest(
    tmp_path: Path, s3: OwnS3, runs: list[Run]
) -> None:
    data, out, store = make_data(tmp_path), tmp_path / "out", s3.store
    env = s3_env_for(s3.options)
    run = Run(tmp_path, "a", loop_args(tmp_path, store, out, data), env)
    runs.append(run)
    assert run.wait() == 0, run.stderr
    # --save-steps from train.checkpoint_every, never the final iteration.
    assert [e["step"] for e in events(out, "snapshot")] == [500, 1000, 1500, 2000, 2500]
    assert [e["step"] for e in events(out, "uploaded")] == [500, 1000, 1500, 2000, 2500]
    uploads = telemetry(tmp_path / "out.tel", "upload")
    assert [u["step"] for u in uploads] == [500, 1000, 1500, 2000, 2500]
    assert [c["step"] for c in telemetry(tmp_path / "out.tel", "checkpoint")] == [
        500, 1000, 1500, 2000, 2500,
    ]  # fmt: skip
    (entry,) = list_store(store, run=RUN, storage_options=s3.options)
    assert entry.step == 2500
    report = verify(entry.url, storage_options=s3.options)
    head = report.manifest
    assert head.trainer is not None and head.trainer.name == "lichtfeld-studio"
    assert head.config is not None and head.config["scene"] == "garden"
    assert head.operational_keys == ("train.checkpoint_every",)
    assert set(head.cache_keys) == {"lichtfeld.config", "lichtfeld.data"}
    assert head.cache_root == "/cache"
    assert checkpoints(out) == ["checkpoint_2500.resume"]
    # The snapshot interval is recorded, but operational: the identity is that of the config
    # without it, and so are the cache keys.
    assert head.config["train"] == {"checkpoint_every": 500}
    assert head.config_identity == config_identity({"scene": "garden"}, ())


def test_a_store_that_goes_away_fails_one_upload_and_training_goes_on(
    tmp_path: Path, s3: OwnS3, runs: list[Run]
) -> None:
    data, out, store = make_data(tmp_path), tmp_path / "out", s3.store
    run = Run(tmp_path, "a", loop_args(tmp_path, store, out, data), s3_env_for(s3.options))
    runs.append(run)
    until(lambda: events(out, "uploaded"), 120, "the first upload")
    s3.stop()
    until(lambda: events(out, "upload_failed"), 120, "the failed upload")
    (failed,) = events(out, "upload_failed")
    # The checkpoint that failed stays until a later one is published.
    assert f"checkpoint_{failed['step']}.resume" in checkpoints(out)
    s3.start()
    assert run.wait() == 0, run.stderr
    (failure,) = telemetry(tmp_path / "out.tel", "upload_failure")
    assert failure["step"] == failed["step"]
    later = [e["step"] for e in events(out, "uploaded") if e["step"] > failed["step"]]
    assert later and later[-1] == 2500
    assert [e.step for e in list_store(store, run=RUN, storage_options=s3.options)] == [2500]
    assert checkpoints(out) == ["checkpoint_2500.resume"]


def test_a_stop_notice_publishes_in_time_and_exits_42(
    tmp_path: Path, s3: OwnS3, runs: list[Run]
) -> None:
    data, out, store = make_data(tmp_path), tmp_path / "out", s3.store
    with AwsEmulator() as aws:
        args = loop_args(
            tmp_path, store, out, data, "--watch", "aws", "--metadata-url", aws.url,
            iterations=10**6, delay=0.002,
        )  # fmt: skip
        run = Run(tmp_path, "a", args, s3_env_for(s3.options))
        runs.append(run)
        until(lambda: events(out, "uploaded"), 120, "the first periodic upload")
        periodic = events(out, "uploaded")[-1]["step"]
        deadline = aws.arm_instance_action("terminate", seconds=60)
        assert run.wait() == 42, run.stderr
    assert "published; stopping the trainer; exit 42" in run.stderr
    (newest,) = list_store(store, run=RUN, storage_options=s3.options)
    # The stop's snapshot, newer than the periodic one before it, published in time.
    assert newest.step > periodic
    (published,) = telemetry(tmp_path / "out.tel", "published")
    assert published["kind"] == "stop" and published["in_time"] is True
    assert newest.created_at <= deadline
    verify(newest.url, storage_options=s3.options)


def test_a_second_machine_passes_the_gate_and_is_refused_after_an_image_changed(
    tmp_path: Path, s3: OwnS3, runs: list[Run]
) -> None:
    data, store = make_data(tmp_path), s3.store
    env = s3_env_for(s3.options)
    first = Run(
        tmp_path, "a", loop_args(tmp_path, store, tmp_path / "a", data, iterations=1200), env
    )
    runs.append(first)
    assert first.wait() == 0, first.stderr
    (entry,) = list_store(store, run=RUN, storage_options=s3.options)
    assert entry.step == 1000
    # Machine B: the same binary, data and cache root, another output directory.
    b = tmp_path / "b"
    second = Run(
        tmp_path, "b", loop_args(tmp_path, store, b, data, "--auto-resume", iterations=1200), env
    )
    runs.append(second)
    assert second.wait() == 0, second.stderr
    assert "Checkpoint loaded" in second.stdout and "iter 1000)" in second.stdout
    assert (b / "splat_1200.ply").read_bytes() == (tmp_path / "a" / "splat_1200.ply").read_bytes()
    # Machine C: one input image changed, so the cache key of the data is another.
    other = tmp_path / "other-data"
    shutil.copytree(data, other)
    (other / "images" / "DSC0001.JPG").write_bytes(b"another photograph")
    c = tmp_path / "c"
    third = Run(
        tmp_path, "c", loop_args(tmp_path, store, c, other, "--auto-resume", iterations=1200), env
    )
    runs.append(third)
    assert third.wait() == 3, third.stderr
    assert "cache_keys.lichtfeld.data" in third.stderr
    assert not c.exists()
    (refused,) = telemetry(tmp_path / "c.tel", "resume_refused")
    assert refused["fields"] == "cache_keys.lichtfeld.data"
    resumed = telemetry(tmp_path / "b.tel", "resumed")
    assert resumed and resumed[0]["step"] == 1000 and resumed[0]["bytes"] > 0


def test_a_snapshot_by_hand_adds_a_restore_point_without_stopping_the_trainer(
    tmp_path: Path, s3: OwnS3, runs: list[Run]
) -> None:
    data, out, store = make_data(tmp_path), tmp_path / "out", s3.store
    args = loop_args(
        tmp_path, store, out, data, "--every", "0", "--keep-last", "5",
        iterations=10**7, delay=0.002,
    )  # fmt: skip
    run = Run(tmp_path, "a", args, s3_env_for(s3.options))
    runs.append(run)
    until(lambda: (out / "trainer.json").exists(), 60, "the supervisor's report")
    log = out / "restorepoint-trainer.log"
    until(
        lambda: log.exists() and "Starting training loop" in log.read_text(), 60, "the trainer up"
    )
    proc = cli("snapshot", str(out), "--wait", "60", "--json")
    assert proc.returncode == 0, proc.stderr
    step = json.loads(proc.stdout)["step"]
    until(lambda: events(out, "uploaded"), 60, "the upload")
    assert run.proc.poll() is None  # the trainer trains on
    (entry,) = list_store(store, run=RUN, storage_options=s3.options)
    assert entry.step == step
    assert read_manifest(entry.url, storage_options=s3.options).position.step == step
    run.proc.terminate()
    run.wait()


def test_a_stop_notice_bounds_the_retries_of_a_failing_store(
    tmp_path: Path, s3_fault_proxy: FaultProxy, s3_bucket: str, runs: list[Run]
) -> None:
    """The store starts answering 503 to everything after the first periodic upload, then a
    termination notice comes (12 s, less the 5 s margin). The store's policy here would retry
    each request for minutes (1000 tries, a second apart); the notice's deadline cuts them
    short: the publishes give up by it, the supervisor says the previous restore point stays
    the newest and exits 42, long before the retries would have ended."""
    data, out = make_data(tmp_path), tmp_path / "out"
    store = f"s3://{s3_bucket}/runs/"
    options = s3_options(s3_fault_proxy.endpoint)
    env = s3_env_for(options)
    env.update(
        RESTOREPOINT_STORE_ATTEMPTS="1000",
        RESTOREPOINT_STORE_BACKOFF="1",
        RESTOREPOINT_STORE_BACKOFF_CAP="1",
    )
    with AwsEmulator() as aws:
        args = loop_args(
            tmp_path, store, out, data, "--watch", "aws", "--metadata-url", aws.url,
            iterations=10**6, delay=0.002,
        )  # fmt: skip
        run = Run(tmp_path, "a", args, env)
        runs.append(run)
        until(lambda: events(out, "uploaded"), 120, "the first periodic upload")
        s3_fault_proxy.set(Faults(error=1.0))
        periodic = events(out, "uploaded")[-1]["step"]
        aws.arm_instance_action("terminate", seconds=12)
        assert run.wait(timeout=90) == 42, run.stderr
    assert "no restore point landed before the deadline" in run.stderr
    assert "the deadline is near" in run.stderr
    assert s3_fault_proxy.injected["error"] < 1000
    s3_fault_proxy.set(Faults())
    (newest,) = list_store(store, run=RUN, storage_options=options)
    assert newest.step == periodic  # the previous restore point stays the newest
    verify(newest.url, storage_options=options)
