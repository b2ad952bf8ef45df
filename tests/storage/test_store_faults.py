"""The store suite again, behind the fault-injecting proxy (tests/_servers/faults.py): S3 and GCS
with a rate of connection resets and 503s, and one stall longer than the stall timeout. Each
test of the subset (one per store operation: publish, replace, create-only, ranged and
streamed reads, pack, verify, list, latest, prune, the CLI in another process) passes unchanged:
the retry policy (restorepoint/storage/_retry.py) absorbs the faults. Afterwards no multipart
upload is left open that prune would not find and abort.

Beside it, what a store that never recovers gives: one line, exit 4, within the bound the
policy documents, and the deadline that cuts retries short."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers.faults import FaultProxy, Faults
from _servers.gcs import gcs_env_for, gcs_options
from _servers.s3 import s3_env_for, s3_options
from clirun import cli, one_error_line

from restorepoint import pack
from restorepoint.errors import StorageUnavailable
from restorepoint.storage import resolve, store_deadline
from restorepoint.testing.store import checkpoint

from .test_gcs import TestGCSStore as _GCSSuite
from .test_s3 import TestS3Store as _S3Suite

#: The subset of the suite run behind the proxy: every store operation at least once.
SUBSET = {
    "test_publish_then_read_back",
    "test_publish_replaces_only_at_commit",
    "test_create_only_refuses_to_replace",
    "test_read_range_bounds",
    "test_pack_verify_read_manifest",
    "test_store_publish_list_latest",
    "test_store_seed_workflow_keep_last_through_the_cli",
    "test_store_prune_one_run_only",
}

#: A rate of resets and 503s, and the third request stalled past the stall timeout.
FAULTS = Faults(reset=0.03, error=0.05, at={3: "stall"}, stall_s=6.0, seed=24)

#: The policy under test, fast: a stall is given up after 3 s.
POLICY_ENV = {
    "RESTOREPOINT_STORE_STALL_TIMEOUT": "3",
    "RESTOREPOINT_STORE_BACKOFF": "0.05",
    "RESTOREPOINT_STORE_BACKOFF_CAP": "0.5",
    "RESTOREPOINT_STORE_ATTEMPTS": "6",
}


def _only_the_subset(cls: type) -> type:
    for name in dir(cls):
        if name.startswith("test_") and name not in SUBSET:
            setattr(cls, name, None)
    return cls


@pytest.fixture
def policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in POLICY_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.mark.s3
@_only_the_subset
class TestS3StoreUnderFaults(_S3Suite):
    @pytest.fixture
    def storage_options(self, s3_fault_proxy: FaultProxy, policy_env: None) -> dict[str, Any]:
        s3_fault_proxy.set(FAULTS)
        self.proxy = s3_fault_proxy
        self.before = s3_fault_proxy.total
        return s3_options(s3_fault_proxy.endpoint)

    @pytest.fixture(autouse=True)
    def _nothing_left_open(self, s3_client: Any, s3_bucket: str, base_url: str) -> Iterator[None]:
        yield
        # An upload whose creation was answered but the answer lost (a reset) is open on
        # the server and unknown to its writer: prune's listing must find it, to abort it.
        uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        assert self.proxy.total > self.before  # the test's traffic went through the proxy
        self.proxy.set(Faults())
        if uploads:
            found = {u.upload_id for u in resolve(base_url, s3_options(self.proxy.endpoint))
                     .pending_uploads()}  # fmt: skip
            assert {u["UploadId"] for u in uploads} <= found


@pytest.mark.gcs
@_only_the_subset
class TestGCSStoreUnderFaults(_GCSSuite):
    @pytest.fixture
    def storage_options(self, gcs_fault_proxy: FaultProxy, policy_env: None) -> dict[str, Any]:
        gcs_fault_proxy.set(FAULTS)
        self.proxy = gcs_fault_proxy
        self.before = gcs_fault_proxy.total
        return gcs_options(gcs_fault_proxy.endpoint)

    @pytest.fixture(autouse=True)
    def _through_the_proxy(self, request: pytest.FixtureRequest) -> Iterator[None]:
        yield
        if "create_only" in request.node.name:
            return  # skipped: gcs:// declares no create_only
        assert self.proxy.total > self.before  # the test's traffic went through the proxy

    @pytest.fixture
    def store_env(self, storage_options: dict[str, Any], gcs_server: Any) -> dict[str, str]:
        env = gcs_env_for(gcs_server)
        env["FSSPEC_GCS"] = __import__("json").dumps(storage_options)
        return env


# -- a store that never recovers -----------------------------------------------------------


@pytest.mark.s3
def test_a_stalled_store_fails_with_one_line_and_exit_4(
    s3_fault_proxy: FaultProxy, s3_bucket: str, tmp_path: Path
) -> None:
    """Every request stalls: the CLI gives up after the policy's tries of one stall timeout
    each, with one line and exit 4 (the time is the test's to bound, not to assert)."""
    s3_fault_proxy.set(Faults(stall=1.0, stall_s=30.0))
    env = s3_env_for(s3_options(s3_fault_proxy.endpoint))
    env.update(POLICY_ENV, RESTOREPOINT_STORE_ATTEMPTS="2")
    source = checkpoint(tmp_path / "src", seed=1)
    url = f"s3://{s3_bucket}/store/"
    result = cli("pack", str(source), url, "--run", "r", "--step", "1", env=env)
    assert result.returncode == 4, result.stderr
    line = one_error_line(result)
    assert "unreachable or failing" in line
    assert s3_fault_proxy.injected["stall"] >= 2


@pytest.mark.s3
def test_503_forever_fails_and_leaves_nothing(
    s3_fault_proxy: FaultProxy, s3_client: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """Only the first requests get through: whatever was under way ends as one line, no
    restore point and no open upload."""
    s3_fault_proxy.set(Faults(error=1.0, at={n: "none" for n in range(1, 4)}))
    env = s3_env_for(s3_options(s3_fault_proxy.endpoint))
    env.update(POLICY_ENV)
    source = checkpoint(tmp_path / "src", seed=2, size=20 << 20)
    url = f"s3://{s3_bucket}/store/"
    result = cli("pack", str(source), url, "--run", "r", "--step", "1", env=env)
    assert result.returncode == 4, result.stderr
    one_error_line(result)
    s3_fault_proxy.set(Faults())
    listed = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert [o["Key"] for o in listed if o["Key"].endswith(".rp")] == []


@pytest.mark.s3
def test_the_deadline_cuts_retries_short(
    s3_fault_proxy: FaultProxy, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a reclaim notice's deadline no retry waits past it: a store answering 503 fails
    at the deadline, not after the policy's tries."""
    monkeypatch.setenv("RESTOREPOINT_STORE_BACKOFF", "5")
    monkeypatch.setenv("RESTOREPOINT_STORE_BACKOFF_CAP", "5")
    monkeypatch.setenv("RESTOREPOINT_STORE_ATTEMPTS", "50")
    s3_fault_proxy.set(Faults(error=1.0))
    source = checkpoint(tmp_path / "src", seed=3)
    url = f"s3://{s3_bucket}/store-{uuid.uuid4().hex[:6]}/"
    store = resolve(url, s3_options(s3_fault_proxy.endpoint))
    with store_deadline(time.monotonic() + 0.5), pytest.raises(StorageUnavailable) as info:
        pack(source, store, run="r", position=1)
    assert "deadline" in str(info.value)
    assert s3_fault_proxy.injected["error"] < 50
