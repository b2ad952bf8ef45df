"""A running external trainer: the subprocess, its output read for the ready line and the
snapshot announcements, signals forwarded to it, snapshot requests held until it is up."""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Protocol

from ..._posix import Disposition, signal_disposition
from ...errors import RestorePointError, UsageError
from ..base import Snapshot
from .log import ANSI, parse_log
from .profile import Profile

__all__ = ["Disposition", "SnapshotFiles", "TrainerProcess", "complete", "signal_disposition"]

_logger = logging.getLogger("restorepoint.adapters")


class SnapshotFiles(Protocol):
    """What a running trainer needs of its adapter: where snapshots land and which files
    are snapshots."""

    profile: Profile

    def snapshot_dir(self, workdir: Path) -> Path: ...

    def is_snapshot_file(self, name: str) -> bool: ...

    def snapshot_of(self, base: Path, name: str, step: int) -> Snapshot: ...


def complete(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_file() and st.st_size > 0


def _ignoring(signals: tuple[int, ...]) -> Callable[[], None]:
    """Run in the child between fork and exec: an ignored signal stays ignored across exec."""

    def ignore() -> None:
        for signum in signals:
            signal.signal(signum, signal.SIG_IGN)

    return ignore


class TrainerProcess:
    """A trainer subprocess started by an adapter: its output is copied to the log (and to
    ``echo``) by a reader thread, which watches it for the ready line and for snapshot
    announcements. Iterate over it for the committed snapshots as they land; the iteration
    ends when the trainer has exited and its output is read."""

    def __init__(  # noqa: PLR0913 - the process, its adapter and the loop's callbacks
        self,
        files: SnapshotFiles,
        command: list[str],
        workdir: Path,
        log: Path,
        *,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
        ignore: Sequence[int] = (),
    ) -> None:
        self.files = files
        self.profile = files.profile
        #: called with the pid once the trainer has exited and its output is read
        self.on_exit: Callable[[int], None] | None = None
        self.command = command
        self.workdir = workdir
        self.log_path = log
        self.echo = echo
        self.forward: tuple[int, ...] | None = None
        self.ready = threading.Event()
        self._pending = False
        self._events: queue.Queue[Snapshot | None] = queue.Queue()
        self._previous: dict[int, Any] = {}
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # noqa: SIM115 - closed by the reader thread
        try:
            # A session of its own: a terminal's Ctrl-C or a signal to this process group
            # reaches the trainer once, forwarded, not twice. If this process dies, the
            # trainer's next write to the broken pipe ends it.
            self.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                # signal.signal takes no lock: nothing a thread of ours holds at the fork
                # can stall the child.
                preexec_fn=_ignoring(tuple(ignore)) if ignore else None,  # noqa: PLW1509
            )
        except OSError as exc:
            self._log.close()
            raise UsageError(f"{self.profile.name}: cannot start {command[0]!r} ({exc})") from None
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, name=f"trainer-{self.pid}", daemon=True)
        self._reader.start()

    # -- output ------------------------------------------------------------------------------

    def _read(self) -> None:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        pending = b""
        # A character split across two reads is echoed whole.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._log.write(chunk)
                self._log.flush()
                if self.echo is not None:
                    self.echo.write(decoder.decode(chunk))
                    self.echo.flush()
                pending += chunk
                *lines, pending = re.split(rb"\r\n|\r|\n", pending)
                for raw in lines:
                    self._line(ANSI.sub("", raw.decode("utf-8", "replace")))
        finally:
            self._log.close()
            self.popen.stdout.close()
            self.popen.wait()
            if self.on_exit is not None:
                self.on_exit(self.pid)
            self._events.put(None)

    def _line(self, line: str) -> None:
        if not self.ready.is_set() and self.profile.ready.search(line):
            self.ready.set()
            self._deliver_pending()
        if not self.profile.committed.search(line):
            return
        # The same announcement, parsed the way newest_snapshot parses logs, then the file.
        for entry in parse_log(line + "\n", self.profile):
            base = self.files.snapshot_dir(self.workdir)
            if self.files.is_snapshot_file(entry.name) and complete(base / entry.name):
                self._events.put(self.files.snapshot_of(base, entry.name, entry.step))

    def next_snapshot(self, timeout: float | None = None) -> Snapshot | None:
        """The next committed snapshot, None once the trainer has exited and its output is
        read; TimeoutError when none came within ``timeout`` seconds."""
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no snapshot from trainer {self.pid} in {timeout} s") from None
        if item is None:
            self._events.put(None)  # every later call ends too
        return item

    def __iter__(self) -> Iterator[Snapshot]:
        while (item := self.next_snapshot()) is not None:
            yield item

    # -- control -----------------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the trainer reports itself up (False: timed out, or it exited first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.popen.poll() is not None and not self._reader.is_alive():
                return self.ready.is_set()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def request_snapshot(self) -> None:
        """Send the snapshot signal; refused (UsageError) before the trainer is up, or when
        /proc says it does not catch the signal (an upstream binary without the snapshot
        patch): the signal would kill it."""
        if self.popen.poll() is not None:
            raise UsageError(f"no trainer process {self.pid} (it exited {self.popen.returncode})")
        if not self.ready.is_set():
            raise UsageError(
                f"trainer {self.pid} has not reported itself up yet; "
                f"{self.profile.signal_name} now would kill it"
            )
        self._send_request()

    def _send_request(self) -> None:
        # The one way a snapshot request is sent (runtime.snapshot_request): the SigCgt
        # check, on the very process signalled.
        from ...runtime.snapshot_request import SnapshotTarget, request_snapshot

        sig = self.profile.snapshot_signal
        request_snapshot(SnapshotTarget(self.pid, sig, allowed=frozenset({sig})))

    def can_snapshot(self) -> bool:
        """Whether the trainer takes snapshot requests now: up, and catching the signal."""
        return (
            self.ready.is_set()
            and self.popen.poll() is None
            and signal_disposition(self.pid, self.profile.snapshot_signal) is Disposition.CAUGHT
        )

    def _deliver_pending(self) -> None:
        if self._pending:
            self._pending = False
            try:
                self._send_request()
            except RestorePointError as exc:
                # Never a signal it would die of: the request is dropped, training goes on.
                _logger.warning("snapshot request not sent: %s", exc)

    def send(self, signum: int) -> None:
        """Send any signal now (a stop signal is never held back)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(timeout)
        return code

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    # -- signal forwarding -------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        # Straight to the trainer: no lock, no wait, whatever else is going on.
        self.send(signum)

    def ask_for_snapshot(self) -> None:
        """Ask for a snapshot now if the trainer is up, else as soon as it is (the request is
        held: the signal before it handles it would kill it)."""
        self._pending = True
        if self.ready.is_set():
            self._deliver_pending()

    def _on_snapshot(self, signum: int, frame: FrameType | None) -> None:
        self.ask_for_snapshot()

    def __enter__(self) -> TrainerProcess:
        if self.forward is not None and threading.current_thread() is threading.main_thread():
            for sig in self.forward:
                self._previous[sig] = signal.signal(sig, self._on_stop)
            snap = self.profile.snapshot_signal
            self._previous[snap] = signal.signal(snap, self._on_snapshot)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            # Leaving the block early (an error, a break) stops the trainer: it must not
            # outlive the code that watches it.
            if self.popen.poll() is None:
                self.terminate()
                try:
                    self.popen.wait(30)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
            self.wait()
        finally:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous.clear()
            if self.on_exit is not None:
                self.on_exit(self.pid)
