"""http:// URLs (fsspec's http backend, read-only): fsspec reports every failure of its info
request as FileNotFoundError, so a refused connection was "not found" (NotFound, which a
retry never cures). The cause tells them apart: a server that is down or failing is
StorageUnavailable (retryable), and only a 404 is NotFound."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from clirun import cli, one_error_line

pytest.importorskip("aiohttp")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(503 if self.path.startswith("/busy") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("where", "expected", "retryable"),
    [
        ("closed", "StorageUnavailable", True),
        ("busy", "StorageUnavailable", True),
        ("missing", "NotFound", False),
    ],
)
def test_an_unreachable_server_is_not_a_missing_object(
    server: str, where: str, expected: str, retryable: bool
) -> None:
    url = {
        "closed": f"http://127.0.0.1:{_closed_port()}/x.rp",
        "busy": f"{server}/busy/x.rp",
        "missing": f"{server}/missing/x.rp",
    }[where]
    proc = cli("verify", url, "--json", timeout=60)
    assert proc.returncode == 4
    line = one_error_line(proc)
    error = json.loads(proc.stdout)["error"]
    assert error["class"] == expected
    if retryable:
        assert "storage unreachable or failing" in line
    else:
        assert line == f"restorepoint: error: {url}: not found"
