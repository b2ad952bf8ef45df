"""The fault proxy's other faults against S3 (tests/_servers/faults.py): 429 (TooManyRequests),
a body cut short under the full Content-Length, a body cut short under a Content-Length that
matches it (only the length asked for tells), a reset connection, added latency and a capped
bandwidth. A publish and the ranged and streamed reads under each either complete with the
right bytes or fail through the CLI with one line and exit 4; never is anything partial left
under a final name, nor a multipart upload open, nor a short body taken for the data.

And the one request of a publish that is not idempotent, a ``CompleteMultipartUpload`` whose
answer is lost after S3 acted on it: the retry finds the upload gone (``NoSuchUpload``, as S3
answers; moto would answer it again), and the publish is done when the object under the name is
this upload, else it fails with one line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from _servers.faults import FaultProxy, Faults, Rule
from _servers.s3 import s3_env_for, s3_options
from clirun import cli, one_error_line

from restorepoint import pack
from restorepoint.errors import StorageUnavailable
from restorepoint.storage import resolve
from restorepoint.testing.store import checkpoint, payload

pytestmark = pytest.mark.s3

#: A fast policy: a request is given up after 3 tries, a silence after 2 s.
POLICY_ENV = {
    "RESTOREPOINT_STORE_STALL_TIMEOUT": "2",
    "RESTOREPOINT_STORE_BACKOFF": "0.05",
    "RESTOREPOINT_STORE_BACKOFF_CAP": "0.2",
    "RESTOREPOINT_STORE_ATTEMPTS": "3",
}
#: A CompleteMultipartUpload: POST to the key with its upload id (a part is a PUT; the
#: creation is ``POST ...?uploads``).
COMPLETE = r"^POST \S*\?uploadId="
#: An UploadPart.
PART = r"^PUT \S*\?partNumber="
#: A ranged read of an object (a listing is a GET of the bucket with a query).
RANGED_GET = r"^GET /[^?\s]+/[^?\s]+ "


@pytest.fixture
def proxy(s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> FaultProxy:
    for name, value in POLICY_ENV.items():
        monkeypatch.setenv(name, value)
    return s3_fault_proxy


@pytest.fixture
def prefix(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/kinds-{uuid.uuid4().hex[:8]}/"


def _keys(client: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def _uploads(client: Any, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def _get(client: Any, bucket: str, key: str) -> bytes:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()


#: Each fault kind, at a rate or on chosen requests: what the publish and the reads go through.
KINDS = {
    "throttle-429": Faults(throttle=0.3, seed=1),
    "truncated-full-length": Faults(truncate=0.3, seed=2),
    "short-matching-length": Faults(rules=[Rule(RANGED_GET, "short", times=2)]),
    "reset": Faults(reset=0.3, seed=3),
    "latency": Faults(latency_s=0.15),
    "bandwidth": Faults(bandwidth=1 << 20),
}


@pytest.mark.parametrize("faults", KINDS.values(), ids=KINDS.keys())
def test_publish_and_reads_complete_with_the_right_bytes(
    proxy: FaultProxy,
    s3_client: Any,
    s3_bucket: str,
    prefix: str,
    faults: Faults,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A publish (a multipart upload of one part), then ranged reads and a streamed read,
    under the fault: the bytes read are the bytes published, and the proxy did give the
    fault. Under the bandwidth cap a read lasts longer than the stall timeout, which is no
    stall (bytes flow); an upload's last bytes wait in the socket buffers, and the answer comes
    only after them: the stall timeout must exceed what the buffers hold over the bandwidth,
    as the default (20 s) does here."""
    if faults.bandwidth:
        monkeypatch.delenv("RESTOREPOINT_STORE_STALL_TIMEOUT")
    data = payload((1 << 20) + 12_345, seed=7)
    proxy.set(faults)
    location = resolve(prefix + "obj.bin", s3_options(proxy.endpoint, max_pool_connections=4))
    with location.publish(size_hint=len(data)) as pub:
        pub.write(data)
    reader = location.reader()
    try:
        assert reader.size == len(data)
        for start, end in ((0, 100), (4096, 300_000), (len(data) - 10, len(data) + 50)):
            assert reader.read_range(start, end) == data[start:end]
        stream = reader.open_stream(1000)
        assert stream.read() == data[1000:]
        stream.close()
    finally:
        reader.close()
    if faults.latency_s or faults.bandwidth:
        assert proxy.requests > 0
    else:
        assert sum(proxy.injected.values()) > 0, proxy.injected
    proxy.set(Faults())
    key = location.url.removeprefix(f"s3://{s3_bucket}/")
    assert _get(s3_client, s3_bucket, key) == data
    # A reset answer to the upload's creation leaves an upload its writer never learns of
    # (spec 15.5): prune's listing finds it. Every other fault leaves none.
    left = _uploads(s3_client, s3_bucket)
    assert left == [] or (faults.reset and set(left) == {key}), left
    if left:
        store = resolve(prefix, s3_options(proxy.endpoint))
        assert len(store.pending_uploads()) == len(left)


def test_a_short_body_is_never_taken_for_the_data(
    proxy: FaultProxy, s3_bucket: str, prefix: str, tmp_path: Path
) -> None:
    """Every ranged read answered with half its body under a matching Content-Length: HTTP
    sees nothing wrong; the length asked for does. ``verify`` fails with one line and exit 4
    (the store failing), never with bytes that were not the object's, and never passes."""
    store = resolve(prefix, s3_options(proxy.endpoint))
    published = pack(checkpoint(tmp_path / "src", seed=4), store, run="r", position=1)
    proxy.set(Faults(rules=[Rule(RANGED_GET, "short", times=1000)]))
    env = s3_env_for(s3_options(proxy.endpoint))
    env.update(POLICY_ENV)
    result = cli("verify", published.url, env=env)
    assert result.returncode == 4, result.stderr
    line = one_error_line(result)
    assert "unreachable or failing" in line
    assert "asked for" in line
    assert proxy.injected["short"] >= 3  # every try of the first range


@pytest.mark.parametrize("kind", ["throttle", "error", "drop"])
def test_a_fault_that_never_ends_is_one_line_and_exit_4(
    proxy: FaultProxy, s3_client: Any, s3_bucket: str, prefix: str, tmp_path: Path, kind: str
) -> None:
    """Every upload of a part is refused (429, 503) or lost before the server (a reset), every
    try: pack over a restore point through the CLI gives up with one line and exit 4; the name
    holds the previous restore point, whole, nothing else is there, and the upload was aborted
    (the abort is no part upload, and gets through). A part's answer has an empty body: a
    truncated or reset answer to it has lost nothing, and the publish completes (above)."""
    url = prefix + "ckpt.rp"
    pack(checkpoint(tmp_path / "old", seed=5), resolve(url, s3_options(proxy.endpoint)), position=1)
    key = url.removeprefix(f"s3://{s3_bucket}/")
    before = _get(s3_client, s3_bucket, key)
    proxy.set(Faults(rules=[Rule(PART, kind, times=1000)]))
    env = s3_env_for(s3_options(proxy.endpoint))
    env.update(POLICY_ENV)
    result = cli("pack", str(checkpoint(tmp_path / "new", seed=6)), url, "--step", "2", env=env)
    assert result.returncode == 4, result.stderr
    assert "unreachable or failing" in one_error_line(result)
    assert proxy.injected[kind] >= int(POLICY_ENV["RESTOREPOINT_STORE_ATTEMPTS"])
    proxy.set(Faults())
    assert _get(s3_client, s3_bucket, key) == before
    assert _keys(s3_client, s3_bucket) == [key]
    assert _uploads(s3_client, s3_bucket) == []


# -- a lost answer to the commit ----------------------------------------------------------


LOST = {
    # S3 answers the retry NoSuchUpload (moto would complete it again)
    "then-no-such-upload": [Rule(COMPLETE, "reset"), Rule(COMPLETE, "no_such_upload")],
    # every answer lost (reset, or cut short under its full length): the tries are spent,
    # and the object is looked at
    "every-answer-reset": [Rule(COMPLETE, "reset", times=3)],
    "every-answer-truncated": [Rule(COMPLETE, "truncate", times=3)],
}


@pytest.mark.parametrize("rules", LOST.values(), ids=LOST.keys())
@pytest.mark.parametrize("create_only", [False, True], ids=["replace", "create-only"])
def test_a_commit_whose_answer_was_lost_is_a_publish(
    proxy: FaultProxy,
    s3_client: Any,
    s3_bucket: str,
    prefix: str,
    create_only: bool,
    rules: list[Rule],
) -> None:
    """The complete reaches S3, which completes the upload; the answer is lost (a reset). The
    object under the name is this upload (its size and multipart ETag): the publish
    succeeded, and says so."""
    data = payload(300_000, seed=8)
    location = resolve(prefix + "obj.bin", s3_options(proxy.endpoint))
    proxy.set(Faults(rules=[Rule(r.pattern, r.kind, r.times) for r in rules]))
    with location.publish(size_hint=len(data), create_only=create_only) as pub:
        pub.write(data)
    assert proxy.injected == {r.kind: r.times for r in rules}
    proxy.set(Faults())
    assert _get(s3_client, s3_bucket, location.url.removeprefix(f"s3://{s3_bucket}/")) == data
    assert _uploads(s3_client, s3_bucket) == []


def test_a_commit_that_never_landed_fails_with_one_line(
    proxy: FaultProxy, s3_client: Any, s3_bucket: str, prefix: str, tmp_path: Path
) -> None:
    """The complete is lost before S3 sees it, and the retry is answered NoSuchUpload (as if
    the upload had been aborted meanwhile): the object under the name is the previous one, so
    the publish failed: one line, exit 4, the previous restore point intact, no upload open."""
    url = prefix + "ckpt.rp"
    pack(checkpoint(tmp_path / "old", seed=9), resolve(url, s3_options(proxy.endpoint)), position=1)
    key = url.removeprefix(f"s3://{s3_bucket}/")
    before = _get(s3_client, s3_bucket, key)
    proxy.set(Faults(rules=[Rule(COMPLETE, "drop"), Rule(COMPLETE, "no_such_upload")]))
    env = s3_env_for(s3_options(proxy.endpoint))
    env.update(POLICY_ENV)
    result = cli("pack", str(checkpoint(tmp_path / "new", seed=10)), url, "--step", "2", env=env)
    assert result.returncode == 4, result.stderr
    assert "answer was lost" in one_error_line(result)
    assert proxy.injected == {"drop": 1, "no_such_upload": 1}
    proxy.set(Faults())
    assert _get(s3_client, s3_bucket, key) == before
    assert _uploads(s3_client, s3_bucket) == []


def test_a_lost_answer_then_another_writer_is_not_taken_for_this_upload(
    proxy: FaultProxy, s3_client: Any, s3_bucket: str, prefix: str
) -> None:
    """The API: the complete is lost before S3 sees it, another writer's object lands under
    the name, and the retry is answered NoSuchUpload. Its size or ETag is not this upload's:
    StorageUnavailable, and the other writer's object stays."""
    location = resolve(prefix + "obj.bin", s3_options(proxy.endpoint))
    key = location.url.removeprefix(f"s3://{s3_bucket}/")
    data = payload(200_000, seed=11)

    proxy.set(Faults(rules=[Rule(COMPLETE, "drop"), Rule(COMPLETE, "no_such_upload")]))
    with (  # noqa: PT012 - the other writer's put comes inside the publish
        pytest.raises(StorageUnavailable, match="answer was lost"),
        location.publish(size_hint=len(data)) as pub,
    ):
        pub.write(data)
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=data)  # same bytes, one part
    proxy.set(Faults())
    assert _get(s3_client, s3_bucket, key) == data
    assert _uploads(s3_client, s3_bucket) == []


def test_pack_deadline_cuts_retries_short_through_the_cli(
    proxy: FaultProxy, s3_client: Any, s3_bucket: str, prefix: str, tmp_path: Path
) -> None:
    """``pack --deadline 2`` against a store answering 503 for ever, under a policy that would
    retry each request for minutes: the CLI gives up by the deadline, one line, exit 4, and
    the previous restore point is what the name holds."""
    url = prefix + "ckpt.rp"
    pack(
        checkpoint(tmp_path / "old", seed=12), resolve(url, s3_options(proxy.endpoint)), position=1
    )
    key = url.removeprefix(f"s3://{s3_bucket}/")
    before = _get(s3_client, s3_bucket, key)
    proxy.set(Faults(error=1.0))
    env = s3_env_for(s3_options(proxy.endpoint))
    env.update(
        RESTOREPOINT_STORE_ATTEMPTS="1000",
        RESTOREPOINT_STORE_BACKOFF="1",
        RESTOREPOINT_STORE_BACKOFF_CAP="1",
    )
    source = str(checkpoint(tmp_path / "new", seed=13))
    result = cli("pack", source, url, "--step", "2", "--deadline", "2", env=env, timeout=90)
    assert result.returncode == 4, result.stderr
    assert "the deadline is near" in one_error_line(result)
    assert proxy.injected["error"] < 1000
    proxy.set(Faults())
    assert _get(s3_client, s3_bucket, key) == before
    result = cli("pack", source, url, "--step", "2", "--deadline", "0", env=env)
    assert result.returncode == 2
    assert "--deadline" in one_error_line(result)


@pytest.mark.gcs
def test_a_short_body_is_never_taken_for_the_data_on_gcs(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    """The same on GCS: a ranged read answered with half its body under a matching length
    fails (StorageUnavailable), never returns the half; with the proxy healthy it reads whole."""
    from _servers.gcs import gcs_options

    data = payload(100_000, seed=14)
    location = resolve(f"gs://{gcs_bucket}/short/obj.bin", gcs_options(gcs_fault_proxy.endpoint))
    with location.publish(size_hint=len(data)) as pub:
        pub.write(data)
    reader = location.reader()
    try:
        gcs_fault_proxy.set(Faults(rules=[Rule(r"^GET \S*alt=media", "short", times=1000)]))
        with pytest.raises(StorageUnavailable, match="asked for 50000 bytes"):
            reader.read_range(1000, 51_000)
        assert gcs_fault_proxy.injected["short"] >= 1
        gcs_fault_proxy.set(Faults())
        assert reader.read_range(1000, 51_000) == data[1000:51_000]
    finally:
        reader.close()


#: A listing: a GET of the bucket itself, with a query (``list-type=2``, the prefix).
LISTING = r"^GET /[^/?\s]+/?\?"


def test_a_store_that_cannot_be_listed_gets_a_full_restore_point(
    proxy: FaultProxy, s3_client: Any, s3_bucket: str, prefix: str, tmp_path: Path
) -> None:
    """Publishing into a store is incremental by default, which lists the run's restore points
    first (spec 28.4, W4c). A store that takes writes but never answers a listing (every try
    503) still gets its restore point, a full one that says why, and it verifies whole."""
    env = s3_env_for(s3_options(proxy.endpoint))
    env.update(POLICY_ENV)
    source = str(checkpoint(tmp_path / "src", seed=7))
    proxy.set(Faults(rules=[Rule(LISTING, "error", times=1000)]))
    result = cli("pack", source, prefix, "--run", "r1", "--step", "1", "--json", env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["incremental"]["reused"] == 0
    assert "cannot be listed" in out["incremental"]["reason"]
    assert proxy.injected["error"] >= int(POLICY_ENV["RESTOREPOINT_STORE_ATTEMPTS"])
    proxy.set(Faults())
    assert _uploads(s3_client, s3_bucket) == []
    verified = cli("verify", out["url"], env=env)
    assert verified.returncode == 0, verified.stderr
