"""The snapshot worker: a background thread that saves, packs and publishes snapshots while
training goes on, one at a time; a newer snapshot replaces one still waiting (coalesced).

On a small machine the pack must leave the training thread a core: the thread runs at
``nice`` levels below the training thread (the pack threads it starts inherit it; measured on
2 cores in benchmarks/bench_torch.py: a 27 to 33% step-time slowdown became 10% or less), and
a stop request, which makes training wait for the publish, gives it the process's priority
back where the process may raise it (root, or RLIMIT_NICE).

The default is a CPU share, not the lowest priority there is (``DEFAULT_NICE``): the kernel
weighs a thread at nice +10 at 110 against 1024 for one at nice 0, so wherever the background
competes with a training thread for a core it takes at most about a tenth of that core, and
wherever other processes keep every core busy it still gets about a tenth of what each of
them gets. At nice +19 (weight 15) it got a seventh of that: on a loaded
machine a 1 GiB publish took minutes (docs/performance.md).

The nice level shares the cores; the GIL is shared by the interpreter's switch interval. A
thread that wants the GIL while another runs Python waits until the interval (5 ms by
default) has passed, and the publish's threads run a little Python between their GIL-free
calls (hashing, compression, writes): beside a 1 GiB publish the training thread waited for
it 8.0% of a step (the median of eight rounds). While it handles a snapshot, the worker
lowers the process's switch interval to ``SWITCH_INTERVAL`` (where it is higher), and puts
the previous one back after, unless something else changed it meanwhile: the same publish
then cost the training thread 4.3% (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .._posix import set_thread_nice, thread_nice
from ..format import Position

log = logging.getLogger("restorepoint")

__all__ = ["DEFAULT_NICE", "SWITCH_INTERVAL", "Snapshot", "SnapshotWorker"]

#: The background thread's nice levels below the training thread, by default.
DEFAULT_NICE = 10
#: The interpreter's switch interval (seconds) while a snapshot is handled, by default.
SWITCH_INTERVAL = 0.0005

T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot:
    """A snapshot copied to memory: the state to save, and where training stood."""

    state: dict[str, Any]
    position: Position
    #: What the run measured for this snapshot (``commit(metrics=...)``), for the head.
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: The bytes of the state that training changes at each step, as the tracked objects
    #: tell (``state.stepped_bytes``); None: not known.
    stepped: int | None = None
    #: A stop's snapshot, whose CPU tensors are the tracked state's own (``Copies.live``):
    #: never given back to be copied into.
    live: bool = False


class SnapshotWorker(Generic[T]):
    """Runs ``handle`` for each snapshot submitted, on one background thread. ``handle`` must
    not raise (a failed snapshot never stops training): the caller records its failures."""

    def __init__(
        self,
        handle: Callable[[T], None],
        *,
        nice: int | None = DEFAULT_NICE,
        done: Callable[[T], None] | None = None,
        switch_interval: float | None = SWITCH_INTERVAL,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self._handle = handle
        #: Run first on the thread, at its priority (the publish process is started there, so
        #: that it runs at the thread's nice and dies with the thread), once the run has
        #: begun training (``begin``, or the first snapshot): not beside a resume, which has
        #: every core's work until its first step; must not raise.
        self._prepare = prepare
        self._throttled = threading.Event()
        self._begun = threading.Event()
        self._ending = False
        #: Set once ``prepare`` has run (at once without one).
        self.prepared = threading.Event()
        #: The switch interval while a snapshot is handled; None: the process's, untouched.
        self._switch = switch_interval
        #: Called with a snapshot handled when no newer one waits: nothing reads it any more,
        #: and its memory may be reused for the next.
        self._done = done
        self._nice = nice
        self._pending: queue.Queue[T | None] = queue.Queue(maxsize=1)
        # Snapshots handed over and not yet handled (a coalesced one counts once).
        self._outstanding = 0
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id if self._thread is not None else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="rp-snapshots", daemon=True)
        self._thread.start()
        self._throttle()
        self._throttled.set()

    def _throttle(self) -> None:
        """Lower the thread (started, not yet given work) by ``nice``; on Linux a nice value
        is per thread, and the pack threads it starts inherit it."""
        if not self._nice or self.native_id is None:
            return
        base = thread_nice(threading.get_native_id())
        if base is not None:
            set_thread_nice(self.native_id, min(19, base + self._nice))

    def unthrottle(self) -> None:
        """Training waits for the publish now: the thread gets this process's priority back
        where the process may raise it; where it may not, the publish keeps its low priority,
        but with training stopped it competes only with other processes."""
        if not self._nice or self.native_id is None:
            return
        base = thread_nice(threading.get_native_id())
        if base is not None:
            set_thread_nice(self.native_id, base)

    def begin(self) -> None:
        """Training has begun (a resume, if any, is over): the thread may prepare now. Called
        at every commit: after the first, one attribute read."""
        if not self._begun.is_set():
            self._begun.set()

    def submit(self, snap: T) -> None:
        self._begun.set()
        with self._cv:
            # Coalesce: a snapshot still waiting is replaced by the newer one.
            try:
                self._pending.get_nowait()
            except queue.Empty:
                self._outstanding += 1
            self._pending.put(snap)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every snapshot handed over is handled; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._outstanding == 0, timeout)

    def finish(self, timeout: float | None) -> bool:
        """Wait for what is outstanding (up to ``timeout``), then end the thread; False when
        the wait timed out (the thread is left to finish on its own, a daemon)."""
        if self._thread is None:
            return True
        if not self.wait(timeout):
            return False
        self._ending = True  # nothing to prepare for any more
        self._begun.set()
        self._pending.put(None)
        self._thread.join(timeout=5)
        self._thread = None
        return True

    def _work(self) -> None:
        if self._prepare is not None:
            self._throttled.wait()
            self._begun.wait()
            try:
                if not self._ending:
                    self._prepare()
            except Exception as exc:  # pragma: no cover - a bug; snapshots go on
                log.error("preparing the worker failed: %s: %s", type(exc).__name__, exc)
        self.prepared.set()
        while True:
            snap = self._pending.get()
            if snap is None:
                return
            try:
                with switch_interval(self._switch):
                    self._handle(snap)
            except Exception as exc:
                # A handler that raised anyway (a bug, or an error it did not expect) must not
                # end the thread: every later snapshot, and every wait on them, would hang.
                log.error(
                    "a snapshot's publish failed unexpectedly: %s: %s", type(exc).__name__, exc
                )
            finally:
                with self._cv:
                    last = self._outstanding == 1
                if last:
                    # Only when no newer snapshot waits: kept beside one that does, its memory
                    # would be a second copy of the state held while the next is published.
                    self._release(snap)
                with self._cv:
                    self._outstanding -= 1
                    self._cv.notify_all()

    def _release(self, snap: T) -> None:
        if self._done is not None:
            try:
                self._done(snap)
            except Exception as exc:  # pragma: no cover - a bug; training goes on
                log.error("releasing a snapshot failed: %s: %s", type(exc).__name__, exc)


#: The workers inside ``switch_interval`` now, and the interval to put back when the last one
#: leaves with the one it set (previous, set), under the lock.
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved: tuple[float, float] | None = None


@contextlib.contextmanager
def switch_interval(seconds: float | None) -> Any:
    """The interpreter's switch interval at most ``seconds`` while any worker is inside the
    block (None: as it is); the previous one put back when the last leaves, unless someone
    else changed it meanwhile (theirs is kept)."""
    global _switch_users, _switch_saved  # noqa: PLW0603 - one count for the process
    if seconds is None:
        yield
        return
    with _switch_lock:
        if _switch_users == 0:
            previous = sys.getswitchinterval()
            if seconds < previous:
                sys.setswitchinterval(seconds)
                # As the interpreter rounds it.
                _switch_saved = (previous, sys.getswitchinterval())
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0 and _switch_saved is not None:
                previous, ours = _switch_saved
                _switch_saved = None
                if sys.getswitchinterval() == ours:
                    sys.setswitchinterval(previous)
