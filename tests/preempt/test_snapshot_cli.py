"""``restorepoint snapshot RUN_DIR``: a snapshot request to a running restorepoint.torch trainer
(its trainer.json), and the one-line failures when there is no trainer to ask."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clirun import cli, one_error_line

from .test_supervisor import RUN_ID, STEPS, clean_env, events, status, trainer, up

WAIT = 60.0


def test_snapshot_of_a_running_trainer_and_training_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_dir = root / RUN_ID
    proc = subprocess.Popen(trainer(root, tmp_path / "final.pt"), env=clean_env())
    try:
        up(run_dir)
        first = cli("snapshot", str(run_dir))
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"snapshot requested from pid {proc.pid}"
        deadline = time.monotonic() + WAIT
        while not events(run_dir, "snapshot"):
            assert time.monotonic() < deadline, "no snapshot event"
            time.sleep(0.05)
        waited = cli("snapshot", str(run_dir), "--wait", "30", "--json")
        assert waited.returncode == 0, waited.stderr
        doc = json.loads(waited.stdout)
        snapshots = events(run_dir, "snapshot")
        assert len(snapshots) == 2
        assert doc == {"ok": True, "pid": proc.pid, "step": snapshots[-1]["step"]}
        assert snapshots[0]["step"] <= doc["step"] < STEPS
        assert proc.wait(WAIT) == 0  # training went on to the end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status(run_dir) == "completed"
    assert events(run_dir, "graceful_shutdown") == []
    assert json.loads((run_dir / "run_status.json").read_text())["step"] == STEPS
    assert not (run_dir / "trainer.json").exists()  # removed on exit


def test_no_trainer_json_is_exit_4(tmp_path: Path) -> None:
    for args in ([], ["--wait", "5"], ["--json"]):
        proc = cli("snapshot", str(tmp_path), *args)
        assert proc.returncode == 4
        assert "no running trainer reported in this run directory" in one_error_line(proc)


def write_record(run_dir: Path, pid: int, start_time: int | None = None) -> None:
    doc = {"pid": pid, "snapshot_signal": int(signal.SIGUSR1)}
    if start_time is not None:
        doc["start_time"] = start_time
    (run_dir / "trainer.json").write_text(json.dumps(doc))


def test_dead_pid_is_exit_4(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_record(tmp_path, gone.pid)
    proc = cli("snapshot", str(tmp_path))
    assert proc.returncode == 4
    assert f"the trainer (pid {gone.pid}) is not running" in one_error_line(proc)
    as_json = cli("snapshot", str(tmp_path), "--json")
    assert as_json.returncode == 4
    one_error_line(as_json)
    assert json.loads(as_json.stdout)["error"]["class"] == "NotFound"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to tell")
def test_pid_reused_since_trainer_json_is_exit_4_and_not_signalled(tmp_path: Path) -> None:
    """A stale trainer.json (its trainer was killed) whose pid is another process's now (its
    start time differs from the one recorded): that process must not get SIGUSR1 (it would
    die of it)."""
    from restorepoint._posix import process_start_time

    other = subprocess.Popen(["sleep", "60"])
    try:
        started = process_start_time(other.pid)
        assert started is not None
        write_record(tmp_path, other.pid, started - 100)
        proc = cli("snapshot", str(tmp_path))
        assert proc.returncode == 4
        assert "another process's now" in one_error_line(proc)
        write_record(tmp_path, other.pid)  # no start time: cannot tell
        proc = cli("snapshot", str(tmp_path))
        assert proc.returncode == 4
        assert "records no start time" in one_error_line(proc)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_unreadable_trainer_json_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "trainer.json").write_text("{not json")
    proc = cli("snapshot", str(tmp_path))
    assert proc.returncode == 2
    assert "unreadable trainer.json" in one_error_line(proc)
