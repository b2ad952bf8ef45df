"""The runtime's part of the stop contract, seen from outside: a stop says what it did in one
stderr line (where the restore point went, or that the previous one stays the newest, or where
the local snapshot lies), leaves its stop marker, and exits 42; a completed run is not trained
again; the state at completion is published; the resubmit limit the Slurm template exports is
the trainer's; the marker rule that maps a launcher's failure back to 42."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from restorepoint.errors import IncompatibleRestorePoint  # noqa: E402
from restorepoint.ops import list_store  # noqa: E402
from restorepoint.runtime.contract import (  # noqa: E402
    MAX_RESUBMITS_ENV,
    READY_ENV,
    STOP_DEADLINE_FILE,
    STOP_DIR_ENV,
    ended_by_refusal,
    leave_stop_deadline,
    report_refusal,
    resumable_exit,
    stop_store_deadline,
    stopped_by_contract,
)
from restorepoint.storage import deadline_left  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

TOTAL = tv.total_steps()


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("SUBMITIT_PREEMPT_SIGNAL", STOP_DIR_ENV, MAX_RESUBMITS_ENV):
        monkeypatch.delenv(name, raising=False)
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
    saved = {s: signal.getsignal(s) for s in signals}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    torch.set_num_threads(threads)


def stop_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("restorepoint: stop (")]


def status(run: ResumableRun | None) -> dict[str, Any]:
    assert run is not None
    return dict(json.loads((run.run_dir / "run_status.json").read_text()))


def test_a_stop_says_where_its_restore_point_went_and_leaves_its_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store path with an escape sequence in it: printed escaped, never raw.
    store = str(tmp_path / "st\x1b[2Jore") + "/"
    stop_dir = tmp_path / "stopped"
    stop_dir.mkdir()
    monkeypatch.setenv(STOP_DIR_ENV, str(stop_dir))
    out = tv.train(tmp_path / "runs", store=store, stop_at=3, stop_how="signal")
    assert out.code == 42
    (entry,) = list_store(store)
    assert entry.step == 3
    (line,) = stop_lines(capsys.readouterr().err)
    shown = entry.url.replace("\x1b", "\\x1b")
    assert line == (
        f"restorepoint: stop (SIGTERM) at step 3: restore point published to {shown}; "
        "exiting 42 (resumable)"
    )
    assert "\x1b" not in line
    (marker,) = stop_dir.iterdir()
    assert marker.name == "stopped-0-of-1.json"
    doc = json.loads(marker.read_text())
    assert out.run is not None
    assert (doc["exit"], doc["step"], doc["rank"], doc["run"]) == (42, 3, 0, out.run.run_id)
    assert stopped_by_contract(stop_dir)


def test_a_stops_snapshot_is_the_tracked_state_not_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A periodic snapshot is a copy (training goes on and changes the state); a stop's is
    the tracked state's own memory, since training waits until the process exits: no pause
    for a copy and no second copy of the state in memory. It is published as it stands, and
    the run resumes from it bit for bit (the rest of this file and test_resume.py)."""
    from restorepoint.runtime.worker import SnapshotWorker

    seen: list[tuple[int, bool, bool]] = []
    real_submit = SnapshotWorker.submit

    def submit(self: Any, snap: Any) -> None:
        weight = snap.state["objects"]["model"]["0.weight"]
        model = out_run[0].objects["model"][0].weight
        seen.append((snap.position.step, snap.live, weight.data_ptr() == model.data_ptr()))
        real_submit(self, snap)

    out_run: list[ResumableRun] = []

    def hook(run: ResumableRun, step: int) -> None:
        out_run[:] = [run]
        if step == 3:
            run.wait()  # step 2's publish done before the stop's snapshot (not coalesced)

    monkeypatch.setattr(SnapshotWorker, "submit", submit)
    store = f"{tmp_path / 'store'}/"
    out = tv.train(
        tmp_path / "runs",
        config=tv.config_with(**{"train.snapshot_every": 2}),
        store=store,
        stop_at=3,
        before_commit=hook,
    )
    assert out.code == 42
    assert seen == [(2, False, False), (3, True, True)]
    assert sorted(e.step for e in list_store(store)) == [2, 3]


def test_the_stops_store_deadline_ends_with_the_run(tmp_path: Path) -> None:
    """A stop bounds the store's retries by its upload_timeout; once the run has exited, a
    process that goes on (a sweep, a notebook, this test suite) retries in full again."""
    assert deadline_left() is None
    out = tv.train(tmp_path / "runs", store=str(tmp_path / "store") + "/", stop_at=2)
    assert out.code == 42 and out.run is not None
    assert out.run._upload_deadline is not None  # the stop set one
    assert deadline_left() is None  # and it ended with the run


def test_a_supervisors_sooner_deadline_is_the_stops_store_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``restorepoint run`` the supervisor leaves the time it waits for the restore point
    (a termination notice's deadline less the margin) in the ready directory before its
    SIGTERM: the stop's publish aims at it (its codec, its retries) where it is sooner than
    upload_timeout, and the stop's event says so. The wait itself stays upload_timeout: the
    supervisor's SIGKILL, not the trainer, ends a publish that runs late."""
    ready = tmp_path / "ready"
    ready.mkdir()
    monkeypatch.setenv(READY_ENV, str(ready))
    leave_stop_deadline(ready, time.time() + 20.0)
    out = tv.train(tmp_path / "runs", store=str(tmp_path / "store") + "/", stop_at=2)
    assert out.code == 42 and out.run is not None
    (shutdown,) = [e for e in tv.events(out.run.run_dir) if e["event"] == "graceful_shutdown"]
    assert shutdown["deadline_from"] == "supervisor" and shutdown["upload_finished"]
    assert 0 < shutdown["store_deadline_s"] <= 20.0
    assert deadline_left() is None  # it ended with the run
    (entry,) = list_store(str(tmp_path / "store") + "/")
    assert entry.step == 2


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no file: no supervisor stopping"),
        (b'{"deadline": %d}', "later than upload_timeout"),
        (b'{"deadline": %d}', "already past"),
        (b'{"deadline": "soon"}', "not a number"),
        (b'{"deadline": true}', "a boolean"),
        (b'{"deadline": NaN}', "not finite"),
        (b'{"deadline": 1e999}', "not finite"),
        (b"[" * 3000 + b"]" * 3000, "too deep, and too large"),
        (b"[[[[1]]]]", "not an object"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"deadline": 1}' + b" " * 5000, "over the size cap"),
        ("fifo", "a FIFO, never waited on"),
        ("directory", "not a regular file"),
    ],
)
def test_a_stop_deadline_file_that_is_not_one_leaves_upload_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes | str | None, why: str
) -> None:
    """The ready directory's deadline is read as hostile: anything but a regular file of one
    finite time, ahead and sooner than upload_timeout, leaves the stop's own deadline."""
    monkeypatch.setenv(READY_ENV, str(tmp_path))
    path = tmp_path / STOP_DEADLINE_FILE
    if content == "fifo":
        os.mkfifo(path)
    elif content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        when = time.time() + (600 if why.startswith("later") else -5)
        path.write_bytes(content.replace(b"%d", str(int(when)).encode()))
    before = time.monotonic()
    deadline, theirs = stop_store_deadline(60.0)
    assert not theirs, why
    assert before + 60.0 <= deadline <= time.monotonic() + 60.0, why


def test_sigint_is_a_stop_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C, or a supervisor's or torchrun's SIGINT: the same ending as SIGTERM, and Python's
    KeyboardInterrupt handler (the one installed before) is not chained into a crash."""
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt(run: ResumableRun, step: int) -> None:
        if step == 2:
            signal.raise_signal(signal.SIGINT)

    out = tv.train(tmp_path / "runs", before_commit=interrupt)
    assert out.code == 42
    assert status(out.run)["status"] == "preempted"
    (line,) = stop_lines(capsys.readouterr().err)
    assert line.startswith("restorepoint: stop (SIGINT) at step 2: snapshot saved in ")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_store_the_stop_says_where_the_snapshot_lies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tv.train(tmp_path / "runs", stop_at=2)
    assert out.code == 42 and out.run is not None
    (line,) = stop_lines(capsys.readouterr().err)
    checkpoints = out.run.run_dir / "checkpoints"
    assert line == (
        f"restorepoint: stop (requested) at step 2: snapshot saved in {checkpoints} "
        "(no store); exiting 42 (resumable)"
    )
    assert (checkpoints / "last.pt").is_file()


def test_a_publish_that_cannot_land_in_time_keeps_the_previous_restore_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from restorepoint.runtime import publish as runtime_publish

    store = f"{tmp_path / 'store'}/"
    config = tv.config_with(**{"train.snapshot_every": 2})
    release = threading.Event()
    real_publish = runtime_publish.publish

    def stuck_after_the_first(*args: Any, **kwargs: Any) -> Any:
        # Held until released, or until leaving the run gives it up.
        token = kwargs.get("progress")
        for _ in range(3000):
            if not list_store(store) or release.wait(0.02) or (token and token.asked):
                break
        return real_publish(*args, **kwargs)

    monkeypatch.setattr(runtime_publish, "publish", stuck_after_the_first)
    try:
        out = tv.train(
            tmp_path / "runs",
            config=config,
            store=store,
            stop_at=3,
            upload_timeout=0.5,
            background="thread",  # held above (test_publish_process.py holds the process)
            # Step 2's snapshot handled before the stop's: on a loaded machine the stop's could
            # otherwise replace it while it waits (coalesced), and land as the first publish.
            before_commit=lambda run, step: run.wait() if step == 3 else None,
        )
    finally:
        release.set()
    assert out.code == 42
    (line,) = stop_lines(capsys.readouterr().err)
    assert line == (
        "restorepoint: stop (requested) at step 3: the restore point did not land within "
        "upload_timeout (0.5 s): the store's previous restore point stays the newest; "
        "exiting 42 (resumable)"
    )
    assert [e.step for e in list_store(store)] == [2]


def test_past_the_resubmit_limit_the_line_says_exit_1_and_no_marker_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit the Slurm template exports is the trainer's: one count, one bound."""
    stop_dir = tmp_path / "stopped"
    stop_dir.mkdir()
    monkeypatch.setenv(STOP_DIR_ENV, str(stop_dir))
    monkeypatch.setenv(MAX_RESUBMITS_ENV, "1")
    first = tv.train(tmp_path, stop_at=2)
    assert first.code == 42 and first.run is not None
    assert first.run.max_resubmit_attempts == 1
    (marker,) = stop_dir.iterdir()
    marker.unlink()
    second = tv.train(tmp_path, stop_at=4)
    assert second.code == 1
    assert (status(second.run)["status"], status(second.run)["resubmit_count"]) == ("failed", 2)
    lines = stop_lines(capsys.readouterr().err)
    assert lines[1].endswith("; resubmit limit 1 reached: exiting 1 (not resumable)")
    assert list(stop_dir.iterdir()) == []
    # Given to the run, the limit wins over the environment.
    assert (
        ResumableRun(tv.CONFIG, root=tmp_path / "x", max_resubmit_attempts=5).max_resubmit_attempts
        == 5
    )
    monkeypatch.setenv(MAX_RESUBMITS_ENV, "many")
    assert ResumableRun(tv.CONFIG, root=tmp_path / "x").max_resubmit_attempts is None


def test_a_completed_run_is_not_trained_again_and_its_final_state_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"{tmp_path / 'store'}/"
    config = tv.config_with(**{"train.snapshot_every": 4})
    done = tv.train(tmp_path / "runs", config=config, store=store)
    assert done.code == 0 and done.run is not None
    # The periodic snapshots and the state at completion (a final snapshot: on with a store).
    assert max(e.step for e in list_store(store)) == TOTAL
    run_dir = done.run.run_dir
    events_before = tv.events(run_dir)
    capsys.readouterr()

    again = tv.train(tmp_path / "runs", config=config, store=store)
    assert again.code == 0
    assert again.seen == [] and again.position is None  # never got as far as resume()
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"restorepoint: run {done.run.run_id} already completed at step {TOTAL} ({run_dir}): "
        "nothing to train; exiting 0"
    ]
    assert tv.events(run_dir) == events_before
    assert status(done.run)["status"] == "completed"

    # Another machine (a fresh run directory, the same store) resumes at the end: nothing is
    # trained again, and nothing is published again.
    published = sorted(e.name for e in list_store(store))
    elsewhere = tv.train(tmp_path / "machine-b", config=config, store=store)
    assert elsewhere.code == 0 and elsewhere.seen == []
    assert elsewhere.position is not None and elsewhere.position.step == TOTAL
    assert sorted(e.name for e in list_store(store)) == published
    tv.assert_same_state(elsewhere.state, done.state)

    # final_snapshot=False: only the periodic ones.
    off = tv.train(
        tmp_path / "c", config=config, store=f"{tmp_path / 'store-c'}/", final_snapshot=False
    )
    assert off.code == 0
    # (A periodic snapshot still waiting when the next comes is replaced by it.)
    steps = {e.step for e in list_store(f"{tmp_path / 'store-c'}/")}
    assert steps <= {4, 8, 12, 16} and max(steps) == 16


def test_the_marker_rule(tmp_path: Path) -> None:
    """Every local rank 0..N-1 of one N, and nothing else: a failed launcher is then 42."""
    d = tmp_path / "stop"
    d.mkdir()
    assert not stopped_by_contract(d) and resumable_exit(1, d) == 1
    (d / "stopped-0-of-2.json").write_text("{}")
    assert not stopped_by_contract(d) and resumable_exit(1, d) == 1
    (d / "stopped-1-of-2.json").write_text("{}")
    assert stopped_by_contract(d)
    assert [resumable_exit(c, d) for c in (0, 1, 42, 143)] == [0, 42, 42, 42]
    (d / "stopped-x-of-2.json").write_text("{}")
    assert not stopped_by_contract(d)
    (d / "stopped-x-of-2.json").unlink()
    (d / "stopped-2-of-3.json").write_text("{}")
    assert not stopped_by_contract(d)
    assert not stopped_by_contract(tmp_path / "missing")


def test_a_refusal_marker_keeps_exit_3_through_a_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process whose resume is refused says so in the stop directory (report_refusal), and
    a launcher's failure is then 3, unless a process stopped by the contract (42 wins)."""
    d = tmp_path / "stop"
    d.mkdir()
    monkeypatch.setenv(STOP_DIR_ENV, str(d))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv(READY_ENV, raising=False)
    report_refusal(IncompatibleRestorePoint("refused: config differs"))
    assert "restorepoint: error: refused: config differs" in capsys.readouterr().err
    assert [p.name for p in d.iterdir()] == ["refused-1-of-2.json"]
    assert json.loads((d / "refused-1-of-2.json").read_text())["exit"] == 3
    assert ended_by_refusal(d)
    assert [resumable_exit(c, d) for c in (0, 1, 3, 42, 143)] == [0, 3, 3, 42, 3]
    (d / "stopped-0-of-2.json").write_text("{}")
    assert not ended_by_refusal(d) and resumable_exit(1, d) == 1
    (d / "stopped-0-of-2.json").unlink()
    (d / "refused-x-of-2.json").write_text("{}")
    assert not ended_by_refusal(d) and resumable_exit(1, d) == 1


def test_an_unreadable_restore_point_leaves_no_refusal_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 1 (a restore point that could not be read) is not a refusal: no marker, and a
    launcher's 1 stays 1."""
    from restorepoint.errors import IntegrityError

    d = tmp_path / "stop"
    d.mkdir()
    monkeypatch.setenv(STOP_DIR_ENV, str(d))
    monkeypatch.delenv(READY_ENV, raising=False)
    report_refusal(IntegrityError("last.pt: payload digest differs"))
    assert list(d.iterdir()) == [] and resumable_exit(1, d) == 1
