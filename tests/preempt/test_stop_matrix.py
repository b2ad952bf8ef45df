"""The stop contract through the CLI (docs/preempt.md, "The stop contract"): trainer kind x
stop source, with real signals, the metadata emulators and a store on moto's S3 server. Each
cell checks the exit code (42), that the store's newest restore point is the stop's (newer
than the last periodic one; for a trainer that cannot snapshot, its newest periodic one), and
a resume to the end, bit for bit. The shared helpers are in stops.py; a few cells run by
default, every one with RESTOREPOINT_FULL_MATRIX=1.

Trainer kinds here: the fake LichtFeld Studio (the external adapter), the same binary without
the snapshot patch (a plain command: the fallback), a user's ResumableRun script, and an
external profile whose own snapshot signal is SIGUSR2 (the template's stop signal).
Also: a trainer that ignores SIGTERM is killed after ``--kill-after``, and the unpatched
binary is never killed by a snapshot request.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers.s3 import s3_env_for
from adapters.test_external import OTHER, PROFILE_TOML
from clirun import cli, one_error_line

from restorepoint import list_store, verify

from .stops import Supervised, cells, deliver, emulators, until, watch_args
from .test_external_loop import (
    FAKE,
    JOB,
    RUN,
    OwnS3,
    checkpoints,
    events,
    make_data,
)

pytestmark = [pytest.mark.s3, pytest.mark.slow]

ITERATIONS = 6000


@pytest.fixture
def s3() -> Iterator[OwnS3]:
    pytest.importorskip("moto.server")
    own = OwnS3()
    try:
        yield own
    finally:
        own.stop()


def lichtfeld_args(
    tmp: Path, store: str, out: Path, data: Path, *extra: str, every: int | None = None,
    delay: float = 0.002, trainer_extra: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    job = tmp / "job.yaml"
    job.write_text(JOB)
    return [
        "--store", store, "--adapter", "lichtfeld", "--adapter-option",
        f"binary={shlex.join(FAKE)}", "--workdir", str(out), "--config", str(job),
        "--cache-root", "/cache", "--run", RUN, "--telemetry", str(tmp / f"{out.name}.tel"),
        *(["--every", str(every)] if every is not None else []), *extra, "--",
        *FAKE, "--headless", "-d", str(data), "-o", str(out), "-i", str(ITERATIONS),
        "--step-delay", str(delay), *trainer_extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference_splat(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The uninterrupted run's result, without a supervisor."""
    root = tmp_path_factory.mktemp("reference")
    data, out = make_data(root), root / "out"
    subprocess.run(
        [*FAKE, "--headless", "-d", str(data), "-o", str(out), "-i", str(ITERATIONS)],
        check=True, timeout=120, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return (out / f"splat_{ITERATIONS}.ply").read_bytes()


def _resume_to_the_end(tmp: Path, s3: OwnS3, data: Path, expected: bytes) -> None:
    """Another machine (another output directory) resumes the store's newest to the end."""
    b = tmp / "b"
    again = Supervised(
        tmp, lichtfeld_args(tmp, s3.store, b, data, "--auto-resume", every=0, delay=0),
        s3_env_for(s3.options), "resume",
    )  # fmt: skip
    assert again.wait() == 0, again.stderr
    assert "Checkpoint loaded" in again.stdout
    assert (b / f"splat_{ITERATIONS}.ply").read_bytes() == expected


@pytest.mark.parametrize("stop", cells("lichtfeld", default={"sigusr2", "gcp", "manual+sigterm"}))
def test_external_trainer(stop: str, tmp_path: Path, s3: OwnS3, reference_splat: bytes) -> None:
    data, out = make_data(tmp_path), tmp_path / "out"
    with emulators(stop) as metadata:
        run = Supervised(
            tmp_path, lichtfeld_args(tmp_path, s3.store, out, data, *watch_args(stop, metadata)),
            s3_env_for(s3.options),
        )  # fmt: skip
        try:
            until(lambda: events(out, "uploaded"), what="the first periodic upload")
            periodic = events(out, "uploaded")[-1]["step"]
            manual = deliver(stop, run, metadata, out)
            assert run.wait() == 42, run.stderr
        finally:
            run.kill()
    assert "exit 42" in run.stderr
    (newest,) = list_store(s3.store, run=RUN, storage_options=s3.options)
    assert newest.step > periodic, run.stderr  # the stop's own snapshot
    if manual is not None:
        assert newest.step > manual
    verify(newest.url, storage_options=s3.options)
    # Telemetry counts each publish once, the stop's too.
    tel = [json.loads(x) for x in (tmp_path / "out.tel").read_text().splitlines()]
    (end,) = [d for d in tel if d["event"] == "exit"]
    uploads = [d for d in tel if d["event"] == "upload"]
    assert end["exit_code"] == 42
    assert end["uploads"] == len(uploads) == len(events(out, "uploaded"))
    _resume_to_the_end(tmp_path, s3, data, reference_splat)


@pytest.mark.parametrize("stop", cells("plain", default={"sigterm"}))
def test_a_trainer_that_cannot_snapshot_publishes_its_newest_periodic_checkpoint(
    stop: str, tmp_path: Path, s3: OwnS3, reference_splat: bytes
) -> None:
    """The upstream binary (no snapshot handler): the fallback, never a signal it would die
    of. A manual snapshot is refused (exit 2), so that cell is the plain SIGTERM."""
    data, out = make_data(tmp_path), tmp_path / "out"
    with emulators(stop) as metadata:
        args = lichtfeld_args(
            tmp_path, s3.store, out, data, *watch_args(stop, metadata),
            trainer_extra=("--unpatched",),
        )  # fmt: skip
        run = Supervised(tmp_path, args, s3_env_for(s3.options))
        try:
            until(lambda: events(out, "uploaded"), what="the first periodic upload")
            if stop == "manual+sigterm":
                asked = cli("snapshot", str(out), "--wait", "5")
                assert asked.returncode == 2
                assert "does not handle the snapshot signal" in one_error_line(asked)
                stop = "sigterm"
            deliver(stop, run, metadata, out)
            assert run.wait() == 42, run.stderr
        finally:
            run.kill()
    assert "this trainer does not handle the snapshot signal" in run.stderr
    assert "exit 42" in run.stderr
    # The trainer was stopped by SIGTERM, never killed by a snapshot signal.
    assert "Received SIGTERM" in run.stdout
    (newest,) = list_store(s3.store, run=RUN, storage_options=s3.options)
    seen = [e["step"] for e in events(out, "snapshot")]
    assert newest.step == max(seen) and newest.step % 500 == 0  # its newest periodic one
    assert f"checkpoint_{newest.step}.resume" in checkpoints(out)
    _resume_to_the_end(tmp_path, s3, data, reference_splat)


def test_the_unpatched_binary_is_never_killed_by_a_snapshot_request(
    tmp_path: Path, s3: OwnS3
) -> None:
    """``restorepoint snapshot OUT`` and a snapshot notice, to a trainer that prints its ready
    line but has no handler: refused (exit 2) and dropped; it trains on."""
    data, out = make_data(tmp_path), tmp_path / "out"
    with emulators("aws") as aws:
        assert aws is not None
        args = lichtfeld_args(
            tmp_path, s3.store, out, data, *watch_args("aws", aws), every=0,
            trainer_extra=("--unpatched",),
        )  # fmt: skip
        run = Supervised(tmp_path, args, s3_env_for(s3.options))
        try:
            log = out / "restorepoint-trainer.log"
            until(lambda: log.exists() and "Starting training loop" in log.read_text())
            asked = cli("snapshot", str(out))
            assert asked.returncode == 2
            assert "this trainer does not handle the snapshot signal" in one_error_line(asked)
            aws.arm_rebalance()
            until(lambda: "no snapshot" in run.stderr, what="the notice dropped")
            # SIGUSR1 to the supervisor itself (a snapshot request): dropped, not passed on.
            run.proc.send_signal(signal.SIGUSR1)
            until(lambda: "not sent" in run.stderr, what="the request dropped")
            assert run.proc.poll() is None
            run.proc.send_signal(signal.SIGTERM)
            assert run.wait() == 42, run.stderr
        finally:
            run.kill()
    assert "Received SIGTERM" in run.stdout


IGNORES_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
time.sleep(600)
"""


def test_a_trainer_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = Supervised(
        tmp_path,
        ["--store", str(store), "--kill-after", "2", "--", sys.executable, "-c", IGNORES_SIGTERM],
        dict(os.environ),
    )
    try:
        until(lambda: "up" in run.stdout, what="the trainer up")
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(60) == 42, run.stderr
    finally:
        run.kill()
    assert "has not ended 2 s after SIGTERM: SIGKILL" in run.stderr
    assert "the trainer ended by the stop (SIGKILL): exit 42" in run.stderr


# -- a user's ResumableRun script ----------------------------------------------------------

torch = pytest.importorskip("torch", reason="the ResumableRun trainer needs torch")

from .test_supervisor import (  # noqa: E402
    RUN_ID,
    assert_same_final,
    clean_env,
    trainer,
)
from .test_supervisor import events as run_events  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of an uninterrupted run (no supervisor, no store)."""
    root = tmp_path_factory.mktemp("reference")
    out = root / "final.pt"
    subprocess.run(trainer(root, out, delay=0), check=True, timeout=180, env=clean_env())
    return out


@pytest.mark.parametrize("stop", cells("resumablerun", default={"sigterm", "aws"}))
def test_resumable_run_script(stop: str, tmp_path: Path, s3: OwnS3, reference: Path) -> None:
    root, out = tmp_path / "a", tmp_path / "final.pt"
    run_dir = root / RUN_ID
    env: dict[str, Any] = {**clean_env(), **s3_env_for(s3.options)}
    with emulators(stop) as metadata:
        run = Supervised(
            tmp_path,
            ["--store", s3.store, *watch_args(stop, metadata), "--",
             *trainer(root, out)],
            env,
        )  # fmt: skip
        try:
            until(lambda: (run_dir / "trainer.json").exists(), what="the trainer up")
            manual = deliver(stop, run, metadata, run_dir)
            assert run.wait() == 42, run.stderr
        finally:
            run.kill()
    (shutdown,) = run_events(run_dir, "graceful_shutdown")
    entries = list_store(s3.store, run=RUN_ID, storage_options=s3.options)
    newest = max(entries, key=lambda e: e.step)
    assert newest.step == shutdown["step"]  # the stop's own snapshot
    if manual is not None:
        assert newest.step > manual
    # Another machine: a fresh root, the same store; it resumes and trains to the end.
    final = tmp_path / "final-b.pt"
    again = Supervised(
        tmp_path,
        ["--store", s3.store, "--", *trainer(tmp_path / "b", final, delay=0)],
        env, "resume",
    )  # fmt: skip
    assert again.wait() == 0, again.stderr
    assert_same_final(final, reference)


def test_a_refused_resume_is_exit_3_and_telemetry_has_no_resumed(tmp_path: Path) -> None:
    """A ResumableRun handed an import it refuses (another learning rate): exit 3, and
    telemetry records ``resume_refused`` without a ``resumed`` before it."""
    store = f"{tmp_path / 'store'}/"
    command = trainer(tmp_path / "a", tmp_path / "a.pt")
    first = Supervised(tmp_path, ["--store", store, "--", *command], clean_env(), "first")
    until(lambda: (tmp_path / "a" / RUN_ID / "trainer.json").exists(), what="the trainer up")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait() == 42, first.stderr
    (entry,) = list_store(store, run=RUN_ID)
    tele = tmp_path / "t.jsonl"
    other = [*trainer(tmp_path / "b", tmp_path / "b.pt"), "--lr", "0.5"]
    refused = Supervised(
        tmp_path, ["--store", store, "--resume-from", entry.url, "--telemetry", str(tele), "--",
                   *other], clean_env(), "refused",
    )  # fmt: skip
    assert refused.wait() == 3, refused.stderr
    kinds = [json.loads(x)["event"] for x in tele.read_text().splitlines()]
    assert "resume_refused" in kinds and "resumed" not in kinds, kinds


# -- an external profile whose snapshot signal is SIGUSR2 ----------------------------------

OTHER_STEPS = 3000


def other_args(
    tmp: Path, s3: OwnS3, out: Path, data: Path, *extra: str, every: int, delay: float
) -> list[str]:
    profile = tmp / "other.toml"
    profile.write_text(PROFILE_TOML)
    return [
        "--store", s3.store, "--adapter", "external", "--adapter-option", f"profile={profile}",
        "--adapter-option", f"binary={shlex.join(OTHER)}", "--workdir", str(out),
        "--run", "other", "--every", str(every), *extra, "--",
        *OTHER, "--data", str(data), "--out", str(out), "--steps", str(OTHER_STEPS),
        "--step-delay", str(delay),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "stop", cells("profile", default={"sigusr2"}, stops=("sigusr2", "sigterm"))
)
def test_a_profile_whose_snapshot_signal_is_sigusr2(stop: str, tmp_path: Path, s3: OwnS3) -> None:
    """SIGUSR2 to the supervisor is a stop even where the trainer's own snapshot signal is
    SIGUSR2 (sent to it only as the profile's snapshot request)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "samples.bin").write_bytes(bytes(range(256)))
    out = tmp_path / "out"
    run = Supervised(
        tmp_path, other_args(tmp_path, s3, out, data, every=500, delay=0.002),
        s3_env_for(s3.options),
    )  # fmt: skip
    try:
        until(lambda: events(out, "uploaded"), what="the first periodic upload")
        periodic = events(out, "uploaded")[-1]["step"]
        deliver(stop, run, None, out)
        assert run.wait() == 42, run.stderr
    finally:
        run.kill()
    (newest,) = list_store(s3.store, run="other", storage_options=s3.options)
    assert newest.step > periodic, run.stderr
    reference = tmp_path / "reference"
    subprocess.run(
        [*OTHER, "--data", str(data), "--out", str(reference), "--steps", str(OTHER_STEPS),
         "--format", "bin"],
        check=True, timeout=120, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    b = tmp_path / "b"
    again = Supervised(
        tmp_path, other_args(tmp_path, s3, b, data, "--auto-resume", every=0, delay=0),
        s3_env_for(s3.options), "resume",
    )  # fmt: skip
    assert again.wait() == 0, again.stderr
    assert (b / "final.bin").read_bytes() == (reference / "final.bin").read_bytes()
