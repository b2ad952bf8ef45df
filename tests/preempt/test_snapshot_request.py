"""A run directory is hostile input to ``restorepoint snapshot`` (docs/preempt.md,
"restorepoint snapshot"): a ``trainer.json`` or an ``events.jsonl`` crafted to make it signal
what it must not is refused with one line and exit 2 or 4, never 70, and none of the target
processes (all started here, each recording every signal it gets) receives any signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint._posix import Disposition, process_start_time, signal_disposition

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="the checks read /proc"
)

#: The same in the shell, for another user (who may not read this Python).
SHELL_RECORDER = (
    "trap 'echo 10' USR1; trap 'echo 12' USR2; trap 'echo 15' TERM; trap 'echo 2' INT; "
    "trap 'echo 1' HUP; echo up; while :; do sleep 0.05; done"
)

#: A process that catches the signals a hostile record could name and prints each one it
#: gets; one that is sent SIGKILL or SIGSTOP shows it by its state.
RECORDER = """
import signal, sys, time
def got(signum, frame):
    sys.stdout.write(f"{signum}\\n"); sys.stdout.flush()
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
          signal.SIGRTMIN):
    signal.signal(s, got)
sys.stdout.write("up\\n"); sys.stdout.flush()
while True:
    time.sleep(0.05)
"""


class Target:
    """A process started by the test: what signals it got, and whether it is alive."""

    def __init__(self, argv: list[str], preexec: Callable[[], None] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
        self.recording = argv[0] in (sys.executable, "sh")
        if self.recording:
            assert self.proc.stdout is not None
            assert self.proc.stdout.readline() == "up\n"
        self.pid = self.proc.pid
        started = process_start_time(self.pid)
        assert started is not None
        self.start_time = started

    def received(self) -> list[str]:
        """Every signal number it printed (ended first, so that all it printed is read)."""
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=30)
        return [line for line in out.splitlines() if line]

    def untouched(self) -> bool:
        """Alive, and nothing pending (a signal it does not catch would be its death)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return (
            self.proc.poll() is None
            and int(fields["SigPnd"], 16) == 0
            and int(fields["ShdPnd"], 16) == 0
            and not fields["State"].strip().startswith(("T", "Z"))
        )


@pytest.fixture
def targets() -> Iterator[list[Target]]:
    started: list[Target] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
        t.proc.communicate(timeout=30)


def recorder(targets: list[Target], preexec: Callable[[], None] | None = None) -> Target:
    t = Target([sys.executable, "-c", RECORDER], preexec)
    targets.append(t)
    return t


def record(run_dir: Path, **doc: Any) -> None:
    (run_dir / "trainer.json").write_text(json.dumps(doc))


def refused(run_dir: Path, code: int, *args: str) -> str:
    proc = cli("snapshot", str(run_dir), *args, timeout=30)
    assert proc.returncode == code, proc.stderr
    return one_error_line(proc)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("snapshot_signal", 9, "SIGKILL is not a snapshot signal"),
        ("snapshot_signal", "15", "snapshot_signal is not an integer"),
        ("snapshot_signal", True, "snapshot_signal is not an integer"),
        ("snapshot_signal", 0, "is not a snapshot signal"),
        ("snapshot_signal", -1, "is not a snapshot signal"),
        ("snapshot_signal", 65, "is not a snapshot signal"),
        ("snapshot_signal", int(signal.SIGTERM), "SIGTERM is not a snapshot signal"),
        ("snapshot_signal", int(signal.SIGUSR2), "SIGUSR2 is not a snapshot signal"),
        ("pid", "float", "pid is not an integer"),
        ("pid", "string", "pid is not an integer"),
        ("pid", 0, "is not a process id"),
        ("pid", -1, "is not a process id"),
    ],
)
def test_a_record_naming_what_is_not_a_snapshot_request_is_exit_2(
    tmp_path: Path, targets: list[Target], field: str, value: Any, says: str
) -> None:
    t = recorder(targets)
    doc: dict[str, Any] = {"pid": t.pid, "start_time": t.start_time, "snapshot_signal": 10}
    doc[field] = {"float": t.pid + 0.9, "string": str(t.pid)}.get(value, value)
    record(tmp_path, **doc)
    assert says in refused(tmp_path, 2)
    assert t.untouched()
    assert t.received() == []


def test_the_good_record_is_the_one_signal_sent(tmp_path: Path, targets: list[Target]) -> None:
    """The control: the same recorder with a sound record gets exactly one SIGUSR1."""
    t = recorder(targets)
    record(tmp_path, pid=t.pid, start_time=t.start_time, snapshot_signal=int(signal.SIGUSR1))
    proc = cli("snapshot", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"snapshot requested from pid {t.pid}"
    assert t.received() == [str(int(signal.SIGUSR1))]


def test_a_process_that_does_not_catch_the_signal_is_never_sent_it(
    tmp_path: Path, targets: list[Target]
) -> None:
    sleeper = Target(["sleep", "120"])
    targets.append(sleeper)
    record(tmp_path, pid=sleeper.pid, start_time=sleeper.start_time)
    line = refused(tmp_path, 2)
    assert "this trainer does not handle the snapshot signal" in line
    # --pid is the same request: the same check, the same refusal.
    proc = cli("snapshot", "--pid", str(sleeper.pid))
    assert proc.returncode == 2
    assert "this trainer does not handle the snapshot signal" in one_error_line(proc)
    assert sleeper.untouched()


def test_a_supervisor_whose_trainer_does_not_catch_it_is_not_asked(
    tmp_path: Path, targets: list[Target]
) -> None:
    """trainer.json naming a supervisor (which would pass the request on) and its trainer: the
    trainer must catch its signal too, or neither is signalled."""
    supervisor = recorder(targets)
    trainer = Target(["sleep", "120"])
    targets.append(trainer)
    record(
        tmp_path, pid=supervisor.pid, start_time=supervisor.start_time,
        snapshot_signal=int(signal.SIGUSR1), trainer_pid=trainer.pid,
        trainer_start_time=trainer.start_time, trainer_signal=int(signal.SIGUSR1),
    )  # fmt: skip
    assert "this trainer does not handle the snapshot signal" in refused(tmp_path, 2)
    assert trainer.untouched()
    assert supervisor.received() == []


@pytest.mark.skipif(os.getuid() != 0, reason="starting another user's process needs root")
def test_another_users_process_is_refused_even_as_root(
    tmp_path: Path, targets: list[Target]
) -> None:
    def nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    t = Target(["sh", "-c", SHELL_RECORDER], nobody)
    targets.append(t)
    # It catches SIGUSR1: only the owner check can refuse it.
    assert signal_disposition(t.pid, signal.SIGUSR1) is Disposition.CAUGHT
    record(tmp_path, pid=t.pid, start_time=t.start_time, snapshot_signal=int(signal.SIGUSR1))
    assert "another user's process" in refused(tmp_path, 4)
    proc = cli("snapshot", "--pid", str(t.pid))
    assert proc.returncode == 4
    assert "another user's process" in one_error_line(proc)
    assert t.untouched()
    assert t.received() == []


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(3 << 29)  # 1.5 GiB, sparse


@pytest.mark.parametrize("make", [_fifo, _directory, _huge], ids=["fifo", "directory", "huge"])
def test_a_trainer_json_that_is_not_a_small_regular_file_is_exit_2(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    make(tmp_path / "trainer.json")
    line = refused(tmp_path, 2)  # and at once: a FIFO is never waited on
    assert "trainer.json" in line


@pytest.mark.parametrize("make", [_fifo, _directory, _huge], ids=["fifo", "directory", "huge"])
def test_an_events_file_that_cannot_be_waited_on_is_refused_before_any_signal(
    tmp_path: Path, targets: list[Target], make: Callable[[Path], None]
) -> None:
    t = recorder(targets)
    record(tmp_path, pid=t.pid, start_time=t.start_time, snapshot_signal=int(signal.SIGUSR1))
    make(tmp_path / "events.jsonl")
    assert "events.jsonl" in refused(tmp_path, 2, "--wait", "2")
    assert t.untouched()
    assert t.received() == []
