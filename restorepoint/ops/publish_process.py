"""The publish in a process of its own: a runtime's snapshot is published from its copy in
the training process's memory by a child process, which reads that memory (Linux's
``process_vm_readv``: one copy, as the in-process publish makes) and runs the one publish,
``ops.publish``, there. Training then shares neither the interpreter's lock nor the
scheduler's view of one process with the publish: in bench_resume.py at 1 GiB, what the
publish cost a training thread (its core wait and blocked time) fell from 5.1% of a step to
2.6% on the local disk, and from 20.8% to 5.2% to S3 (docs/performance.md, "The publish in
a process of its own").

The child also writes the run directory's snapshot file where the job asks for it
(``SaveJob``: ``last.pt``, from the same memory, on a thread of its own, through
``_direct.replace_file``), so that no thread of the training process holds its GIL for it;
the job's answer says how that went, apart from the publish's.

The parent (``PublishProcess``) starts the child once and hands it one job at a time over a
pipe. Both ways the messages are JSON, data only (``_publish_wire``): no
unpickler on either side. A publish whose values JSON cannot carry (storage options holding
objects, encryption keys) is published on the parent's thread instead. The child:

- dies with its parent (``PR_SET_PDEATHSIG``: the kernel kills it when the thread that
  started it ends, a SIGKILL of the training process included), so that no publish goes on
  for a run that is gone. A publish killed midway leaves the store as it was: the publish's
  commit point is its last step (spec section 13);
- runs at its parent thread's priority (the snapshot worker's, nice +10 by default), and
  takes the process's back with a stop (``unthrottle``), where the system lets it;
- follows the store deadline the parent sets (``set_store_deadline``) while a job runs: a
  stop or a reclaim notice reaches a publish in flight;
- abandons the job in hand when the parent asks (``publish(abandon=)``, by the job's number,
  so that an ask never reaches a later job): a stop's newer snapshot supersedes a periodic
  publish that cannot land in time with it (runtime/_inflight.py);
- ignores the stop and snapshot signals, in a process group of its own in the trainer's
  session (``_BOOT``): a scheduler signals every process of a job step, and the trainer's
  stop publishes through the child;
- where it cannot read its parent's memory (a kernel or a seccomp filter that refuses
  ``process_vm_readv``), says so at its start, and the parent publishes on its own thread.

The child is ``python -c _BOOT PARENT_PID``, which ignores the stop and snapshot signals
before anything else and then runs ``_publish_child.main``; it imports no torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

import restorepoint

from .. import errors
from .._posix import allow_reader
from ..errors import RestorePointError
from ..storage import watch_store_deadline
from ._abandon import Abandon
from ._publish_child import main
from ._publish_wire import Peer, SaveJob, Unavailable, job_document, receive, send
from .publish import HeadSpec, PackOptions
from .store import KeepBest

__all__ = [
    "Peer",
    "PublishProcess",
    "RemoteResult",
    "SaveJob",
    "Unavailable",
    "available",
    "main",
]

#: How long the child may take to start and answer (its imports: about 0.3 s idle).
START_TIMEOUT = 60.0
#: The child's first statements, before any import: it ignores every signal that a scheduler
#: or a user sends a trainer to stop it or to ask for a snapshot (Slurm signals every process
#: of a job step: a SIGUSR2 or SIGTERM that killed the child would fail the very publish the
#: stop waits for), then is the leader of a process group of its own (where Popen could not
#: make it: before Python 3.11). It ends when told (``end``) or with its input, after the job
#: in hand, or with SIGKILL (its parent's death, or anyone's).
_BOOT = (
    "import signal\n"
    "for name in ('SIGHUP', 'SIGINT', 'SIGQUIT', 'SIGTERM', 'SIGUSR1', 'SIGUSR2', 'SIGALRM'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_IGN)\n"
    "for number in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):\n"
    "    signal.signal(number, signal.SIG_IGN)\n"
    "import os\n"
    "if os.getpgid(0) != os.getpid():\n"
    "    os.setpgid(0, 0)\n"
    "import sys\n"
    "from restorepoint.ops._publish_child import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


#: A process group of the child's own, made as it starts where Python can (3.11 and later).
_OWN_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {}


def available() -> bool:
    """Whether this platform has what the child needs (Linux's ``process_vm_readv``)."""
    return sys.platform.startswith("linux")


# -- the parent's side --------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteResult:
    """What the parent learns of a publish the child made (``PublishResult``'s figures)."""

    url: str
    size: int
    incremental: str | None
    reused: int | None
    choices: dict[str, Any] | None
    prune_error: RestorePointError | None


class PublishProcess:
    """The parent's handle on the child. ``start`` (from the thread that will outlive every
    job: the child dies with it), then ``publish`` one job at a time, ``close`` at the end.
    Thread-safe for ``set_deadline`` and ``unthrottle`` beside a ``publish``."""

    def __init__(self, python: str | None = None) -> None:
        self._python = python or sys.executable
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        #: A job in flight (its answer not yet read).
        self._busy = False
        #: The number of the newest job: an abandon names it, so that none reaches a later.
        self._jobs = 0
        self._unwatch: Callable[[], None] | None = None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def peak_rss(self) -> int | None:
        """The child's peak resident set so far, in bytes (None where it cannot be read)."""
        if self._child is None:
            return None
        try:
            with open(f"/proc/{self._child.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            return None
        return None

    def start(self) -> None:
        """Start the child and check that it reads this process's memory; Unavailable
        where it cannot (the child is then gone)."""
        if self._child is not None:
            return
        if not available():
            raise Unavailable("a publish in a process of its own needs Linux")
        # The child imports this very package, wherever the parent found it.
        root = os.path.dirname(os.path.dirname(os.path.abspath(restorepoint.__file__)))
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        try:
            child = subprocess.Popen(
                [self._python, "-c", _BOOT, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                env=env,
                # Not in the trainer's process group: a terminal's Ctrl-C or a kill of the
                # group is the trainer's to handle (it then publishes through the child). In
                # its session, though: where the scheduler groups each session's threads
                # (autogroup, on by default in many distributions' kernels), a session of the
                # child's own made a group that weighed as much as the whole training process,
                # whatever its threads' nice (bench_resume.py at 4 GiB, four rounds each: the
                # training thread's slowdown 4.3% against 5.9%, published in 7.55 s against
                # 8.20 s, docs/performance.md). Before Python 3.11, _BOOT makes the group.
                **_OWN_GROUP,
            )
        except OSError as exc:
            raise Unavailable(f"the publish process did not start: {exc.strerror}") from None
        allow_reader(child.pid)
        self._child = child
        # A few bytes of this process that the child must read back as they are.
        probe = bytearray(os.urandom(16))
        address = ctypes.addressof((ctypes.c_char * len(probe)).from_buffer(probe))
        try:
            answer = self._call({"kind": "hello", "probe": [address, probe.hex()]}, START_TIMEOUT)
        except Unavailable:
            self._kill()
            raise
        if not answer.get("ok"):
            self._kill()
            raise Unavailable(
                "the publish process cannot read the training process's memory: "
                + str(answer.get("error", "unknown"))
            )
        self._unwatch = watch_store_deadline(self.set_deadline)

    def publish(  # noqa: PLR0913 - ops.publish's arguments, carried to the child whole
        self,
        source: str,
        dest: str,
        head: HeadSpec,
        options: PackOptions,
        *,
        memory: Mapping[str, Peer | bytes],
        keep_last: int | None = None,
        keep_best: KeepBest | None = None,
        expect: float | None = None,
        deadline: float | None = None,
        save: SaveJob | None = None,
        abandon: Abandon | None = None,
    ) -> RemoteResult:
        """One publish in the child; the RestorePointError it raised is raised here (a
        child that died midway: RestorePointError, and the next job starts a new one). With
        ``save``, the child also writes that snapshot file, beside the publish: its outcome
        comes after the publish's (``wait_saved``), so that a restore point in the store is
        known as soon as it is there. ``abandon``: asked while the job runs, the child
        abandons this publish at its next chunk (ops/_abandon.py)."""
        self._jobs += 1
        number = self._jobs
        job = job_document(source, dest, head, options, memory, keep_last, keep_best)
        job.update(
            expect=expect, deadline=deadline, save=save.document() if save else None, id=number
        )
        self.start()
        if abandon is not None:
            abandon.check()  # asked before it began: it does not begin
            # By the job's number: the child keeps an ask that reaches it before the job.
            abandon.watch(lambda why: self._tell({"kind": "abandon", "id": number, "why": why}))
        child = self._child
        self._busy = True
        try:
            answer = self._call(job, None)
        except Unavailable as exc:
            self._kill()
            raise RestorePointError(f"the publish process ended: {exc.message}") from None
        finally:
            self._busy = False
            if child is not None and self._child is not child:
                _reap(child)  # closed while this job ran: it ends now, its input gone
        if save is not None and answer.get("saving"):
            save.pending = True
        if not answer.get("ok"):
            raise _error(answer)
        prune = answer.get("prune_error")
        return RemoteResult(
            url=str(answer["url"]),
            size=int(answer["size"]),
            incremental=answer.get("incremental"),
            reused=answer.get("reused"),
            choices=answer.get("choices"),
            prune_error=_error(prune) if prune else None,
        )

    def wait_saved(self, save: SaveJob) -> None:
        """The child's answer about ``save``, which follows its publish's: ``save.done`` and
        ``save.error``. Nothing when the child is not writing it; a child that died meanwhile
        leaves ``done`` False (the caller writes the file itself), and the next job starts a
        new one."""
        if not save.pending:
            return
        save.pending = False
        child = self._child
        if child is None:
            return
        self._busy = True
        try:
            answer = self._answer(child, None)
        except Unavailable:
            self._kill()
            return
        finally:
            self._busy = False
            if self._child is not child:
                _reap(child)
        if answer.get("kind") == "saved":
            save.done = True
            save.error = None if answer.get("ok") else _error(answer)

    def set_deadline(self, when: float | None) -> None:
        """Carry a store deadline to the child (a stop, a reclaim notice)."""
        self._tell({"kind": "deadline", "at": when})

    def unthrottle(self) -> None:
        """Training waits for the publish now: the child takes this process's priority back
        where the system lets it (its threads, one by one)."""
        with contextlib.suppress(OSError):
            self._tell({"kind": "nice", "value": os.getpriority(os.PRIO_PROCESS, 0)})

    def ping(self) -> dict[str, Any]:
        """The child's state (its deadline and priority): for tests and diagnostics."""
        return self._call({"kind": "ping"}, START_TIMEOUT)

    def close(self, timeout: float = 5.0) -> None:
        """End the child: told so and its input closed, then killed if it has not ended in
        ``timeout``. A publish still in flight (a run that left it, as an in-process publish
        is left to its daemon thread) is not waited for: the child ends after it."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        child, self._child = self._child, None
        if child is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            assert child.stdin is not None
            # Said, not only the input closed: a process forked from this one since (a data
            # loader's worker) holds the pipe open, and the child would never see its end.
            send(child.stdin, json.dumps({"kind": "end"}).encode())
        with self._lock, contextlib.suppress(OSError):
            assert child.stdin is not None
            child.stdin.close()
        if self._busy:
            return  # the job's caller reaps it once answered
        _reap(child, timeout)

    def _kill(self) -> None:
        child, self._child = self._child, None
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if child is None:
            return
        with contextlib.suppress(OSError):
            child.kill()
        _reap(child)

    def _tell(self, message: dict[str, Any]) -> None:
        child = self._child
        if child is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            assert child.stdin is not None
            send(child.stdin, json.dumps(message).encode())

    def _call(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send ``message`` and read the child's answer (JSON). One call at a time: the
        snapshot worker's thread makes them."""
        child = self._child
        if child is None:
            raise Unavailable("no publish process")
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            with self._lock:
                send(child.stdin, json.dumps(message).encode())
        except (OSError, ValueError):
            raise Unavailable(self._why_gone(child)) from None
        return self._answer(child, timeout)

    def _answer(self, child: subprocess.Popen[bytes], timeout: float | None) -> dict[str, Any]:
        """The child's next answer (JSON); Unavailable where there is none."""
        assert child.stdout is not None
        body = _receive_within(child.stdout, timeout)
        if body is None:
            raise Unavailable(self._why_gone(child))
        try:
            answer = json.loads(body)
        except ValueError:
            raise Unavailable("the publish process answered what is not JSON") from None
        if not isinstance(answer, dict):
            raise Unavailable("the publish process answered what is not an object")
        return answer

    @staticmethod
    def _why_gone(child: subprocess.Popen[bytes]) -> str:
        try:
            code = child.wait(1.0)
        except subprocess.TimeoutExpired:
            return "the publish process stopped answering"
        if code < 0:
            return f"the publish process was killed by signal {-code}"
        return f"the publish process exited with {code}"


def _reap(child: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Wait for a child whose input is closed (killed after ``timeout``), and close its
    output: no process or pipe is left to the garbage collector."""
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    for stream in (child.stdin, child.stdout):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()


def _receive_within(stream: IO[bytes], timeout: float | None) -> bytes | None:
    """A frame from ``stream``; None at its end, or after ``timeout`` seconds (then the
    caller kills the child, which ends the read left behind)."""
    if timeout is None:
        return receive(stream)
    box: list[bytes | None] = []
    reader = threading.Thread(target=lambda: box.append(receive(stream)), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else None


def _error(answer: Mapping[str, Any]) -> RestorePointError:
    """The child's error, as the class it named where that is one of ours (its message is
    data: printed through the error's own escaping, as any store's text)."""
    cls = getattr(errors, str(answer.get("class")), None)
    if not (isinstance(cls, type) and issubclass(cls, RestorePointError)) or cls is Unavailable:
        cls = RestorePointError
    url = answer.get("url")
    return cls(str(answer.get("message", "")), url=url if isinstance(url, str) else None)
