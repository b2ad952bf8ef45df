"""Store checks that do not fit the conformance suite: the leftovers only one backend has, and
how prune treats them.

- S3: a killed publisher leaves an incomplete multipart upload (invisible, but billed). prune
  lists and aborts those under the store prefix (of the run, with --run) once they are older
  than the grace period, and only those.
- local files: a killed publisher leaves its temporary file (".NAME.rp-partial-PID-HEX"). prune
  removes it once it is older than the grace period, but never while the PID in its name runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from restorepoint import list_store, pack, prune, verify
from restorepoint.ops.store import DEFAULT_GRACE_S
from restorepoint.testing.store import checkpoint, dead_pid

# -- S3: incomplete multipart uploads -------------------------------------------------------

#: Under its store name, as a publisher killed during its upload leaves it.
IN_RUN_A = "store/run-a/0000000000000002-20260101T000000000Z-abcdef123456.rp"
IN_RUN_B = "store/run-b/0000000000000001-20260101T000000000Z-123456abcdef.rp"
#: Not in the store: a neighbouring prefix that merely starts with the same letters, and
#: another prefix of the bucket.
NEIGHBOUR = "store-other/run-a/0000000000000001-20260101T000000000Z-abcdef123456.rp"
ELSEWHERE = "elsewhere/x.rp"


def _start_upload(client: Any, bucket: str, key: str) -> str:
    """A real incomplete multipart upload: created, one part uploaded, never completed."""
    upload_id = str(client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    client.upload_part(
        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"part of an object"
    )
    return upload_id


def _uploads(client: Any, bucket: str) -> dict[str, str]:
    found = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return {u["Key"]: u["UploadId"] for u in found}


@pytest.mark.s3
def test_prune_aborts_incomplete_uploads_only_past_the_grace_period(
    s3_client: Any, s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    store = f"s3://{s3_bucket}/store/"
    options = s3_storage_options
    kept = pack(
        checkpoint(tmp_path / "src", 1), store, position=1, run="run-a", storage_options=options
    )
    ids = {
        key: _start_upload(s3_client, s3_bucket, key)
        for key in (IN_RUN_A, IN_RUN_B, NEIGHBOUR, ELSEWHERE)
    }
    assert _uploads(s3_client, s3_bucket) == ids
    listed = s3_client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]
    # The age is the server's Initiated time (moto answers a fixed one, in 2010), so `now`
    # is set from it rather than from this machine's clock, and nothing sleeps.
    initiated = max(u["Initiated"].timestamp() for u in listed)
    young, old = initiated + 60, initiated + DEFAULT_GRACE_S + 60

    def leftover(key: str) -> str:
        return f"s3://{s3_bucket}/{key} (incomplete upload {ids[key]})"

    # Younger than the grace period: it may be a live upload, so it stays.
    report = prune(store, keep_last=1, storage_options=options, now=young)
    assert (report.deleted, report.leftovers) == ([], [])
    assert _uploads(s3_client, s3_bucket) == ids
    # A dry run says what it would abort, and aborts nothing.
    report = prune(store, keep_last=1, storage_options=options, now=old, dry_run=True)
    assert sorted(report.leftovers) == sorted([leftover(IN_RUN_A), leftover(IN_RUN_B)])
    assert _uploads(s3_client, s3_bucket) == ids
    # --run: only that run's uploads.
    report = prune(store, keep_last=1, run="run-a", storage_options=options, now=old)
    assert report.leftovers == [leftover(IN_RUN_A)]
    assert _uploads(s3_client, s3_bucket) == {k: ids[k] for k in (IN_RUN_B, NEIGHBOUR, ELSEWHERE)}
    # A shorter grace period makes a two-hour-old upload a leftover.
    report = prune(store, keep_last=1, storage_options=options, now=initiated + 7200)
    assert report.leftovers == []
    report = prune(store, keep_last=1, storage_options=options, now=initiated + 7200, grace="1h")
    assert report.leftovers == [leftover(IN_RUN_B)]
    # What is outside the store prefix is never prune's, however old.
    assert _uploads(s3_client, s3_bucket) == {k: ids[k] for k in (NEIGHBOUR, ELSEWHERE)}
    report = prune(store, keep_last=1, storage_options=options, now=old + 10 * DEFAULT_GRACE_S)
    assert report.leftovers == []
    assert _uploads(s3_client, s3_bucket) == {k: ids[k] for k in (NEIGHBOUR, ELSEWHERE)}
    # The restore point itself went through all of it untouched.
    assert [e.url for e in list_store(store, storage_options=options)] == [kept.url]
    assert verify(kept.url, storage_options=options).manifest.id == kept.id


# -- local files: temporary files of killed publishers ------------------------------------


def test_local_prune_never_removes_the_partial_of_a_live_writer(tmp_path: Path) -> None:
    store = tmp_path / "store"
    kept = pack(checkpoint(tmp_path / "src", 2), f"{store}/", position=1, run="run-a")
    run_dir = store / "run-a"
    live = run_dir / f".a.rp.rp-partial-{os.getpid()}-abcdef123456"
    dead = run_dir / f".b.rp.rp-partial-{dead_pid()}-abcdef123456"
    young = run_dir / f".c.rp.rp-partial-{dead_pid()}-abcdef123456"
    for path in (live, dead, young):
        path.write_bytes(b"half of a restore point")
    # Aged by their modification time, which is what prune reads for local files.
    long_ago = time.time() - 2 * DEFAULT_GRACE_S
    for path in (live, dead):
        os.utime(path, (long_ago, long_ago))
    report = prune(f"{store}/", keep_last=1)
    assert report.deleted == []
    assert report.leftovers == [f"{store}/run-a/{dead.name}"]
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [live.name, young.name, kept.url.rsplit("/", 1)[1]]
    )
    # The young one goes once it is old enough, and the live one still stays.
    report = prune(f"{store}/", keep_last=1, now=time.time() + 2 * DEFAULT_GRACE_S)
    assert report.leftovers == [f"{store}/run-a/{young.name}"]
    assert live.exists()
    assert verify(kept.url).manifest.id == kept.id
