"""Signals as flags: a handler does no work, it sets a flag that the training loop acts on at
its next effective-batch boundary (docs/adapters.md, "Snapshots and signals").

- a **snapshot request** (SIGUSR1 by default) snapshots and trains on;
- a **stop request** (SIGTERM, SIGINT, and ``$SUBMITIT_PREEMPT_SIGNAL`` or SIGUSR2) snapshots
  and exits with 42.

Handlers installed before are remembered, chained after the run acted on the signal (submitit's
requeue), and put back at the end. A forked DataLoader worker inherits the handler and does
nothing (the main process snapshots); ``ignore_in_worker`` is the worker's first act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from .._posix import preempt_signal

__all__ = ["SignalFlags", "default_stop_signals", "ignore_in_worker", "signal_name"]

log = logging.getLogger("restorepoint.torch")


def signal_name(signum: int) -> str:
    """SIGTERM, SIGUSR1, ...; real-time signals have no enum member (signal.Signals(40) raises,
    which inside a handler would crash the loop at the moment of preemption)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        rtmin = getattr(signal, "SIGRTMIN", None)
        if rtmin is not None and signum > rtmin:
            return f"SIGRTMIN+{signum - rtmin}"
        return f"SIG{signum}"


def default_stop_signals() -> tuple[int, ...]:
    """SIGTERM, SIGINT (Ctrl-C, and what a supervisor or torchrun passes on), and the signal
    submitit sends before preemption ($SUBMITIT_PREEMPT_SIGNAL, SIGUSR2 when unset)."""
    return tuple(dict.fromkeys((int(signal.SIGTERM), int(signal.SIGINT), preempt_signal())))


def ignore_in_worker(
    signums: tuple[int, ...], user_init: Callable[[int], None] | None, worker_id: int
) -> None:
    """First thing in a DataLoader worker: ignore the run's signals. A scheduler signals the
    whole job, workers included; the main process acts on the signal and shuts the workers
    down itself. Left alone, a worker dies of it: torch's worker SIGTERM handler exits
    unless the parent sent it, and a spawned worker has the default action for SIGUSR1/2.
    Either fails the main process's DataLoader before it reaches the boundary. Workers still
    end on their own: when the epoch's iterator is done, and when the main process dies."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    if user_init is not None:
        user_init(worker_id)


class SignalFlags:
    """The flags the handler sets, the signals received (in order, each to be chained once),
    and the handlers that were there before."""

    def __init__(self, snapshot_signal: int, stop_signals: Iterable[int]) -> None:
        self.snapshot_signal = snapshot_signal
        self.stop_signals = tuple(stop_signals)
        self.snapshot = False
        self.stop = False
        self.last_signal: str | None = None
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    @property
    def signals(self) -> tuple[int, ...]:
        return (self.snapshot_signal, *self.stop_signals)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: no signal handlers installed")
            return
        self._pid = os.getpid()
        for signum in {self.snapshot_signal, *self.stop_signals}:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # No work here: a flag for the loop. A forked DataLoader worker inherits this handler
        # and must do nothing at all (the main process snapshots).
        if os.getpid() != self._pid:
            return
        if signum in self.stop_signals:
            self.stop = True
        else:
            self.snapshot = True
        self.last_signal = signal_name(signum)
        self.received.append(signum)

    def take(self, wanted: Iterable[int]) -> list[int]:
        """Remove and return the signals in ``wanted`` received so far. pop() one at a time:
        the handler may append between any two bytecodes, and no signal may be lost."""
        chosen = set(wanted)
        taken: list[int] = []
        received = self.received
        i = 0
        while i < len(received):
            if received[i] in chosen:
                taken.append(received.pop(i))
            else:
                i += 1
        return taken

    def chain(self, signals: Iterable[int]) -> None:
        """Run the handlers that were installed before ours, after we acted on the signal
        (submitit's requeue handler, say)."""
        for signum in signals:
            previous = self._previous.get(signum)
            # Python's own SIGINT handler raises KeyboardInterrupt: chained, it would turn the
            # stop that was just taken into a crash.
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signum, None)
