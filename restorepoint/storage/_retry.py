"""The one retry policy of every object-store backend (spec 15.5): which failures are retried,
how often, how long to wait between tries, how long a connection may take to open and how long
a request may stall, and the deadline that bounds it all under a reclaim notice.

s3fs, botocore and gcsfs each retry on their own (botocore 3 or 5 tries, s3fs 5 more around
each of them, gcsfs 6 with up to 32 s between tries, each with its own list of what is
transient). :func:`take_over` turns theirs off and puts this policy around the one call each
library makes per HTTP request (``S3FileSystem._call_s3``, ``GCSFileSystem._request``), and the
pinned S3 range read (a request and its body) is retried here as a whole.

The numbers (documented in spec 15.5 and docs/reliability.md) come from the environment, read at
each :func:`~restorepoint.storage.resolve`:

- ``RESTOREPOINT_STORE_ATTEMPTS`` (5): tries per request, the first included;
- ``RESTOREPOINT_STORE_BACKOFF`` (0.5 s) and ``RESTOREPOINT_STORE_BACKOFF_CAP`` (8 s): before
  try n+1 wait a uniformly random time in [0, min(cap, backoff * 2**(n-1))] ("full jitter");
- ``RESTOREPOINT_STORE_CONNECT_TIMEOUT`` (10 s): to open a connection;
- ``RESTOREPOINT_STORE_STALL_TIMEOUT`` (20 s): the longest a request may go without a byte
  from the server (botocore's read_timeout, aiohttp's sock_read) before it counts as failed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import StorageUnavailable, UsageError

__all__ = [
    "RetryPolicy",
    "deadline_left",
    "policy",
    "retriable",
    "retry_async",
    "set_store_deadline",
    "store_deadline",
    "store_options",
    "take_over",
    "watch_store_deadline",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    backoff_s: float = 0.5
    backoff_cap_s: float = 8.0
    connect_timeout_s: float = 10.0
    stall_timeout_s: float = 20.0

    def delay(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the second try)."""
        ceiling = min(self.backoff_cap_s, self.backoff_s * 2 ** (retry - 1))
        return random.uniform(0.0, ceiling)  # noqa: S311 - jitter, not a secret


_ENV = {
    "attempts": "RESTOREPOINT_STORE_ATTEMPTS",
    "backoff_s": "RESTOREPOINT_STORE_BACKOFF",
    "backoff_cap_s": "RESTOREPOINT_STORE_BACKOFF_CAP",
    "connect_timeout_s": "RESTOREPOINT_STORE_CONNECT_TIMEOUT",
    "stall_timeout_s": "RESTOREPOINT_STORE_STALL_TIMEOUT",
}


def policy() -> RetryPolicy:
    """The policy the environment asks for (the defaults where it says nothing)."""
    values: dict[str, Any] = {}
    for field, name in _ENV.items():
        raw = os.environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            value: float = int(raw) if field == "attempts" else float(raw)
        except ValueError:
            raise UsageError(f"{name}={raw!r}: not a number") from None
        lowest = 1 if field == "attempts" else 0
        if value < lowest or (field.endswith("timeout_s") and value == 0):
            raise UsageError(f"{name}={raw!r}: out of range")
        values[field] = value
    return RetryPolicy(**values)


# -- the deadline --------------------------------------------------------------------------

_deadline_lock = threading.Lock()
#: [the deadline] (a list, so that setting it needs no ``global``)
_deadline: list[float | None] = [None]
#: Called with each deadline set (``watch_store_deadline``).
_watchers: list[Callable[[float | None], None]] = []


def set_store_deadline(when: float | None) -> None:
    """Bound every retry of this process by ``when`` (time.monotonic()), or by nothing
    (None). The runtime sets it when a stop or a reclaim notice starts its last upload: a retry
    whose wait would end past it is not made, and the failure stands. Each watcher is told."""
    with _deadline_lock:
        _deadline[0] = when
        watchers = list(_watchers)
    for watcher in watchers:
        watcher(when)


def watch_store_deadline(watcher: Callable[[float | None], None]) -> Callable[[], None]:
    """Call ``watcher`` with every deadline set from now on (a publish in a process of its own
    carries it there: on Linux, time.monotonic() is one clock for every process of the
    machine); returns the function that stops the calls. ``watcher`` must not raise."""
    with _deadline_lock:
        _watchers.append(watcher)

    def stop() -> None:
        with _deadline_lock, contextlib.suppress(ValueError):
            _watchers.remove(watcher)

    return stop


@contextlib.contextmanager
def store_deadline(when: float | None) -> Iterator[None]:
    """:func:`set_store_deadline` for a block; the earlier deadline wins when nested."""
    previous = _deadline[0]
    if previous is not None and when is not None:
        when = min(when, previous)
    set_store_deadline(when)
    try:
        yield
    finally:
        set_store_deadline(previous)


def deadline_left() -> float | None:
    """Seconds left before the store deadline, or None where there is none."""
    when = _deadline[0]
    return None if when is None else when - time.monotonic()


# -- what is transient ---------------------------------------------------------------------

_TRANSIENT_NAMES = {
    # botocore / aiobotocore / aiohttp class names, matched by name so that none of these
    # optional packages has to be imported.
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ClientPayloadError",
    "ServerTimeoutError",
    "ContentLengthError",
    "TransferEncodingError",
    "IncompleteRead",
    "ResponseStreamingError",
    "ChecksumError",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "RequestLimitExceeded",
    "TooManyRequests",
}


def _status_transient(status: object) -> bool:
    return isinstance(status, int) and (status in (408, 429) or 500 <= status <= 599)


def retriable(exc: BaseException) -> bool:  # noqa: PLR0911 - one answer per kind of error
    """Whether a retry of the same request may cure ``exc``: the network, a timeout or stall,
    throttling (429, SlowDown), a server error (5xx). A 4xx answer (not found, denied, a
    failed precondition) is final. The cause chain is looked at too: s3fs and gcsfs wrap."""
    seen: BaseException | None = exc
    depth = 0
    while seen is not None and depth < 8:
        if isinstance(seen, (FileNotFoundError, PermissionError, FileExistsError)):
            return False
        names = {cls.__name__ for cls in type(seen).__mro__}
        if names & _TRANSIENT_NAMES or isinstance(seen, (ConnectionError, TimeoutError)):
            return True
        response = getattr(seen, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            error = response.get("Error", {}) or {}
            if error.get("Code") in _TRANSIENT_CODES:
                return True
            status = (response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
            if status is not None:
                return _status_transient(status)
        if "HttpError" in names:  # gcsfs
            return _status_transient(getattr(seen, "code", None))
        if _status_transient(getattr(seen, "status", None)):  # aiohttp's ClientResponseError
            return True
        seen = seen.__cause__ or seen.__context__
        depth += 1
    return False


async def retry_async(call: Callable[[], Awaitable[T]], what: str = "request") -> T:
    """Await ``call()`` under the policy: a transient failure is tried again after a
    jittered, capped, exponential wait, at most ``attempts`` tries in all, never waiting past
    the store deadline."""
    rules = policy()
    tries = 0
    while True:
        tries += 1
        try:
            return await call()
        except Exception as exc:
            if not retriable(exc) or tries >= rules.attempts:
                raise
            wait = rules.delay(tries)
            left = deadline_left()
            if left is not None and wait >= left:
                raise StorageUnavailable(
                    f"storage failing and the deadline is near: {what} not retried after "
                    f"{tries} {'try' if tries == 1 else 'tries'} ({type(exc).__name__}: {exc})"
                ) from exc
            import asyncio  # here: a local store's reader never loads the event loop's 15 ms

            await asyncio.sleep(wait)


# -- the backends --------------------------------------------------------------------------


def store_options(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for the fsspec filesystem of ``protocol`` with the policy's timeouts and
    the library's own retries turned off. A timeout the user set in the options (or fsspec's
    configuration) is kept."""
    rules = policy()
    import fsspec.config

    given = {**fsspec.config.conf.get(protocol, {}), **options}
    out = dict(options)
    if protocol == "s3":
        config = dict(given.get("config_kwargs") or {})
        config.setdefault("connect_timeout", rules.connect_timeout_s)
        config.setdefault("read_timeout", rules.stall_timeout_s)
        # botocore's own retries off: each try is one of ours.
        config["retries"] = {"total_max_attempts": 1}
        out["config_kwargs"] = config
    elif protocol == "gcs" and "requests_timeout" not in given:
        import aiohttp

        out["requests_timeout"] = aiohttp.ClientTimeout(
            total=None, sock_connect=rules.connect_timeout_s, sock_read=rules.stall_timeout_s
        )
    return out


def take_over(protocol: str, fs: Any) -> None:
    """Put the policy around the one coroutine through which ``fs`` makes every request, in
    place of the library's own retries. Done once per filesystem (fsspec caches them)."""
    if getattr(fs, "_restorepoint_retry", False):
        return
    if protocol == "s3" and hasattr(fs, "_call_s3"):
        raw = fs._call_s3
        fs.retries = 1  # s3fs's own loop: one try, ours around it

        @functools.wraps(raw)
        async def call_s3(method: str, *args: Any, **kwargs: Any) -> Any:
            return await retry_async(lambda: raw(method, *args, **kwargs), f"S3 {method}")

        from fsspec.asyn import sync_wrapper

        fs._call_s3 = call_s3
        # s3fs's file objects (a multipart upload's parts) call the blocking ``call_s3``,
        # made from the class's coroutine: point it at ours too.
        fs.call_s3 = sync_wrapper(call_s3, obj=fs)
        fs._restorepoint_raw_call_s3 = raw
    elif protocol == "gcs" and hasattr(type(fs), "_request"):
        unwrapped = getattr(type(fs)._request, "__wrapped__", None)
        if unwrapped is None:  # pragma: no cover - a gcsfs without its retry decorator
            return

        async def request(*args: Any, **kwargs: Any) -> Any:
            return await retry_async(lambda: unwrapped(fs, *args, **kwargs), "GCS request")

        fs._request = request
    else:
        return
    fs._restorepoint_retry = True
