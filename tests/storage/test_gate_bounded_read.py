"""The gate's bounded read (spec section 16), measured on a real S3 server (moto, through s3fs):
a refusal of a large restore point costs at most GATE_PREFIX_MAX bytes of what the server
returns, for `check` and for `import` alike, while verify() of the same object reads it all."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fsspec.asyn import sync_wrapper
from s3fs import S3FileSystem

import restorepoint
from restorepoint import Expectations, IncompatibleRestorePoint
from restorepoint.format.limits import GATE_PREFIX_MAX
from restorepoint.storage import S3Location

pytestmark = pytest.mark.s3

PAYLOAD_BYTES = 200 << 20
BLOCK = 1 << 20


@dataclass
class Meter:
    """What the server returned for object bodies: declared (Content-Length) and read."""

    responses: int = 0
    declared: int = 0
    read: int = 0

    def reset(self) -> None:
        self.responses = self.declared = self.read = 0


class _CountingBody:
    """A response body that counts the bytes s3fs takes from it."""

    def __init__(self, body: Any, meter: Meter) -> None:
        self._body = body
        self._meter = meter

    async def read(self, *args: Any) -> bytes:
        data: bytes = await self._body.read(*args)
        self._meter.read += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class CountingS3FileSystem(S3FileSystem):
    """The real s3fs filesystem, counting every object byte the server sends back.

    Why ``_call_s3`` covers every path our reader uses: object bytes reach s3fs only as the body
    of a ``get_object`` response, and s3fs makes every S3 request through ``_call_s3``: the range
    reads of ``cat_file`` (the reader's ``read_range``: head and index), the ranges that
    ``S3File._fetch_range`` fetches for a readahead stream (the reader's ``open_stream``: the
    payload), and whole or concurrent ``cat``/``get``. The size comes from ``head_object``, which
    has no body. ``call_s3``, the sync twin, is rebound so that it, too, goes through here."""

    meter: Meter

    async def _call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
        out = await super()._call_s3(method, *args, **kwargs)
        if method == "get_object":
            self.meter.responses += 1
            # Content-Length: what the server sent for this body, whether or not it was read.
            self.meter.declared += int(out.get("ContentLength") or 0)
            out["Body"] = _CountingBody(out["Body"], self.meter)
        return out

    call_s3 = sync_wrapper(_call_s3)


@dataclass(frozen=True)
class Large:
    url: str
    bucket: str
    key: str
    options: dict[str, Any]
    manifest: restorepoint.Manifest


@pytest.fixture(scope="module")
def large(
    s3_server: Any, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Large]:
    """One store-only restore point with a 200 MiB payload, packed to S3 once for the module."""
    bucket = f"rp-gate-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    source = tmp_path_factory.mktemp("large-source")
    block = os.urandom(BLOCK)
    with open(source / "weights.bin", "wb") as f:
        for _ in range(PAYLOAD_BYTES // BLOCK):
            f.write(block)
    (source / "state.json").write_bytes(b'{"step": 9000}')
    url = f"s3://{bucket}/run/step-9000.rp"
    options = s3_server.storage_options()
    result = restorepoint.pack(
        source,
        url,
        position=9000,
        trainer=("fake-trainer", "1.0.0"),
        terms={"cuda": "12.4", "torch": "2.13.0"},
        config={"lr": 0.001, "train": {"checkpoint_every": 500}},
        operational_keys=["train.checkpoint_every"],
        cache_keys={"dataset": "tok-v3"},
        cache_root="s3://cache/run",
        level=0,
        storage_options=options,
    )
    (source / "weights.bin").unlink()
    try:
        yield Large(url, bucket, "run/step-9000.rp", options, result.manifest)
    finally:
        s3_client.delete_object(Bucket=bucket, Key="run/step-9000.rp")
        s3_client.delete_bucket(Bucket=bucket)


@pytest.fixture
def counted(large: Large) -> tuple[S3Location, Meter]:
    fs = CountingS3FileSystem(skip_instance_cache=True, **large.options)
    fs.meter = Meter()
    location = S3Location(large.url, fs, f"{large.bucket}/{large.key}")
    return location, fs.meter


WRONG = Expectations(
    trainer=restorepoint.Trainer("fake-trainer", "2.0.0"),
    terms={"cuda": "12.1", "torch": "2.13.0"},
    config={"lr": 0.01, "train": {"checkpoint_every": 500}},
)
WRONG_FIELDS = [
    {"field": "trainer", "expected": "fake-trainer=2.0.0", "found": "fake-trainer=1.0.0"},
    {"field": "terms.cuda", "expected": "12.1", "found": "12.4"},
    {"field": "config.lr", "expected": 0.01, "found": 0.001},
]


def test_the_object_is_large(large: Large, s3_client: Any) -> None:
    size = s3_client.head_object(Bucket=large.bucket, Key=large.key)["ContentLength"]
    assert size > PAYLOAD_BYTES
    assert large.manifest.total_size == PAYLOAD_BYTES + len(b'{"step": 9000}')


def test_check_refusal_reads_at_most_the_gate_prefix(
    counted: tuple[S3Location, Meter],
) -> None:
    location, meter = counted
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.check(location, WRONG)
    print(f"check refusal: {meter.declared} bytes returned in {meter.responses} response(s)")
    assert info.value.mismatches == WRONG_FIELDS
    assert info.value.url == location.url
    assert meter.responses > 0
    assert 0 < meter.read <= meter.declared <= GATE_PREFIX_MAX


def test_check_acceptance_reads_at_most_the_gate_prefix(
    large: Large, counted: tuple[S3Location, Meter]
) -> None:
    location, meter = counted
    expect = Expectations(terms=dict(large.manifest.terms), cache_root="s3://cache/run")
    assert restorepoint.check(location, expect).compatible
    assert 0 < meter.declared <= GATE_PREFIX_MAX


def test_import_refusal_reads_at_most_the_gate_prefix_and_writes_nothing(
    tmp_path: Path, counted: tuple[S3Location, Meter]
) -> None:
    location, meter = counted
    dest = tmp_path / "restore" / "DEST"
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.import_restore_point(location, dest, expect=WRONG)
    print(f"import refusal: {meter.declared} bytes returned in {meter.responses} response(s)")
    assert info.value.mismatches == WRONG_FIELDS
    assert 0 < meter.declared <= GATE_PREFIX_MAX
    assert not dest.exists()
    assert not dest.parent.exists()
    assert list(tmp_path.iterdir()) == []


def test_verify_reads_the_whole_payload_through_the_same_counter(
    large: Large, counted: tuple[S3Location, Meter]
) -> None:
    # The control: the counter sees payload reads, so the bounds above are not vacuous.
    location, meter = counted
    report = restorepoint.verify(location)
    print(f"verify: {meter.declared} bytes returned in {meter.responses} response(s)")
    assert report.manifest.id == large.manifest.id
    assert meter.read >= PAYLOAD_BYTES
    assert meter.declared >= meter.read
