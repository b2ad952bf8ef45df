"""The store suite on a real S3 server (moto, through s3fs), and what only S3 promises: a
failed publish leaves no completed object and no multipart upload, and the CLI reaches the
server through the environment and turns its failures into exit 4 with one line."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint.storage import resolve
from restorepoint.testing.store import StoreConformance, payload, publish_and_fail

pytestmark = pytest.mark.s3

#: Past the 16 MiB part the deferred publisher buffers, so a part reaches the server.
PAST_ONE_PART = (16 << 20) + 4096


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


class TestS3Store(StoreConformance):
    publish_size = PAST_ONE_PART

    @pytest.fixture(autouse=True)
    def _client(self, s3_client: Any) -> None:
        self.client = s3_client

    @pytest.fixture
    def base_url(self, s3_bucket: str) -> str:
        return f"s3://{s3_bucket}/prefix-{uuid.uuid4().hex[:8]}/"

    @pytest.fixture
    def storage_options(self, s3_storage_options: dict[str, Any]) -> dict[str, Any]:
        return s3_storage_options

    def raw_get(self, url: str) -> bytes:
        bucket, key = _split(url)
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def raw_put(self, url: str, data: bytes) -> None:
        bucket, key = _split(url)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def raw_list(self, prefix: str) -> list[str]:
        bucket, key = _split(prefix)
        names = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=key
        ):
            names.extend(obj["Key"].removeprefix(key) for obj in page.get("Contents", []))
        return sorted(names)


def _uploads(client: Any, bucket: str) -> list[dict[str, Any]]:
    return list(client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()], ids=repr)
def test_failed_publish_aborts_its_multipart_upload(
    s3_client: Any, s3_bucket: str, s3_storage_options: dict[str, Any], failure: BaseException
) -> None:
    url = f"s3://{s3_bucket}/run/step-1.rp"
    s3_client.put_object(Bucket=s3_bucket, Key="run/step-1.rp", Body=b"old object")
    location = resolve(url, s3_storage_options)
    during: list[list[dict[str, Any]]] = []

    def attempt() -> None:
        with location.publish(size_hint=PAST_ONE_PART) as pub:
            pub.write(payload(PAST_ONE_PART))
            pub.drain()  # type: ignore[attr-defined] # the parts go up on a thread of their own
            during.append(_uploads(s3_client, s3_bucket))
            raise failure

    with pytest.raises(type(failure)):
        attempt()
    # A part was uploaded, so the test really saw an upload in progress...
    assert [u["Key"] for u in during[0]] == ["run/step-1.rp"]
    # ...which the failure aborted: nothing completed, nothing left to bill.
    assert _uploads(s3_client, s3_bucket) == []
    assert s3_client.get_object(Bucket=s3_bucket, Key="run/step-1.rp")["Body"].read() == (
        b"old object"
    )
    listed = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == ["run/step-1.rp"]


def test_refused_create_only_publish_aborts_its_upload(
    s3_client: Any, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    from restorepoint.errors import AlreadyExists

    s3_client.put_object(Bucket=s3_bucket, Key="x.rp", Body=b"first")
    location = resolve(f"s3://{s3_bucket}/x.rp", s3_storage_options)
    with pytest.raises(AlreadyExists):
        publish_and_fail(location, payload(PAST_ONE_PART), None, create_only=True)
    assert _uploads(s3_client, s3_bucket) == []
    assert s3_client.get_object(Bucket=s3_bucket, Key="x.rp")["Body"].read() == b"first"


# -- the CLI in a subprocess, reaching the server through its environment -------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "model.bin").write_bytes(payload(300_000, seed=1))
    (source / "meta.json").write_text('{"step": 7}')
    return source


def test_cli_pack_then_verify(
    checkpoint: Path, s3_bucket: str, s3_client: Any, s3_env: dict[str, str]
) -> None:
    url = f"s3://{s3_bucket}/runs/x.rp"
    packed = cli("pack", str(checkpoint), url, "--step", "7", "--json", env=s3_env)
    assert packed.returncode == 0, packed.stderr
    result = json.loads(packed.stdout)
    assert result["ok"] is True
    assert result["files"] == 2
    head = s3_client.head_object(Bucket=s3_bucket, Key="runs/x.rp")
    assert head["ContentLength"] == result["size"]
    verified = cli("verify", url, "--json", env=s3_env)
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert (report["ok"], report["id"], report["size"]) == (True, result["id"], result["size"])
    assert _uploads(s3_client, s3_bucket) == []


def test_cli_reaches_the_server_through_aws_endpoint_url(
    checkpoint: Path, s3_bucket: str, s3_server: Any, s3_env: dict[str, str]
) -> None:
    # botocore's own variables are the other way to point a subprocess at the server.
    url = f"s3://{s3_bucket}/x.rp"
    assert cli("pack", str(checkpoint), url, "--step", "1", env=s3_env).returncode == 0
    env = {k: v for k, v in s3_env.items() if k != "FSSPEC_S3"}
    env.update(
        AWS_ENDPOINT_URL=s3_server.endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    verified = cli("verify", url, "--json", env=env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"] is True


def test_cli_missing_bucket_is_not_found(s3_env: dict[str, str]) -> None:
    url = f"s3://rp-no-such-bucket-{uuid.uuid4().hex[:12]}/x.rp"
    proc = cli("verify", url, "--json", env=s3_env)
    assert proc.returncode == 4
    line = one_error_line(proc)
    assert line == f"restorepoint: error: {url}: not found"
    error = json.loads(proc.stdout)["error"]
    assert (error["class"], error["exit_code"], error["url"]) == ("NotFound", 4, url)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("verb", ["verify", "pack"])
def test_cli_unreachable_endpoint_is_one_line_exit_4(
    verb: str, checkpoint: Path, s3_env_factory: Any, s3_options_factory: Any
) -> None:
    # Nothing listens there; one connect attempt of at most a second keeps the test short.
    options = s3_options_factory(
        f"http://127.0.0.1:{_closed_port()}",
        connect_timeout=1,
        read_timeout=1,
        retries={"max_attempts": 1},
    )
    url = "s3://rp-unreachable/x.rp"
    args = ("verify", url) if verb == "verify" else ("pack", str(checkpoint), url, "--step", "1")
    proc = cli(*args, "--json", env=s3_env_factory(options))
    assert proc.returncode == 4
    line = one_error_line(proc)
    assert line.startswith(f"restorepoint: error: {url}: storage unreachable or failing")
    error = json.loads(proc.stdout)["error"]
    assert (error["class"], error["exit_code"]) == ("StorageUnavailable", 4)
