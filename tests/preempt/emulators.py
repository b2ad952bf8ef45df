"""Metadata-service emulators for the reclaim-notice tests: AWS IMDSv2 and the GCE metadata
server, each a threaded http.server on 127.0.0.1 (a port the system chooses).

    with AwsEmulator() as aws:          # aws.url: http://127.0.0.1:PORT
        aws.arm_instance_action("terminate", seconds=20)
    with GcpEmulator() as gcp:
        gcp.arm_preempted()

As a script, for trying ``restorepoint run --watch aws|gcp --metadata-url URL`` by hand:

    python -m preempt.emulators aws|gcp [--arm-after S] [--deadline S]   (from tests/)

What is emulated, as the providers document it:

- AWS: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to 21600;
  otherwise 400) returns a token valid for that many seconds; every GET needs it in
  ``X-aws-ec2-metadata-token`` (401 when missing, unknown or expired). ``spot/instance-action``
  and ``events/recommendations/rebalance`` are 404 until armed.
- GCP: ``/computeMetadata/v1/instance/{preempted,maintenance-event}`` need ``Metadata-Flavor:
  Google`` (403 otherwise) and answer with an ``ETag``. ``wait_for_change=true`` blocks until
  the value's ETag differs from ``last_etag`` (at once when it already does; without
  ``last_etag``, until the next change) or ``timeout_sec`` passes, then answers the value.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import secrets
import socket
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["AwsEmulator", "Emulator", "GcpEmulator", "iso_z"]

AWS_MAX_TTL = 21600
#: A long-poll without timeout_sec waits at most this long here (the real one waits on).
GCP_MAX_WAIT = 300.0


def iso_z(timestamp: float) -> str:
    """The instant as AWS writes it: ``2017-09-18T08:22:00Z`` (whole seconds, UTC)."""
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    emulator: Emulator


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the tests read the counters, not a request log on stderr

    def _dispatch(self) -> None:
        emu = self.server.emulator
        path = urlsplit(self.path).path
        with emu.cond:
            emu.requests[(self.command, path)] += 1
            failure = None
            for i, (status, only) in enumerate(emu.failures):
                if only is None or only == path:
                    failure = status
                    del emu.failures[i]
                    break
        if failure is not None:
            self.reply(failure, b"emulated failure\n")
            return
        emu.handle(self)

    do_GET = _dispatch
    do_PUT = _dispatch
    do_POST = _dispatch

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        with contextlib.suppress(OSError):  # the client gave up (a watcher being stopped)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)


class Emulator:
    """A metadata service on loopback: start/stop (or a context manager), ``requests`` counts
    (method, path) pairs, ``fail_next`` answers the next requests with an error status, and
    ``refuse``/``resume`` make connections fail (refused) and work again, on the same port."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.failures: list[tuple[int, str | None]] = []
        self.closing = False
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._reserved: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Emulator:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.emulator = self
        self.port = server.server_address[1]
        self._server = server
        self.closing = False
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.closing = True  # long-polls answer now
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    def refuse(self) -> None:
        """Stop listening but keep the port: a socket bound and not listening makes every
        connection attempt fail with ECONNREFUSED, and no other process can take the port."""
        port = self.port
        self.stop()
        reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.bind(("127.0.0.1", port))
        self._reserved = reserved

    def resume(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        self.start()

    def fail_next(self, count: int = 1, status: int = 500, path: str | None = None) -> None:
        """Answer the next ``count`` requests (for ``path`` only, when given) with ``status``."""
        with self.cond:
            self.failures.extend([(status, path)] * count)

    def count(self, path: str, method: str = "GET") -> int:
        with self.cond:
            return self.requests[(method, path)]

    def handle(self, h: _Handler) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AwsEmulator(Emulator):
    """EC2's instance metadata service, IMDSv2 only (a token is required)."""

    TOKEN = "/latest/api/token"
    ACTION = "/latest/meta-data/spot/instance-action"
    REBALANCE = "/latest/meta-data/events/recommendations/rebalance"

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[str, float] = {}  # token -> expiry (time.time())
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None

    def arm_instance_action(self, action: str = "terminate", seconds: float = 120.0) -> float:
        """Announce a stop or termination ``seconds`` from now; returns the deadline the body
        states (rounded up to a whole second, as AWS states whole seconds)."""
        deadline = float(math.ceil(time.time() + seconds))
        with self.cond:
            self.instance_action = {"action": action, "time": iso_z(deadline)}
        return deadline

    def arm_rebalance(self, notice_time: float | None = None) -> str:
        stamp = iso_z(time.time() if notice_time is None else notice_time)
        with self.cond:
            self.rebalance = {"noticeTime": stamp}
        return stamp

    def disarm(self) -> None:
        with self.cond:
            self.instance_action = None
            self.rebalance = None

    def expire_tokens(self) -> None:
        """Every token issued so far expires now (what the passing of its TTL would do)."""
        with self.cond:
            self.tokens.clear()

    def handle(self, h: _Handler) -> None:
        path = urlsplit(h.path).path
        if h.command == "PUT" and path == self.TOKEN:
            raw = h.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if not raw.isdigit() or not 1 <= int(raw) <= AWS_MAX_TTL:
                h.reply(400, b"token TTL header missing or out of range\n")
                return
            token = secrets.token_urlsafe(32)
            with self.cond:
                self.tokens[token] = time.time() + int(raw)
            h.reply(200, token.encode(), {"X-aws-ec2-metadata-token-ttl-seconds": raw})
            return
        if h.command != "GET":
            h.reply(405, b"method not allowed\n")
            return
        token = h.headers.get("X-aws-ec2-metadata-token")
        with self.cond:
            expiry = self.tokens.get(token or "")
            valid = expiry is not None and expiry > time.time()
            body = {self.ACTION: self.instance_action, self.REBALANCE: self.rebalance}.get(path)
        if not valid:
            h.reply(401, b"")
            return
        if body is None:
            h.reply(404, b"not found\n")
            return
        h.reply(200, json.dumps(body).encode())


class GcpEmulator(Emulator):
    """The GCE metadata server's ``instance/preempted`` and ``instance/maintenance-event``."""

    PREFIX = "/computeMetadata/v1/instance/"

    def __init__(self) -> None:
        super().__init__()
        self.values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.etags = {key: secrets.token_hex(8) for key in self.values}
        #: requests answered as if their Metadata-Flavor header had been stripped on the way
        self.strip_flavor = 0
        #: long-polls blocked right now, per key (so a test can arm while one is waiting)
        self.waiting: Counter[str] = Counter()
        #: requests answered 403 for want of the header
        self.forbidden = 0

    def set(self, key: str, value: str) -> None:
        with self.cond:
            if self.values[key] != value:
                self.values[key] = value
                self.etags[key] = secrets.token_hex(8)
                self.cond.notify_all()

    def arm_preempted(self) -> None:
        self.set("preempted", "TRUE")

    def arm_maintenance(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        self.set("maintenance-event", event)

    def disarm(self) -> None:
        self.set("preempted", "FALSE")
        self.set("maintenance-event", "NONE")

    def drop_flavor_next(self, count: int = 1) -> None:
        with self.cond:
            self.strip_flavor += count

    def wait_for_poll(self, key: str, timeout: float = 30.0) -> bool:
        """Wait until a long-poll on ``key`` is blocked in the emulator."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.waiting[key] == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def handle(self, h: _Handler) -> None:
        parts = urlsplit(h.path)
        key = parts.path[len(self.PREFIX) :] if parts.path.startswith(self.PREFIX) else ""
        with self.cond:
            stripped = self.strip_flavor > 0
            self.strip_flavor -= int(stripped)
        flavor = None if stripped else h.headers.get("Metadata-Flavor")
        if flavor != "Google":
            with self.cond:
                self.forbidden += 1
            h.reply(403, b"Missing Metadata-Flavor:Google header.\n")
            return
        if h.command != "GET" or key not in self.values:
            h.reply(404, b"not found\n")
            return
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self.cond:
            if query.get("wait_for_change", "").lower() == "true":
                try:
                    limit = float(query.get("timeout_sec", GCP_MAX_WAIT))
                except ValueError:
                    h.reply(400, b"bad timeout_sec\n")
                    return
                seen = query.get("last_etag", self.etags[key])
                deadline = time.monotonic() + min(limit, GCP_MAX_WAIT)
                self.waiting[key] += 1
                self.cond.notify_all()
                try:
                    while self.etags[key] == seen and not self.closing:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(left)
                finally:
                    self.waiting[key] -= 1
            value, etag = self.values[key], self.etags[key]
        h.reply(200, value.encode(), {"ETag": etag, "Metadata-Flavor": "Google"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a metadata-service emulator.")
    parser.add_argument("cloud", choices=["aws", "gcp"])
    parser.add_argument("--arm-after", type=float, help="arm the stop notice after S seconds")
    parser.add_argument("--deadline", type=float, default=120.0, help="AWS: seconds of notice")
    args = parser.parse_args(argv)
    emu: Emulator = AwsEmulator() if args.cloud == "aws" else GcpEmulator()
    with emu:
        print(emu.url, flush=True)
        try:
            if args.arm_after is not None:
                time.sleep(args.arm_after)
                if isinstance(emu, AwsEmulator):
                    emu.arm_instance_action(seconds=args.deadline)
                else:
                    emu.arm_preempted()
                print("armed", flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
