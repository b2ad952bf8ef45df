"""S3: moto's ThreadedMotoServer on 127.0.0.1, reached through s3fs, with a fresh bucket per
test and the environment that lets a subprocess (the CLI, a crash packer) reach it too. Each
pytest-xdist worker is its own process and starts its own server on a port the system chooses,
so workers never share a port or a bucket."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = [
    "S3Server",
    "clean_environ",
    "s3_bucket",
    "s3_client",
    "s3_env",
    "s3_env_factory",
    "s3_env_for",
    "s3_options",
    "s3_options_factory",
    "s3_server",
    "s3_storage_options",
    "s3_unavailable",
]

_S3_MODULES = ("moto.server", "s3fs", "boto3")


def s3_unavailable() -> str | None:
    """Why the S3 tests cannot run here, or None."""
    import importlib

    for module in _S3_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"S3 tests need moto[server], s3fs and boto3 ({module}: {exc})"
    return None


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
    reason = s3_unavailable()
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
