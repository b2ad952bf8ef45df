"""The crash suites behind the fault proxy (tests/_servers/faults.py), for a kill hunt by hand:
``RESTOREPOINT_CRASH_FAULTS=RATE`` (a fraction of requests, e.g. 0.05; ``1`` means the default
0.05) puts the proxy between every S3 client of the suites (the killed workers, and this
process's verify, prune and import after each kill) and moto, answering that fraction of the
requests with a connection reset after the server acted (half of them) or a 503 SlowDown
(the other half). The retry policy is made fast, and given enough tries that a request fails
only when the kill says so. Unset: the suites talk to moto directly, as in CI."""

from __future__ import annotations

import os
import time

from _servers.faults import FaultProxy, Faults

ENV = "RESTOREPOINT_CRASH_FAULTS"
DEFAULT_RATE = 0.05
#: The policy for every process of a hunt with faults on.
POLICY_ENV = {
    "RESTOREPOINT_STORE_BACKOFF": "0.02",
    "RESTOREPOINT_STORE_BACKOFF_CAP": "0.2",
    "RESTOREPOINT_STORE_ATTEMPTS": "10",
}

#: The proxy of the running test, when faults are on (set by the conftest's fixtures).
current: list[FaultProxy | None] = [None]


def rate() -> float:
    """The fault rate the environment asks for; 0 when faults are off."""
    raw = os.environ.get(ENV, "").strip()
    if raw in ("", "0"):
        return 0.0
    value = float(raw)
    return DEFAULT_RATE if value == 1 else value


def faults(seed: int = 0) -> Faults:
    r = rate()
    return Faults(reset=r / 2, error=r / 2, seed=seed)


def idle() -> bool:
    """Whether the proxy (if any) has no request in hand: what a killed worker sent whole it
    forwards to the server even so, as a real store acts on a request whose sender died."""
    proxy = current[0]
    return proxy is None or proxy.inflight == 0


def wait_idle(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not idle():
        assert time.monotonic() < deadline, "the fault proxy still serves a killed worker"
        time.sleep(0.02)
