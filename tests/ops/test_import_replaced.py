"""An object replaced while it is imported. On a store read by name (S3, GCS, any fsspec
backend) every range is a new request for whatever the name holds by then. The import gate
decides on one head; the import must then unpack that restore point or nothing, never another
object that the gate never saw (which it may well have refused)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import restorepoint
from restorepoint import IntegrityError, StorageUnavailable
from restorepoint.ops import unpack
from restorepoint.ops.gate import Expectations

FILES_A = {"model.bin": os.urandom(300_000), "state.json": b'{"step": 7}'}
FILES_B = {"model.bin": os.urandom(300_000), "state.json": b'{"step": 8}'}
EXPECT = Expectations(terms={"torch": "2.13.0"})


def packed(tmp_path: Path, name: str, files: dict[str, bytes], torch: str) -> bytes:
    source = tmp_path / f"src-{name}"
    source.mkdir()
    for rel, data in files.items():
        (source / rel).write_bytes(data)
    out = tmp_path / f"{name}.rp"
    restorepoint.pack(source, str(out), position=7, terms={"torch": torch}, chunk_size=65536)
    return out.read_bytes()


@pytest.fixture
def objects(tmp_path: Path) -> tuple[bytes, bytes]:
    """A, which the gate accepts, and B, another restore point it would refuse, of the same
    size (so that only what is read, not a size taken once, can tell them apart)."""
    a, b = packed(tmp_path, "a", FILES_A, "2.13.0"), packed(tmp_path, "b", FILES_B, "9.99.9")
    assert len(a) == len(b)
    return a, b


def replace_after(monkeypatch: pytest.MonkeyPatch, step: str, replace: Callable[[], None]) -> None:
    """Run ``replace`` once the import reaches ``step``: "gate" (the gate has decided, the
    index is not read yet) or "manifest" (the index is read, the payload is not)."""
    name = {"gate": "_check_destination", "manifest": "_clean_leftovers"}[step]
    original = getattr(unpack, name)

    def hooked(*args: Any) -> Any:
        replace()
        return original(*args)

    monkeypatch.setattr(unpack, name, hooked)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- read by name, nothing pinned (memory://, and what GCS does) ------------------------------


@pytest.fixture
def memory_url() -> Iterator[str]:
    root = f"rp-replaced-{uuid.uuid4().hex}"
    yield f"memory://{root}/x.rp"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{root}"):
        fs.rm(f"/{root}", recursive=True)


def test_the_head_the_gate_read_is_the_one_imported(
    tmp_path: Path,
    objects: tuple[bytes, bytes],
    memory_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The import read the head a second time after the gate: replaced in between, B was
    # imported, though the gate refuses it. Now the head is read once, and B's index (which
    # names B's head) does not belong to it.
    a, b = objects
    fs = fsspec.filesystem("memory")
    fs.pipe_file(memory_url, b)
    with pytest.raises(restorepoint.IncompatibleRestorePoint):
        restorepoint.check(memory_url, EXPECT)  # the gate refuses B
    fs.pipe_file(memory_url, a)
    assert restorepoint.check(memory_url, EXPECT).compatible  # and accepts A
    replace_after(monkeypatch, "gate", lambda: fs.pipe_file(memory_url, b))
    dest = tmp_path / "out" / "dest"
    with pytest.raises(IntegrityError) as info:
        restorepoint.import_restore_point(memory_url, dest, expect=EXPECT)
    assert info.value.exit_code == 1
    assert not dest.exists() and not dest.parent.exists()


# -- S3: every read of one import names one object ------------------------------------------

s3 = pytest.mark.s3


@pytest.fixture
def versioned(s3_client: Any, s3_bucket: str) -> Iterator[str]:
    """The bucket, keeping versions; they are all deleted after the test, so that the bucket
    can go."""
    s3_client.put_bucket_versioning(Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    yield s3_bucket
    listing = s3_client.list_object_versions(Bucket=s3_bucket)
    for item in listing.get("Versions", []) + listing.get("DeleteMarkers", []):
        s3_client.delete_object(Bucket=s3_bucket, Key=item["Key"], VersionId=item["VersionId"])


@s3
@pytest.mark.parametrize("step", ["gate", "manifest"])
def test_s3_a_replaced_object_is_not_read_in_parts(
    tmp_path: Path,
    objects: tuple[bytes, bytes],
    s3_client: Any,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    # Without versions, the reads carry If-Match with the ETag the import opened: the
    # replaced object is refused as a whole, retryable, and nothing is written.
    a, b = objects
    s3_client.put_object(Bucket=s3_bucket, Key="x.rp", Body=a)
    replace_after(
        monkeypatch, step, lambda: s3_client.put_object(Bucket=s3_bucket, Key="x.rp", Body=b)
    )
    dest = tmp_path / "out" / "dest"
    with pytest.raises(StorageUnavailable, match="replaced while it was read") as info:
        restorepoint.import_restore_point(
            f"s3://{s3_bucket}/x.rp", dest, expect=EXPECT, storage_options=s3_storage_options
        )
    assert info.value.retryable and info.value.exit_code == 4
    # no DEST, and no staging directory left beside it
    assert not dest.exists()
    assert not dest.parent.exists() or os.listdir(dest.parent) == []


@s3
@pytest.mark.parametrize("step", ["gate", "manifest"])
def test_s3_versioned_the_object_the_gate_read_is_imported_whole(
    tmp_path: Path,
    objects: tuple[bytes, bytes],
    s3_client: Any,
    versioned: str,
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    # With versions, every read names the VersionId the import opened: A is imported, every
    # byte of it, though the name holds B by then.
    a, b = objects
    s3_client.put_object(Bucket=versioned, Key="x.rp", Body=a)
    replace_after(
        monkeypatch, step, lambda: s3_client.put_object(Bucket=versioned, Key="x.rp", Body=b)
    )
    dest = tmp_path / "dest"
    result = restorepoint.import_restore_point(
        f"s3://{versioned}/x.rp", dest, expect=EXPECT, storage_options=s3_storage_options
    )
    assert tree(dest) == FILES_A
    assert result.manifest.terms == {"torch": "2.13.0"}
    body = s3_client.get_object(Bucket=versioned, Key="x.rp")["Body"]
    assert body.read() == b  # the name did hold B
    body.close()
