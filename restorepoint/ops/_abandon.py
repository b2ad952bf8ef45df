"""A publish that another thread may abandon: the token a stop uses to give up a periodic
publish still in flight for its own newer snapshot (runtime/_inflight.py has the rule). The
pack calls the token as its progress hook, chunk by chunk; once asked, the next call raises,
and the publish fails as any failed publish does: nothing committed, the store as it was (its
staging discarded, an S3 multipart upload aborted). Once the last chunk was read the publish
is no longer abandoned: it is about to land."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import RestorePointError

__all__ = ["Abandon"]


class Abandon:
    """Thread-safe: ``ask`` from any thread; the publishing thread calls the token (or
    ``check``). ``watch`` hands each ask on (the parent's token to its publish process)."""

    def __init__(self, progress: Callable[[int], None] | None = None) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._why: str | None = None
        self._watchers: list[Callable[[str], None]] = []

    @property
    def asked(self) -> bool:
        return self._why is not None

    def ask(self, why: str) -> None:
        """Abandon the publish at its next chunk, for ``why`` (one line: its error's message)."""
        with self._lock:
            if self._why is not None:
                return
            self._why = why
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher(why)

    def watch(self, watcher: Callable[[str], None]) -> None:
        """Call ``watcher`` with the ask, now if it was made already."""
        with self._lock:
            why = self._why
            if why is None:
                self._watchers.append(watcher)
                return
        watcher(why)

    def check(self) -> None:
        why = self._why
        if why is not None:
            raise RestorePointError(why)

    def __call__(self, n: int) -> None:
        """The pack's progress hook: raises once asked; else the caller's own hook, if any."""
        self.check()
        if self._progress is not None:
            self._progress(n)
