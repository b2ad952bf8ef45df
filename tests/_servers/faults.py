"""A fault-injecting HTTP proxy on 127.0.0.1, in front of moto's S3 server or fake-gcs-server: a
small asyncio proxy in a thread of its own (no proxy library is installed here).

Each request the client sends is read whole (head and body) and then, by the rates of its
:class:`Faults` or because it is the Nth request (``at``), it is

- ``reset``: forwarded, and the connection reset (RST) halfway through the response;
- ``error``: answered 503 SlowDown (S3's XML or GCS's JSON) without reaching the server;
- ``throttle``: answered 429 the same way;
- ``stall``: held with no byte sent back for ``stall_s`` seconds, then closed;
- ``truncate``: forwarded, and the connection closed (FIN) halfway through the response;
- else forwarded whole, after ``latency_s`` and at most ``bandwidth`` bytes a second.

Every request goes upstream on a connection of its own, with ``Connection: close``, and the
response goes back with it too (each client connection carries one request). A ``Location``
header naming the server (GCS's resumable-upload URL) is rewritten to name the proxy, so that
what follows goes through it too."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["FaultProxy", "Faults", "gcs_fault_proxy", "s3_fault_proxy"]

KINDS = ("reset", "error", "throttle", "stall", "truncate")


@dataclass
class Faults:
    reset: float = 0.0
    error: float = 0.0
    throttle: float = 0.0
    stall: float = 0.0
    truncate: float = 0.0
    #: how long a stall holds a request
    stall_s: float = 5.0
    latency_s: float = 0.0
    #: bytes a second, each way (None: no cap)
    bandwidth: float | None = None
    #: request number (1 for the first) -> the fault it gets, whatever the rates say
    at: dict[int, str] = field(default_factory=dict)
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

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, faults: Faults) -> None:
        self.faults = faults
        self._random = random.Random(faults.seed)
        self.requests = 0
        self.injected.clear()

    # -- one request ---------------------------------------------------------------------

    def _choose(self, number: int) -> str | None:
        f = self.faults
        if number in f.at:
            return f.at[number]
        roll = self._random.random()
        for kind in KINDS:
            rate = float(getattr(f, kind))
            if roll < rate:
                return kind
            roll -= rate
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader, writer)
            if request is None:
                return
            self.requests += 1
            self.total += 1
            kind = self._choose(self.requests)
            if kind is not None:
                self.injected[kind] += 1
            await self._handle(request, kind, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, OSError):
            pass
        finally:
            if not writer.is_closing():
                writer.close()

    async def _handle(self, request: bytes, kind: str | None, writer: asyncio.StreamWriter) -> None:
        f = self.faults
        if kind in ("error", "throttle"):
            refusal = self._refusal(503 if kind == "error" else 429)
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
            code = "SlowDown" if status == 503 else "TooManyRequests"
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected {status}</Message></Error>"
            ).encode()
            kind = "application/xml"
        else:
            body = (f'{{"error": {{"code": {status}, "message": "injected {status}"}}}}').encode()
            kind = "application/json"
        reason = "Slow Down" if status == 503 else "Too Many Requests"
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


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
    """One request, whole, with ``Connection: close``; None at the end of the connection. A
    client that waits for ``100 Continue`` (botocore, before a part's body) gets it here."""
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
    elif length:
        body = await reader.readexactly(length)
    return b"\r\n".join([*kept, b"Connection: close", b"", b""]) + body


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
def gcs_fault_proxy(_gcs_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The proxy in front of fake-gcs-server, with no fault until the test sets some."""
    _gcs_proxy.set(Faults())
    yield _gcs_proxy
    _gcs_proxy.set(Faults())
