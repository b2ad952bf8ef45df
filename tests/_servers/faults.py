"""A fault-injecting HTTP proxy on 127.0.0.1, in front of moto's S3 server or fake-gcs-server: a
small asyncio proxy in a thread of its own (no proxy library is installed here).

Each request the client sends is read whole (head and body) and then, by the rates of its
:class:`Faults` or because it is the Nth request (``at``), it is

- ``reset``: forwarded, and the connection reset (RST) halfway through the response;
- ``error``: answered 503 SlowDown (S3's XML or GCS's JSON) without reaching the server;
- ``throttle``: answered 429 the same way;
- ``stall``: held with no byte sent back for ``stall_s`` seconds, then closed;
- ``truncate``: forwarded, and the connection closed (FIN) halfway through the response, whose
  head still says the full ``Content-Length``;
- ``short``: forwarded, and only the first half of the response's body sent back under a
  ``Content-Length`` rewritten to match it (a broken middlebox: nothing in HTTP tells the
  client, only the length it asked for or a digest does);
- ``drop``: reset (RST) before anything is forwarded: the server never sees the request;
- ``no_such_upload``: answered 404 ``NoSuchUpload`` without reaching the server (S3 only: what
  S3 answers a ``CompleteMultipartUpload`` retried after the first completed it);
- else forwarded whole, after ``latency_s`` and at most ``bandwidth`` bytes a second each way.

Which request gets a fault: a :class:`Rule` that matches the request's first line (the first
``times`` matches), else the Nth request's entry in ``at``, else the rates.

Every request goes upstream on a connection of its own, with ``Connection: close``, and the
response goes back with it too (each client connection carries one request). A ``Location``
header naming the server (GCS's resumable-upload URL) is rewritten to name the proxy, so that
what follows goes through it too."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["FaultProxy", "Faults", "Rule", "gcs_fault_proxy", "s3_capped", "s3_fault_proxy"]

KINDS = ("reset", "error", "throttle", "stall", "truncate", "short")
#: Faults given only by a rule or ``at``, never by a rate.
TARGETED = ("drop", "no_such_upload")


@dataclass
class Rule:
    """The fault ``kind`` for the first ``times`` requests whose first line (``METHOD TARGET
    HTTP/1.1``) matches ``pattern`` (a regular expression, searched); ``kind`` "none" lets
    them through."""

    pattern: str
    kind: str
    times: int = 1
    #: how many requests it has given its fault so far
    hits: int = 0


@dataclass
class Faults:
    reset: float = 0.0
    error: float = 0.0
    throttle: float = 0.0
    stall: float = 0.0
    truncate: float = 0.0
    short: float = 0.0
    #: how long a stall holds a request
    stall_s: float = 5.0
    latency_s: float = 0.0
    #: bytes a second, each way (None: no cap)
    bandwidth: float | None = None
    #: request number (1 for the first) -> the fault it gets, whatever the rates say
    at: dict[int, str] = field(default_factory=dict)
    #: rules by the request's first line, looked at in order before ``at`` and the rates
    rules: list[Rule] = field(default_factory=list)
    seed: int = 0


class FaultProxy:
    """``FaultProxy(port, flavor).start()``; ``endpoint`` is its URL; ``faults`` may be
    replaced at any time; ``injected`` counts the faults given, ``requests`` the requests."""

    def __init__(self, upstream_port: int, flavor: str, faults: Faults | None = None) -> None:
        if flavor not in ("s3", "gcs"):
            raise ValueError(flavor)
        self.upstream = ("127.0.0.1", upstream_port)
        self.flavor = flavor
        self.faults = faults or Faults()
        self.injected: Counter[str] = Counter()
        self.requests = 0
        #: requests since the start, never reset
        self.total = 0
        #: requests read whole and not yet answered (a crash test waits for 0 after a kill:
        #: what the killed client had sent whole still reaches the server)
        self.inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._random = random.Random(self.faults.seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    # -- life ---------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, faults: Faults) -> None:
        self.faults = faults
        self._random = random.Random(faults.seed)
        self.requests = 0
        self.injected.clear()

    # -- one request ---------------------------------------------------------------------

    def _choose(self, number: int, request: bytes) -> str | None:
        f = self.faults
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        for rule in f.rules:
            if rule.hits < rule.times and re.search(rule.pattern, line):
                rule.hits += 1
                return None if rule.kind == "none" else rule.kind
        if number in f.at:
            return None if f.at[number] == "none" else f.at[number]
        roll = self._random.random()
        for kind in KINDS:
            rate = float(getattr(f, kind))
            if roll < rate:
                return kind
            roll -= rate
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Python 3.11's start_server keeps no reference to the task it makes for a connection:
        # keep one, so that a task waiting on a connection is never collected half-way.
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        handling = False
        try:
            request = await _read_request(reader, writer, self.faults.bandwidth)
            if request is None:
                return
            self.inflight += 1
            handling = True
            self.requests += 1
            self.total += 1
            kind = self._choose(self.requests, request)
            if kind is not None:
                self.injected[kind] += 1
            await self._handle(request, kind, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, OSError):
            pass
        finally:
            if handling:
                self.inflight -= 1
            if not writer.is_closing():
                writer.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _handle(self, request: bytes, kind: str | None, writer: asyncio.StreamWriter) -> None:
        f = self.faults
        if kind == "drop":
            _abort(writer)
            return
        if kind in ("error", "throttle", "no_such_upload"):
            refusal = self._refusal({"error": 503, "throttle": 429, "no_such_upload": 404}[kind])
            if request.startswith(b"HEAD "):
                # An answer to HEAD has no body (RFC 9110 9.3.2): aiohttp refuses one.
                refusal = refusal[: refusal.index(b"\r\n\r\n") + 4]
            writer.write(refusal)
            await writer.drain()
            return
        if kind == "stall":
            await asyncio.sleep(f.stall_s)
            return
        if f.latency_s:
            await asyncio.sleep(f.latency_s)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            up_writer.write(request)
            await up_writer.drain()
            head = await up_reader.readuntil(b"\r\n\r\n")
            head = self._rewrite(head)
            body = await up_reader.read()
        finally:
            up_writer.close()
        if kind in ("reset", "truncate"):
            writer.write(head + body[: len(body) // 2])
            await writer.drain()
            if kind == "reset":
                _abort(writer)
            return
        if kind == "short":
            body = body[: len(body) // 2]
            head = _with_length(head, len(body))
        await self._send(writer, head + body)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        rate = self.faults.bandwidth
        if not rate:
            writer.write(data)
            await writer.drain()
            return
        piece = max(1024, int(rate / 20))
        for start in range(0, len(data), piece):
            writer.write(data[start : start + piece])
            await writer.drain()
            await asyncio.sleep(len(data[start : start + piece]) / rate)

    def _refusal(self, status: int) -> bytes:
        if self.flavor == "s3":
            code = {503: "SlowDown", 429: "TooManyRequests", 404: "NoSuchUpload"}[status]
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected {status}</Message></Error>"
            ).encode()
            kind = "application/xml"
        else:
            body = (f'{{"error": {{"code": {status}, "message": "injected {status}"}}}}').encode()
            kind = "application/json"
        reason = {503: "Slow Down", 429: "Too Many Requests", 404: "Not Found"}[status]
        return (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body

    def _rewrite(self, head: bytes) -> bytes:
        lines = head.split(b"\r\n")
        out = []
        upstream = f"127.0.0.1:{self.upstream[1]}".encode()
        mine = f"127.0.0.1:{self.port}".encode()
        for line in lines:
            name = line.split(b":", 1)[0].strip().lower()
            if name in (b"connection", b"keep-alive"):
                continue
            if name == b"location":
                line = line.replace(upstream, mine).replace(
                    f"localhost:{self.upstream[1]}".encode(), mine
                )
            out.append(line)
        # out ends with two empty strings (the blank line); put Connection: close before them
        return b"\r\n".join([*out[:-2], b"Connection: close", b"", b""])


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float | None = None
) -> bytes | None:
    """One request, whole, with ``Connection: close``; None at the end of the connection. A
    client that waits for ``100 Continue`` (botocore, before a part's body) gets it here. With
    a ``rate`` (bytes a second) the body is read no faster: the client's sends block, as on a
    slow link, rather than the server's answer coming late (which the client would count as
    a stall)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.split(b"\r\n")[:-2]
    kept = []
    length = 0
    chunked = False
    for line in lines:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key in (b"connection", b"keep-alive"):
            continue
        if key == b"expect":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            continue
        if key == b"content-length":
            length = int(value.strip())
        if key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        kept.append(line)
    body = b""
    if chunked:
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            chunk = await reader.readexactly(size + 2)
            parts.append(size_line + chunk)
            if size == 0:
                break
        body = b"".join(parts)
    elif length and rate:
        pieces = []
        piece = max(1024, int(rate / 20))
        while length > 0:
            pieces.append(await reader.readexactly(min(piece, length)))
            length -= len(pieces[-1])
            await asyncio.sleep(len(pieces[-1]) / rate)
        body = b"".join(pieces)
    elif length:
        body = await reader.readexactly(length)
    return b"\r\n".join([*kept, b"Connection: close", b"", b""]) + body


def _with_length(head: bytes, length: int) -> bytes:
    """A response head whose ``Content-Length`` says ``length``."""
    lines = [
        f"Content-Length: {length}".encode()
        if line.split(b":", 1)[0].strip().lower() == b"content-length"
        else line
        for line in head.split(b"\r\n")
    ]
    return b"\r\n".join(lines)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- fixtures: a proxy per session and worker in front of each server, healthy at each test's
# start (a test sets the faults it wants with ``proxy.set(Faults(...))``).


def _port(url: str) -> int:
    from urllib.parse import urlsplit

    port = urlsplit(url).port
    assert port is not None, url
    return port


@pytest.fixture(scope="session")
def _s3_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    proxy = FaultProxy(_port(s3_server.endpoint), "s3").start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="session")
def _gcs_proxy(gcs_server: Any) -> Iterator[FaultProxy]:
    proxy = FaultProxy(_port(gcs_server.url), "gcs").start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3_fault_proxy(_s3_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The proxy in front of moto's S3 server, with no fault until the test sets some."""
    _s3_proxy.set(Faults())
    yield _s3_proxy
    _s3_proxy.set(Faults())


@pytest.fixture
def s3_capped(
    s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> Callable[[int], dict[str, Any]]:
    """``cap(bandwidth)``: the storage options of moto's S3 server behind the proxy at
    ``bandwidth`` bytes a second each way, a slow network. Bytes flow, slowly, so the stall
    timeout is the default's (20 s), not the short one the tests' environment sets."""
    from .s3 import s3_options

    def cap(bandwidth: int) -> dict[str, Any]:
        monkeypatch.delenv("RESTOREPOINT_STORE_STALL_TIMEOUT", raising=False)
        s3_fault_proxy.set(Faults(bandwidth=bandwidth))
        return s3_options(s3_fault_proxy.endpoint)

    return cap


@pytest.fixture
def gcs_fault_proxy(_gcs_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The proxy in front of fake-gcs-server, with no fault until the test sets some."""
    _gcs_proxy.set(Faults())
    yield _gcs_proxy
    _gcs_proxy.set(Faults())
