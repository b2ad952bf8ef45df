"""Signals: flags acted on at effective-batch boundaries, previous handlers chained and
restored, submitit's preemption signal, forked DataLoader workers, the real process path (a
trainer subprocess and SIGTERM), the resubmit limit, and failed uploads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.errors import StorageUnavailable, UsageError  # noqa: E402
from restorepoint.format import Position  # noqa: E402
from restorepoint.ops import list_store  # noqa: E402
from restorepoint.runtime import state as state_module  # noqa: E402
from restorepoint.runtime.stop import RELEASE_S  # noqa: E402
from restorepoint.runtime.worker import DEFAULT_NICE  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
TOTAL = tv.total_steps()


@pytest.fixture(autouse=True)
def clean_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from the default handlers and leaves them as it found them."""
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    torch.set_num_threads(threads)


def send_at(steps: dict[int, signal.Signals]) -> tv.Hook:
    """A before_commit hook that sends this process a signal just before committing a step."""

    def hook(run: ResumableRun, step: int) -> None:
        if step in steps:
            os.kill(os.getpid(), steps[step])

    return hook


def kinds(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in tv.events(run_dir) if e["event"] == kind]


def status(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run_status.json").read_text())


# -- previous handlers -------------------------------------------------------------------


def test_previous_snapshot_handler_is_chained_once_after_each_snapshot(tmp_path: Path) -> None:
    calls: list[list[int]] = []
    runs: list[ResumableRun] = []

    def previous(signum: int, frame: Any) -> None:
        assert signum == signal.SIGUSR1
        # What had been snapshotted when the chained handler ran.
        calls.append([e["step"] for e in kinds(runs[0].run_dir, "snapshot")])

    def hook(run: ResumableRun, step: int) -> None:
        runs[:] = [run]
        assert signal.getsignal(signal.SIGUSR1) is not previous
        if step in (3, 7):
            os.kill(os.getpid(), signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, previous)
    out = tv.train(tmp_path, before_commit=hook)
    assert out.code == 0
    assert calls == [[3], [3, 7]]
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert out.run is not None and status(out.run.run_dir)["status"] == "completed"


def test_previous_stop_handler_is_chained_once_after_the_snapshot(tmp_path: Path) -> None:
    calls: list[tuple[int, bool, int]] = []
    runs: list[ResumableRun] = []

    def previous(signum: int, frame: Any) -> None:
        checkpoints = runs[0].run_dir / "checkpoints"
        step = json.loads((checkpoints / "position.json").read_text())["step"]
        calls.append((signum, (checkpoints / "last.pt").exists(), step))

    def hook(run: ResumableRun, step: int) -> None:
        runs[:] = [run]
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, previous)
    out = tv.train(tmp_path, before_commit=hook)
    assert out.code == 42
    assert calls == [(signal.SIGTERM, True, 5)]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_default_and_ignore_handlers_are_restored(tmp_path: Path) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    out = tv.train(tmp_path, before_commit=send_at({4: signal.SIGUSR1}))
    assert out.code == 0
    assert out.run is not None and [e["step"] for e in kinds(out.run.run_dir, "snapshot")] == [4]
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    # A default SIGTERM disposition is not "chained": that would kill the process.
    out = tv.train(tmp_path / "b", before_commit=send_at({2: signal.SIGTERM}))
    assert out.code == 42
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


# -- which signal stops ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (None, signal.SIGUSR2),
        ("USR1", signal.SIGUSR1),
        ("SIGUSR1", signal.SIGUSR1),
        ("12", 12),
        (str(int(signal.SIGUSR1)), signal.SIGUSR1),
    ],
)
def test_submitit_preempt_signal_sets_the_stop_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, expected: int
) -> None:
    if env is not None:
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", env)
    run = ResumableRun(tv.CONFIG, root=tmp_path)
    assert run.stop_signals == (signal.SIGTERM, signal.SIGINT, expected)


def test_unknown_submitit_signal_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "NOPE")
    with pytest.raises(UsageError, match="unknown signal"):
        ResumableRun(tv.CONFIG, root=tmp_path)


@pytest.mark.parametrize(
    ("env", "sent"),
    [(None, signal.SIGUSR2), ("USR1", signal.SIGUSR1), ("12", signal.Signals(12))],
)
def test_the_stop_signal_snapshots_and_exits_42(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, sent: signal.Signals
) -> None:
    if env is not None:
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", env)
    out = tv.train(tmp_path, before_commit=send_at({6: sent}))
    assert out.code == 42
    assert out.run is not None
    (shutdown,) = kinds(out.run.run_dir, "graceful_shutdown")
    assert (shutdown["signal"], shutdown["step"]) == (sent.name, 6)
    assert status(out.run.run_dir)["last_signal"] == sent.name


@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals here")
def test_a_real_time_stop_signal_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # signal.Signals has no member for most real-time signals: naming one must not crash.
    signum = signal.SIGRTMIN + 6
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", str(int(signum)))
    previous = signal.getsignal(signum)
    out = tv.train(tmp_path, before_commit=send_at({3: signum}))  # type: ignore[dict-item]
    assert out.code == 42
    assert out.run is not None
    (shutdown,) = kinds(out.run.run_dir, "graceful_shutdown")
    assert (shutdown["signal"], shutdown["step"]) == ("SIGRTMIN+6", 3)
    assert signal.getsignal(signum) == previous


# -- flags at boundaries -----------------------------------------------------------------


def test_snapshot_signal_snapshots_at_the_next_boundary_and_trains_on(tmp_path: Path) -> None:
    out = tv.train(tmp_path, before_commit=send_at({5: signal.SIGUSR1}))
    assert out.code == 0 and out.state is not None
    assert out.run is not None and out.run.step == TOTAL
    run_dir = out.run.run_dir
    assert [e["step"] for e in kinds(run_dir, "snapshot")] == [5]
    assert kinds(run_dir, "graceful_shutdown") == []
    assert json.loads((run_dir / "checkpoints" / "position.json").read_text())["step"] == 5
    assert status(run_dir)["status"] == "completed"
    assert isinstance(out.run.last_pause_s, float) and out.run.last_pause_s >= 0


class Probe:
    """A tracked object whose state_dict() can send a signal: one arriving while the snapshot
    copies the state."""

    def __init__(self) -> None:
        self.armed: signal.Signals | None = None
        self.copies = 0

    def state_dict(self) -> dict[str, int]:
        self.copies += 1
        if self.armed is not None:
            os.kill(os.getpid(), self.armed)
        return {"copies": self.copies}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.copies = state["copies"]


def test_second_stop_signal_during_the_copy_is_one_snapshot(tmp_path: Path) -> None:
    probe = Probe()

    def hook(run: ResumableRun, step: int) -> None:
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            probe.armed = signal.SIGTERM

    out = tv.train(tmp_path, before_commit=hook, extra_objects={"probe": probe})
    assert out.code == 42
    assert probe.copies == 1
    assert out.run is not None
    run_dir = out.run.run_dir
    assert [e["step"] for e in kinds(run_dir, "snapshot")] == [4]
    assert len(kinds(run_dir, "graceful_shutdown")) == 1
    assert status(run_dir)["resubmit_count"] == 1
    again = tv.train(tmp_path, extra_objects={"probe": Probe()})
    assert again.code == 0 and again.position == Position(4, 0, 4)


def test_second_stop_signal_during_the_save_is_one_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = state_module.save_image
    saves: list[str] = []

    def slow_save(image: Any, path: Path, scratch: Path) -> None:
        saves.append(threading.current_thread().name)
        # From the background thread, while the main thread waits for the upload to finish.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        real_save(image, path, scratch)

    monkeypatch.setattr(state_module, "save_image", slow_save)
    out = tv.train(tmp_path, before_commit=send_at({7: signal.SIGTERM}))
    monkeypatch.undo()
    assert out.code == 42
    assert saves == ["rp-snapshots"]
    assert out.run is not None
    run_dir = out.run.run_dir
    assert [e["step"] for e in kinds(run_dir, "snapshot")] == [7]
    (shutdown,) = kinds(run_dir, "graceful_shutdown")
    assert shutdown["upload_finished"] is True
    assert tv.train(tmp_path).position == Position(7, 1, 1)


def test_signal_during_a_background_save_is_handled_at_the_next_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = state_module.save_image
    sent = threading.Event()

    def slow_save(image: Any, path: Path, scratch: Path) -> None:
        if not sent.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            sent.set()
            # Still saving step 3 while the main thread commits step 4.
            time.sleep(0.3)
        real_save(image, path, scratch)

    def hook(run: ResumableRun, step: int) -> None:
        if step == 4:
            assert sent.wait(30)

    monkeypatch.setattr(state_module, "save_image", slow_save)
    config = tv.config_with(**{"train.snapshot_every": 3})
    out = tv.train(tmp_path, config=config, before_commit=hook)
    monkeypatch.undo()
    assert out.code == 0
    assert out.run is not None
    run_dir = out.run.run_dir
    steps = [e["step"] for e in kinds(run_dir, "snapshot")]
    assert steps[:3] == [3, 4, 6]
    assert steps == sorted({3, 4, *range(3, TOTAL + 1, 3)})
    assert kinds(run_dir, "snapshot_failed") == []
    assert json.loads((run_dir / "checkpoints" / "position.json").read_text())["step"] == TOTAL


def worker_pids(pid_dir: Path) -> list[int]:
    workers = [int(p.name) for p in pid_dir.iterdir()]
    assert len(workers) == 2 and os.getpid() not in workers
    return workers


def loads(pid_dir: Path, pid: int) -> int:
    return len((pid_dir / str(pid)).read_text().splitlines())


WORKERS = {"num_workers": 2, "multiprocessing_context": "fork"}


def kill_from_outside(signum: signal.Signals, *pids: int) -> None:
    """Send a signal from another process, as a scheduler does: torch's DataLoader workers
    treat a SIGTERM from their parent (this process) as a shutdown, and only that."""
    subprocess.run(
        [sys.executable, "-c", "import os, sys; [os.kill(int(p), int(sys.argv[1])) for p in "
         "sys.argv[2:]]", str(int(signum)), *map(str, pids)],
        check=True,
        timeout=60,
    )  # fmt: skip


def test_forked_dataloader_workers_ignore_the_signals(tmp_path: Path) -> None:
    pid_dir, inits = tmp_path / "pids", tmp_path / "inits"
    pid_dir.mkdir()
    inits.mkdir()
    config = tv.config_with(epochs=1)
    loaded_when_signalled: dict[int, int] = {}

    def hook(run: ResumableRun, step: int) -> None:
        if step == 1:
            workers = worker_pids(pid_dir)
            for pid in workers:
                loaded_when_signalled[pid] = loads(pid_dir, pid)
            kill_from_outside(signal.SIGUSR1, *workers)
            kill_from_outside(signal.SIGTERM, *workers)
            # Time for the workers to take the signals before they load more batches.
            time.sleep(0.3)

    def user_init(worker_id: int) -> None:
        (inits / str(worker_id)).touch()

    out = tv.train(
        tmp_path / "runs",
        config=config,
        data=tv.IndexedData(config, pid_dir=pid_dir),
        loader_kwargs={**WORKERS, "worker_init_fn": user_init},
        before_commit=hook,
    )
    # A worker that died of a signal would have failed the DataLoader.
    assert out.code == 0
    assert sorted(out.seen) == list(range(config["data"]["samples"]))
    assert len(loaded_when_signalled) == 2
    assert all(loads(pid_dir, pid) > n for pid, n in loaded_when_signalled.items())
    assert out.run is not None
    assert kinds(out.run.run_dir, "snapshot") == []
    assert status(out.run.run_dir)["last_signal"] is None
    # The run's worker setup runs the user's worker_init_fn too.
    assert sorted(p.name for p in inits.iterdir()) == ["0", "1"]


def test_sigterm_to_the_whole_job_with_workers_stops_and_resumes(tmp_path: Path) -> None:
    config = tv.config_with(epochs=1)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def hook(run: ResumableRun, step: int) -> None:
        if step == 3:
            # What a scheduler does at preemption: the whole job gets it, workers included.
            kill_from_outside(signal.SIGTERM, *worker_pids(pid_dir), os.getpid())

    data = tv.IndexedData(config, pid_dir=pid_dir)
    first = tv.train(
        tmp_path / "runs", config=config, data=data, loader_kwargs=WORKERS, before_commit=hook
    )
    assert first.code == 42
    assert first.run is not None and first.run.position == Position(3, 0, 3)
    second = tv.train(tmp_path / "runs", config=config, data=data, loader_kwargs=WORKERS)
    reference = tv.train(tmp_path / "reference", config=config)
    assert second.code == 0 and second.state is not None and reference.state is not None
    assert first.seen + second.seen == reference.seen
    tv.assert_same_state(reference.state, second.state)


# -- the real process path ---------------------------------------------------------------


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "restorepoint.testing.trainer", *args]


def trainer_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SUBMITIT_PREEMPT_SIGNAL"}


def test_trainer_subprocess_sigterm_exits_42_and_resumes(tmp_path: Path) -> None:
    root, store = tmp_path / "runs", f"{tmp_path / 'store'}/"
    common = ("--root", str(root), "--out", str(tmp_path / "final.pt"), "--epochs", "1")
    child = subprocess.Popen(
        trainer(*common, "--store", store, "--step-delay", "0.05"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=trainer_env(),
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.strip() == "step 5":
                child.send_signal(signal.SIGTERM)
                break
        rest, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 42, err
    (run_dir,) = root.iterdir()
    doc = status(run_dir)
    assert (doc["status"], doc["resubmit_count"], doc["last_signal"]) == ("preempted", 1, "SIGTERM")
    (shutdown,) = kinds(run_dir, "graceful_shutdown")
    assert shutdown["step"] == doc["step"] >= 5
    assert rest.split() == [] or rest.split()[-1] == str(doc["step"])
    assert (run_dir / "checkpoints" / "last.pt").exists()
    (uploaded,) = kinds(run_dir, "uploaded")
    assert uploaded["step"] == doc["step"]
    assert [e.step for e in list_store(store, run=run_dir.name)] == [doc["step"]]
    assert not (tmp_path / "final.pt").exists()

    again = subprocess.run(
        trainer(*common, "--quiet"),
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_env(),
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert f"resumed from checkpoint: global step {doc['step']}" in again.stderr
    done = status(run_dir)
    assert (done["status"], done["resubmit_count"], done["step"]) == ("completed", 1, 32)
    assert (tmp_path / "final.pt").exists()


def test_resubmit_limit_fails_the_second_preemption(tmp_path: Path) -> None:
    first = tv.train(tmp_path, stop_at=3, max_resubmit_attempts=1)
    assert first.code == 42 and first.run is not None
    run_dir = first.run.run_dir
    doc = status(run_dir)
    assert (doc["status"], doc["resubmit_count"], doc["max_resubmit_attempts"]) == (
        "preempted",
        1,
        1,
    )
    second = tv.train(tmp_path, stop_at=8, stop_how="signal", max_resubmit_attempts=1)
    assert second.code == 1
    assert second.position == Position(3, 0, 3)
    doc = status(run_dir)
    assert (doc["status"], doc["resubmit_count"], doc["step"]) == ("failed", 2, 8)
    assert "resubmit limit 1" in doc["error"]
    # The state is saved even so: nothing trained is lost.
    assert json.loads((run_dir / "checkpoints" / "position.json").read_text())["step"] == 8
    assert [e["resubmit_count"] for e in kinds(run_dir, "graceful_shutdown")] == [1, 2]


def test_the_resubmit_count_travels_with_the_restore_point(tmp_path: Path) -> None:
    """Preempted on machine A (resubmit 1 of 1), resumed on machine B from the store alone: B
    starts from the restore point's count, so its preemption is the second and fails."""
    store = f"{tmp_path / 'store'}/"
    first = tv.train(tmp_path / "a", store=store, stop_at=3, max_resubmit_attempts=1)
    assert first.code == 42 and first.run is not None
    (entry,) = list_store(store)
    assert restorepoint.read_manifest(entry.url).payload is not None
    second = tv.train(
        tmp_path / "b", store=store, stop_at=8, stop_how="signal", max_resubmit_attempts=1
    )
    assert second.code == 1
    assert second.run is not None
    doc = status(second.run.run_dir)
    assert (doc["status"], doc["resubmit_count"]) == ("failed", 2)
    assert "resubmit limit 1" in doc["error"]


def test_a_stop_waits_for_the_upload_once_within_upload_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from restorepoint.runtime import publish as runtime_publish

    release = threading.Event()
    real_publish = runtime_publish.publish

    def stuck_publish(*args: Any, **kwargs: Any) -> Any:
        # Held until released, or until the publish is given up (its progress hook then
        # raises at the first chunk).
        token = kwargs.get("progress")
        for _ in range(3000):
            if release.wait(0.02) or (token is not None and token.asked):
                break
        return real_publish(*args, **kwargs)

    timeouts: list[float | None] = []
    real_wait = ResumableRun.wait

    def spy_wait(self: ResumableRun, timeout: float | None = None) -> bool:
        timeouts.append(timeout)
        return real_wait(self, timeout)

    monkeypatch.setattr(runtime_publish, "publish", stuck_publish)
    monkeypatch.setattr(ResumableRun, "wait", spy_wait)
    store = f"{tmp_path / 'store'}/"
    try:
        # The thread's publish, whose ``publish`` is held here (the publish process's twin
        # is in test_publish_process.py).
        out = tv.train(
            tmp_path / "runs", store=store, stop_at=4, upload_timeout=0.3, background="thread"
        )
    finally:
        release.set()
    assert out.code == 42 and out.run is not None
    run_dir = out.run.run_dir
    (shutdown,) = kinds(run_dir, "graceful_shutdown")
    assert shutdown["upload_finished"] is False
    assert [e["step"] for e in kinds(run_dir, "upload_abandoned")] == [4]
    assert status(run_dir)["status"] == "preempted"
    assert (run_dir / "checkpoints" / "last.pt").exists()
    # The stop's wait took the whole timeout; leaving the context only what was left of it,
    # and then, the upload given up, the time for it to end (at its first chunk).
    first, second, third = timeouts
    assert first == 0.3 and second is not None and second < first and third == RELEASE_S
    # Given up as the run was left: the stop's snapshot is the tracked state's own memory,
    # which nothing reads once the run is left. Nothing of it reaches the store.
    assert real_wait(out.run, 60)
    assert list_store(store) == []
    (failed,) = kinds(run_dir, "upload_failed")
    assert failed["step"] == 4 and "given up" in failed["error"]


# -- failed uploads ----------------------------------------------------------------------


def check_failed_uploads(out: tv.Outcome, error_class: str) -> None:
    assert out.code == 0 and out.state is not None
    assert out.run is not None and out.run.step == TOTAL
    run_dir = out.run.run_dir
    failed = [e["step"] for e in kinds(run_dir, "upload_failed")]
    # A snapshot still waiting while the previous one uploads is replaced by the newer one, so
    # some may never be tried; the last one (the state at completion, step 18) always is.
    assert failed == sorted(set(failed)) and set(failed) <= {5, 10, 15, TOTAL}
    assert failed[-1] == TOTAL
    assert {e["error_class"] for e in kinds(run_dir, "upload_failed")} == {error_class}
    assert kinds(run_dir, "uploaded") == []
    assert [(u["ok"], u["step"]) for u in out.run.uploads] == [(False, s) for s in failed]
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert status(run_dir)["status"] == "completed"
    pauses = [e["pause_s"] for e in kinds(run_dir, "snapshot")]
    assert len(pauses) == 4  # three periodic snapshots and the final one
    assert isinstance(out.run.last_pause_s, float)
    assert round(out.run.last_pause_s, 6) == pauses[-1]


def test_upload_to_a_store_that_is_a_file_fails_and_training_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"a regular file where the store should be\n")
    config = tv.config_with(**{"train.snapshot_every": 5})
    out = tv.train(tmp_path / "runs", config=config, store=f"{blocker}/")
    check_failed_uploads(out, "StorageError")
    assert blocker.read_bytes() == b"a regular file where the store should be\n"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_upload_to_an_unreachable_s3_store_fails_and_training_goes_on(
    tmp_path: Path, s3_options_factory: Any
) -> None:
    pytest.importorskip("s3fs", reason="the S3 store needs s3fs")
    options = s3_options_factory(
        f"http://127.0.0.1:{_closed_port()}",
        connect_timeout=1,
        read_timeout=1,
        retries={"max_attempts": 1},
    )
    config = tv.config_with(**{"train.snapshot_every": 5})
    store = "s3://rp-unreachable/runs/"
    # Resuming needs the store: an unreachable one is refused, not taken for an empty one (a
    # restart from scratch would publish older steps over a newer restore point).
    refused = tmp_path / "refused"
    with pytest.raises(StorageUnavailable):
        tv.train(refused, config=config, store=store, storage_options=options)
    (run_dir,) = refused.iterdir()
    assert status(run_dir)["status"] == "failed"
    out = tv.train(
        tmp_path / "runs", config=config, store=store, storage_options=options, auto_resume=False
    )
    check_failed_uploads(out, "StorageUnavailable")


# -- the background thread's priority ----------------------------------------------------------


def packs_with_priority(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (step, nice of the calling thread) for every pack the run starts."""
    from restorepoint.runtime import publish as runtime_publish

    seen: list[tuple[int, int]] = []
    real_publish = runtime_publish.publish

    def spy_publish(*args: Any, **kwargs: Any) -> Any:
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen.append((args[2].position.step, nice))  # publish(source, store, head, options)
        return real_publish(*args, **kwargs)

    monkeypatch.setattr(runtime_publish, "publish", spy_publish)
    return seen


def every(steps: int) -> dict[str, Any]:
    config = json.loads(json.dumps(tv.CONFIG))
    config["train"]["snapshot_every"] = steps
    return config


def worker_nice(found: list[int]) -> tv.Hook:
    """A before_commit hook that records the background thread's nice value at step 3."""

    def hook(run: ResumableRun, step: int) -> None:
        native_id = run.worker.native_id
        if step == 3 and native_id is not None:
            found.append(os.getpriority(os.PRIO_PROCESS, native_id))

    return hook


def stopped_at_12(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **run_kwargs: Any
) -> tuple[tv.Outcome, list[tuple[int, int]], list[int], str]:
    """A run with snapshots every 5 steps, stopped before committing step 12: its outcome,
    (step, nice) of every pack it started, the background thread's nice at step 3, the store."""
    seen = packs_with_priority(monkeypatch)
    before: list[int] = []
    store = f"{tmp_path / 'store'}/"
    out = tv.train(
        tmp_path / "runs",
        config=every(5),
        store=store,
        stop_at=12,
        before_commit=worker_nice(before),
        background="thread",  # the packs are seen on the thread (the process's twin: its own)
        **run_kwargs,
    )
    assert out.code == 42 and out.run is not None
    return out, seen, before, store


def test_the_background_runs_at_low_priority_and_a_stop_publishes_at_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("raising a thread's priority back needs root (or RLIMIT_NICE)")
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    low = min(19, base + DEFAULT_NICE)
    _, seen, before, _ = stopped_at_12(tmp_path, monkeypatch)
    assert before == [low]
    # The stop's pack runs at full priority. A periodic pack that started before the stop ran
    # low, one that started after it (training outran the background) full: once given back,
    # the priority stays.
    assert seen[-1] == (12, base), seen
    nices = [nice for _, nice in seen]
    assert set(nices) <= {low, base} and nices == sorted(nices, reverse=True), seen
    # The main thread (training) was never lowered.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_without_privilege_the_stop_still_publishes_at_low_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unprivileged process may lower a thread's priority but not raise it again."""
    real = os.setpriority

    def unprivileged(which: int, who: int, prio: int) -> None:
        if prio < os.getpriority(which, who):
            raise PermissionError(13, "Permission denied")
        real(which, who, prio)

    monkeypatch.setattr(os, "setpriority", unprivileged)
    low = min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + DEFAULT_NICE)
    out, seen, before, store = stopped_at_12(tmp_path, monkeypatch)
    assert before == [low]
    assert len(seen) >= 2 and {nice for _, nice in seen} == {low}, seen
    assert out.run is not None
    (shutdown,) = kinds(out.run.run_dir, "graceful_shutdown")
    assert shutdown["upload_finished"] is True
    assert 12 in [e.step for e in list_store(store)]


def test_background_nice_none_keeps_the_training_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    _, seen, before, _ = stopped_at_12(tmp_path, monkeypatch, background_nice=None)
    assert before == [base]
    assert len(seen) >= 2 and {nice for _, nice in seen} == {base}, seen


def test_the_last_pt_write_runs_lowest_beside_training_and_a_stop_raises_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishing on the background thread (``background="thread"``; with a publish process
    the child writes the file: test_publish_process.py), the thread that writes ``last.pt``
    beside a periodic publish runs at nice 19 (its copy would otherwise take the training
    thread's core); a stop raises a write in flight to the training priority, and the stop's
    own write starts there."""
    if os.geteuid() != 0:
        pytest.skip("raising a thread's priority back needs root (or RLIMIT_NICE)")
    from restorepoint.runtime import publish as runtime_publish

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    stopped = threading.Event()
    real_unthrottle = runtime_publish.Publisher.unthrottle

    def unthrottle(self: Any) -> None:
        real_unthrottle(self)
        stopped.set()

    saves: list[tuple[int, int]] = []  # (nice at the start, nice after the stop's unthrottle)
    began = threading.Event()
    real_save = runtime_publish.save_image

    def save(image: Any, target: Path, scratch: Path) -> None:
        me = threading.get_native_id()
        first = os.getpriority(os.PRIO_PROCESS, me)
        if not began.is_set():  # the first periodic write: held until the stop's unthrottle
            began.set()
            assert stopped.wait(60)
        saves.append((first, os.getpriority(os.PRIO_PROCESS, me)))
        real_save(image, target, scratch)

    monkeypatch.setattr(runtime_publish.Publisher, "unthrottle", unthrottle)
    monkeypatch.setattr(runtime_publish, "save_image", save)
    store = f"{tmp_path / 'store'}/"
    out = tv.train(
        tmp_path / "runs", config=every(5), store=store, stop_at=12, background="thread",
        # Step 5's write under way before training goes on (not coalesced into the stop's).
        before_commit=lambda run, step: began.wait(60) if step == 6 else None,
    )  # fmt: skip
    assert out.code == 42
    # The periodic write at 19, raised by the stop; the stop's own at the training priority.
    assert saves[0] == (19, base), saves
    assert saves[-1] == (base, base), saves
    assert max(e.step for e in list_store(store)) == 12
