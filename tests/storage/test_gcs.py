"""The store suite on GCS (fake-gcs-server, through gcsfs), and what only GCS promises: a failed
or killed publish leaves no object and no visible partial (a resumable upload is invisible until
its last request), restorepoint never relies on create-only uploads (the emulator ignores them),
and the CLI reaches the emulator through its environment, either way gcsfs reads it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint import latest, list_store, pack, prune, verify
from restorepoint.errors import AlreadyExists
from restorepoint.storage import resolve
from restorepoint.testing.store import StoreConformance, checkpoint, payload, publish_and_fail

pytestmark = pytest.mark.gcs

#: Past the 16 MiB block the deferred publisher buffers, so a chunk of the resumable upload
#: reaches the server before the commit.
PAST_ONE_CHUNK = (16 << 20) + 4096


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key


class TestGCSStore(StoreConformance):
    publish_size = PAST_ONE_CHUNK

    @pytest.fixture(autouse=True)
    def _server(self, gcs_server: Any) -> None:
        self.server = gcs_server

    @pytest.fixture
    def base_url(self, gcs_bucket: str) -> str:
        return f"gs://{gcs_bucket}/prefix-{uuid.uuid4().hex[:8]}/"

    @pytest.fixture
    def storage_options(self, gcs_storage_options: dict[str, Any]) -> dict[str, Any]:
        return gcs_storage_options

    @pytest.fixture
    def store_env(self, gcs_env: dict[str, str]) -> dict[str, str]:
        return gcs_env

    def raw_get(self, url: str) -> bytes:
        return bytes(self.server.get(*_split(url)))

    def raw_put(self, url: str, data: bytes) -> None:
        self.server.put(*_split(url), data)

    def raw_list(self, prefix: str) -> list[str]:
        bucket, key = _split(prefix)
        return sorted(name.removeprefix(key) for name in self.server.list(bucket, key))


def test_gcs_declares_no_create_only_and_no_pending_uploads(
    gcs_storage_options: dict[str, Any],
) -> None:
    # With the options: without a token gcsfs would go looking for credentials.
    abilities = resolve("gs://rp-abilities/x.rp", gcs_storage_options).abilities
    assert abilities.deferred_commit
    # Nothing may count on the emulator's (ignored) create-only, nor list resumable uploads:
    # GCS has no API that lists them.
    assert not abilities.create_only
    assert not abilities.pending_uploads


@pytest.mark.parametrize("old_object", [True, False], ids=["replacing", "fresh"])
@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()], ids=repr)
def test_failed_publish_leaves_no_object_and_no_visible_partial(
    gcs_server: Any,
    gcs_bucket: str,
    gcs_storage_options: dict[str, Any],
    failure: BaseException,
    old_object: bool,
) -> None:
    if old_object:
        gcs_server.put(gcs_bucket, "run/step-1.rp", b"old object")
    location = resolve(f"gs://{gcs_bucket}/run/step-1.rp", gcs_storage_options)
    during: list[list[str]] = []

    def attempt() -> None:
        with location.publish(size_hint=PAST_ONE_CHUNK) as pub:
            pub.write(payload(PAST_ONE_CHUNK))
            pub.drain()  # type: ignore[attr-defined] # the parts go up on a thread of their own
            during.append(gcs_server.list(gcs_bucket))
            raise failure

    with pytest.raises(type(failure)):
        attempt()
    # A chunk went to the server, so the test really saw an upload in progress...
    started = gcs_server.requests(f"/upload/storage/v1/b/{gcs_bucket}/o?")
    assert any("uploadType=resumable" in line for line in started), started
    # ...of which nothing was visible, neither under the name nor under any temporary one...
    assert during == [["run/step-1.rp"] if old_object else []]
    # ...and which the failure cancelled (GCS answers 499 to the DELETE of an upload)...
    cancelled = gcs_server.requests(f"DELETE /upload/storage/v1/b/{gcs_bucket}/o?")
    assert len(cancelled) == 1, cancelled
    assert '" 499 ' in cancelled[0], cancelled
    # ...nor is anything after the failure: the old object (if any) untouched.
    assert gcs_server.list(gcs_bucket) == (["run/step-1.rp"] if old_object else [])
    if old_object:
        assert gcs_server.get(gcs_bucket, "run/step-1.rp") == b"old object"


def test_killed_publisher_leaves_nothing_to_list_or_prune(
    gcs_server: Any,
    gcs_bucket: str,
    gcs_storage_options: dict[str, Any],
    gcs_env: dict[str, str],
) -> None:
    store = f"gs://{gcs_bucket}/store/"
    name = "run-k/0000000000000001-20260101T000000000Z-abcdef123456.rp"
    # A writer killed with SIGKILL half-way through its upload: no discard, no cleanup.
    writer = (
        "import json, os, signal, sys\n"
        "from restorepoint.storage import resolve\n"
        "loc = resolve(sys.argv[1], json.loads(sys.argv[2]))\n"
        "pub = loc.publisher(size_hint=int(sys.argv[3]), create_only=True)\n"
        "pub.write(os.urandom(int(sys.argv[3])))\n"
        "pub.drain()\n"  # the parts go up on the publisher's upload thread
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            writer,
            store + name,
            json.dumps(gcs_storage_options),
            str(PAST_ONE_CHUNK),
        ],
        env=gcs_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert gcs_server.requests(f"/upload/storage/v1/b/{gcs_bucket}/o?"), "no upload started"
    assert gcs_server.list(gcs_bucket) == []
    assert list_store(store, storage_options=gcs_storage_options) == []
    # GCS cannot list resumable uploads (they expire after a week), so prune has nothing to
    # clean and says so.
    report = prune(store, keep_last=1, storage_options=gcs_storage_options, now=4_000_000_000)
    assert (report.deleted, report.leftovers, report.runs) == ([], [], [])


def test_create_only_publish_over_an_existing_object(
    gcs_server: Any, gcs_bucket: str, gcs_storage_options: dict[str, Any]
) -> None:
    location = resolve(f"gs://{gcs_bucket}/x.rp", gcs_storage_options)
    with location.publish() as pub:
        pub.write(b"first")
    refused = False
    try:
        publish_and_fail(location, b"second", None, create_only=True)
    except AlreadyExists:
        refused = True
    # restorepoint does ask for a create-only upload (real GCS answers 412 to it)...
    asked = gcs_server.requests("ifGenerationMatch=0")
    assert any(f"/b/{gcs_bucket}/o?" in line and "x.rp" in line for line in asked), asked
    if not refused:
        # ...which the emulator ignores: it replaced the object. What real GCS does cannot be
        # shown here; the store's safety does not depend on it (see the next test).
        assert gcs_server.get(gcs_bucket, "x.rp") == b"second"
        pytest.xfail(
            "fake-gcs-server ignores ifGenerationMatch=0 and replaces the object (real GCS "
            "answers 412); restorepoint declares no create_only for gcs:// and relies on "
            "unique store names instead"
        )
    assert gcs_server.get(gcs_bucket, "x.rp") == b"first"
    assert gcs_server.list(gcs_bucket) == ["x.rp"]


def test_store_safety_does_not_rely_on_create_only(
    gcs_server: Any, gcs_bucket: str, gcs_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    store = f"gs://{gcs_bucket}/store/"
    created = "2026-12-01T09:45:12.345Z"
    # Two publishers of the same run, step and millisecond: the names still differ (the id
    # is in the name), so neither could replace the other even where create-only is ignored.
    results = [
        pack(
            checkpoint(tmp_path / f"src-{i}", i),
            store,
            position=9,
            run="same",
            created=created,
            storage_options=gcs_storage_options,
        )
        for i in (0, 1)
    ]
    assert results[0].url != results[1].url
    assert gcs_server.list(gcs_bucket) == sorted(
        r.url.removeprefix(f"gs://{gcs_bucket}/") for r in results
    )
    entries = list_store(store, storage_options=gcs_storage_options)
    assert sorted(e.url for e in entries) == sorted(r.url for r in results)
    for result in results:
        assert verify(result.url, storage_options=gcs_storage_options).manifest.id == result.id
    assert latest(store, storage_options=gcs_storage_options).url == entries[0].url


# -- the CLI in a subprocess, reaching the emulator through its environment ----------------


@pytest.mark.parametrize("via", ["fsspec", "emulator-host"])
def test_cli_pack_verify_inspect_round_trip(
    via: str, gcs_bucket: str, gcs_server: Any, gcs_env_factory: Any, tmp_path: Path
) -> None:
    env = gcs_env_factory(via)
    source = checkpoint(tmp_path / "checkpoint", 1, size=300_000)
    url = f"gs://{gcs_bucket}/runs/x.rp"
    packed = cli("pack", str(source), url, "--step", "7", "--json", env=env)
    assert packed.returncode == 0, packed.stderr
    result = json.loads(packed.stdout)
    assert (result["ok"], result["files"]) == (True, 2)
    assert len(gcs_server.get(gcs_bucket, "runs/x.rp")) == result["size"]
    verified = cli("verify", url, "--json", env=env)
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert (report["ok"], report["id"], report["size"]) == (True, result["id"], result["size"])
    inspected = cli("inspect", url, "--json", env=env)
    assert inspected.returncode == 0, inspected.stderr
    manifest = json.loads(inspected.stdout)["manifest"]
    assert (manifest["id"], manifest["position"]["step"]) == (result["id"], 7)
    assert sorted(e["path"] for e in manifest["payload"]) == ["meta.json", "model.bin"]
    assert gcs_server.list(gcs_bucket) == ["runs/x.rp"]


def test_cli_store_round_trip_with_latest(
    gcs_bucket: str, gcs_server: Any, gcs_env: dict[str, str], tmp_path: Path
) -> None:
    source = checkpoint(tmp_path / "checkpoint", 2)
    store = f"gs://{gcs_bucket}/store/"
    packed = cli("pack", str(source), store, "--run", "r1", "--step", "8", "--json", env=gcs_env)
    assert packed.returncode == 0, packed.stderr
    into = json.loads(packed.stdout)
    assert gcs_server.list(gcs_bucket) == [into["url"].removeprefix(f"gs://{gcs_bucket}/")]
    verified = cli("verify", store, "--latest", "--json", env=gcs_env)
    assert verified.returncode == 0, verified.stderr
    assert (json.loads(verified.stdout)["id"], into["position"]["step"]) == (into["id"], 8)
    inspected = cli("inspect", store, "--latest", "--run", "r1", "--json", env=gcs_env)
    assert inspected.returncode == 0, inspected.stderr
    shown = json.loads(inspected.stdout)
    assert (shown["url"], shown["manifest"]["run"]) == (into["url"], "r1")


@pytest.mark.parametrize("verb", ["verify", "inspect", "pack", "latest"])
def test_cli_missing_bucket_is_exit_4_one_line(
    verb: str, gcs_env: dict[str, str], tmp_path: Path
) -> None:
    bucket = f"rp-no-such-bucket-{uuid.uuid4().hex[:12]}"
    url = f"gs://{bucket}/x.rp"
    store = f"gs://{bucket}/store/"
    args = {
        "verify": ("verify", url),
        "inspect": ("inspect", url),
        "pack": ("pack", str(checkpoint(tmp_path / "src", 1)), url, "--step", "1"),
        "latest": ("latest", store),
    }[verb]
    proc = cli(*args, "--json", env=gcs_env)
    assert proc.returncode == 4, proc.stderr
    line = one_error_line(proc)
    error = json.loads(proc.stdout)["error"]
    assert (error["class"], error["exit_code"]) == ("NotFound", 4)
    if verb == "latest":
        # A missing bucket is reported as such, not as an empty store.
        assert line.startswith(f"restorepoint: error: {store}: bucket ")
        assert line.endswith("not found")
    else:
        assert line == f"restorepoint: error: {url}: not found"
        assert error["url"] == url


def test_a_reader_reads_the_generation_it_opened(
    gcs_server: Any, gcs_bucket: str, gcs_storage_options: dict[str, Any]
) -> None:
    """The object replaced after the reader opened it: the reader's ranges, the stream's too,
    never return the new object's bytes. The emulator keeps no noncurrent generation in a
    bucket without versioning, so the old generation is gone: StorageUnavailable, "replaced"
    (a retry reads the new object whole)."""
    from restorepoint.errors import StorageUnavailable

    old, new = payload(300_000, seed=1), payload(300_000, seed=2)
    gcs_server.put(gcs_bucket, "obj.rp", old)
    reader = resolve(f"gs://{gcs_bucket}/obj.rp", gcs_storage_options).reader()
    try:
        assert reader.read_range(0, 1000) == old[:1000]
        gcs_server.put(gcs_bucket, "obj.rp", new)
        with pytest.raises(StorageUnavailable, match="replaced"):
            reader.read_range(1000, 300_000)
        with pytest.raises(StorageUnavailable, match="replaced"), reader.open_stream(0) as stream:
            stream.read()
    finally:
        reader.close()
    again = resolve(f"gs://{gcs_bucket}/obj.rp", gcs_storage_options).reader()
    try:
        assert again.read_range(0, 300_000) == new
    finally:
        again.close()
