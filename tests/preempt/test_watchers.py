"""The reclaim-notice watchers against the metadata-service emulators: AWS IMDSv2 (tokens,
404 until armed, stop and rebalance notices, 401 -> new token, failures survived) and the GCE
metadata server (preempted, maintenance-event, the Metadata-Flavor header, long-polls)."""

from __future__ import annotations

import json
import logging
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from restorepoint.errors import UsageError
from restorepoint.preempt import AwsWatcher, GcpWatcher, Notice, Watcher
from restorepoint.preempt.watchers import GCP_NOTICE_S

from .emulators import AwsEmulator, GcpEmulator

WAIT = 20.0


@pytest.fixture
def started() -> Iterator[list[Watcher]]:
    """Watchers a test starts; stopped at the end (before the emulator, which then releases
    their long-polls)."""
    watchers: list[Watcher] = []
    yield watchers
    for w in watchers:
        w.stop()


def start(watchers: list[Watcher], watcher: Watcher) -> Watcher:
    watcher.start()
    watchers.append(watcher)
    return watcher


def alive(watcher: Watcher) -> bool:
    return all(t.is_alive() for t in watcher._threads)


def until(condition: object, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def no_notice(watcher: Watcher) -> bool:
    try:
        extra = watcher.notices.get_nowait()
    except queue.Empty:
        return True
    raise AssertionError(f"unexpected notice {extra}")


# -- the emulators behave as the services are documented -------------------------------------


def test_aws_emulator_requires_a_token_and_a_ttl(aws: AwsEmulator) -> None:
    get = urllib.request.Request(f"{aws.url}{AwsEmulator.ACTION}")
    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(get, timeout=5)
    assert no_token.value.code == 401
    no_token.value.close()
    put = urllib.request.Request(f"{aws.url}{AwsEmulator.TOKEN}", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as no_ttl:
        urllib.request.urlopen(put, timeout=5)
    assert no_ttl.value.code == 400
    no_ttl.value.close()
    put.add_header("X-aws-ec2-metadata-token-ttl-seconds", "1")
    with urllib.request.urlopen(put, timeout=5) as resp:
        token = resp.read().decode()
        assert resp.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "1"
    get.add_header("X-aws-ec2-metadata-token", token)
    with pytest.raises(urllib.error.HTTPError) as absent:
        urllib.request.urlopen(get, timeout=5)
    assert absent.value.code == 404
    absent.value.close()
    time.sleep(1.1)  # the requested TTL is honoured: the token has expired
    with pytest.raises(urllib.error.HTTPError) as expired:
        urllib.request.urlopen(get, timeout=5)
    assert expired.value.code == 401
    expired.value.close()


def test_gcp_emulator_requires_the_flavor_header(gcp: GcpEmulator) -> None:
    url = f"{gcp.url}{GcpEmulator.PREFIX}preempted"
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        urllib.request.urlopen(url, timeout=5)
    assert forbidden.value.code == 403
    forbidden.value.close()
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.read() == b"FALSE"
        etag = resp.headers["ETag"]
    # A long-poll with a stale ETag answers at once with the new value and a new ETag.
    gcp.arm_preempted()
    req = urllib.request.Request(
        f"{url}?wait_for_change=true&timeout_sec=30&last_etag={etag}",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.read() == b"TRUE"
        assert resp.headers["ETag"] != etag


# -- AWS ---------------------------------------------------------------------------------------


def test_aws_nothing_while_404(aws: AwsEmulator) -> None:
    watcher = AwsWatcher(aws.url)
    for _ in range(3):
        assert watcher.check() == []
    assert aws.count(AwsEmulator.ACTION) == 3
    assert aws.count(AwsEmulator.REBALANCE) == 3
    assert aws.count(AwsEmulator.TOKEN, "PUT") == 1  # one token, reused


@pytest.mark.parametrize("action", ["stop", "terminate"])
def test_aws_instance_action_is_a_stop_notice_with_its_deadline(
    aws: AwsEmulator, action: str
) -> None:
    watcher = AwsWatcher(aws.url)
    assert watcher.check() == []
    deadline = aws.arm_instance_action(action, seconds=100)
    (notice,) = watcher.check()
    assert isinstance(notice, Notice)
    assert (notice.kind, notice.source) == ("stop", "aws")
    assert notice.deadline == deadline
    assert action in notice.detail
    assert notice.seconds_left is not None and 95 < notice.seconds_left <= 101
    assert watcher.check() == []  # the same instance-action is announced once


def test_aws_rebalance_is_a_snapshot_notice_once_per_notice_time(aws: AwsEmulator) -> None:
    watcher = AwsWatcher(aws.url)
    aws.arm_rebalance(notice_time=1_700_000_000)
    (notice,) = watcher.check()
    assert (notice.kind, notice.source, notice.deadline) == ("snapshot", "aws", None)
    assert watcher.check() == []
    assert watcher.check() == []
    aws.arm_rebalance(notice_time=1_700_000_600)
    (again,) = watcher.check()
    assert again.kind == "snapshot"
    assert watcher.check() == []


def test_aws_token_refreshed_after_401(aws: AwsEmulator) -> None:
    watcher = AwsWatcher(aws.url)
    assert watcher.check() == []
    assert aws.count(AwsEmulator.TOKEN, "PUT") == 1
    aws.expire_tokens()
    aws.arm_instance_action("terminate", seconds=60)
    (notice,) = watcher.check()
    assert notice.kind == "stop"
    assert aws.count(AwsEmulator.TOKEN, "PUT") == 2
    # The instance-action GET was answered 401 once, then again with the new token.
    assert aws.count(AwsEmulator.ACTION) == 3


def test_aws_failing_service_does_not_kill_the_watcher(
    aws: AwsEmulator, started: list[Watcher], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="restorepoint.preempt")
    watcher = start(started, AwsWatcher(aws.url, interval=0.05))
    until(lambda: aws.count(AwsEmulator.ACTION) >= 2)
    aws.fail_next(2, 500)
    until(lambda: not aws.failures)
    aws.refuse()  # connection refused, for a while
    until(lambda: sum("Connection refused" in r.getMessage() for r in caplog.records) >= 2)
    assert alive(watcher)
    aws.resume()
    deadline = aws.arm_instance_action("stop", seconds=90)
    notice = watcher.notices.get(timeout=WAIT)
    assert (notice.kind, notice.deadline) == ("stop", deadline)
    assert alive(watcher)
    messages = [r.getMessage() for r in caplog.records]
    assert any("500" in m for m in messages), messages
    assert all(m.startswith("metadata watcher error (retrying)") for m in messages), messages


@pytest.mark.parametrize("url", ["file:///etc/passwd", "169.254.169.254", "ftp://example.org"])
def test_non_http_endpoint_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="http"):
        AwsWatcher(url)
    with pytest.raises(UsageError, match="http"):
        GcpWatcher(url)


# -- GCP ---------------------------------------------------------------------------------------


def test_gcp_preempted_gives_one_stop_notice_30s_ahead(
    gcp: GcpEmulator, started: list[Watcher]
) -> None:
    watcher = start(started, GcpWatcher(gcp.url, timeout_s=2))
    assert gcp.wait_for_poll("preempted", WAIT)
    armed = time.time()
    gcp.arm_preempted()
    notice = watcher.notices.get(timeout=WAIT)
    assert (notice.kind, notice.source, notice.detail) == ("stop", "gcp", "preempted")
    assert notice.deadline is not None
    assert notice.deadline - notice.received == GCP_NOTICE_S
    assert GCP_NOTICE_S - 5 < notice.deadline - armed <= GCP_NOTICE_S + 1
    # Polls go on (timeouts, then an error that restarts both loops, which read the values
    # afresh): the preemption is still never announced twice.
    path = f"{GcpEmulator.PREFIX}preempted"
    gcp.fail_next(1, 503, path=path)
    until(lambda: not gcp.failures)
    after_error = gcp.count(path)
    # The restarted loop's first read, then a long-poll answered at its timeout, then the next.
    until(lambda: gcp.count(path) >= after_error + 3)
    assert alive(watcher)
    assert no_notice(watcher)


def test_gcp_preempted_before_the_watcher_started_is_seen_at_once(
    gcp: GcpEmulator, started: list[Watcher]
) -> None:
    gcp.arm_preempted()
    # timeout_s far beyond WAIT: only a first read of the current value can see it in time.
    watcher = start(started, GcpWatcher(gcp.url, timeout_s=120))
    notice = watcher.notices.get(timeout=WAIT)
    assert notice.kind == "stop"


def test_gcp_maintenance_event_is_a_snapshot_notice(
    gcp: GcpEmulator, started: list[Watcher]
) -> None:
    watcher = start(started, GcpWatcher(gcp.url, timeout_s=2))
    assert gcp.wait_for_poll("maintenance-event", WAIT)
    gcp.arm_maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    notice = watcher.notices.get(timeout=WAIT)
    assert (notice.kind, notice.deadline) == ("snapshot", None)
    assert notice.detail == "maintenance-event: MIGRATE_ON_HOST_MAINTENANCE"
    gcp.set("maintenance-event", "NONE")
    until(lambda: gcp.waiting["maintenance-event"] > 0)
    assert no_notice(watcher)
    gcp.arm_maintenance("TERMINATE_ON_HOST_MAINTENANCE")
    again = watcher.notices.get(timeout=WAIT)
    assert again.kind == "snapshot"
    assert again.detail.endswith("TERMINATE_ON_HOST_MAINTENANCE")


def test_gcp_403_is_survived(
    gcp: GcpEmulator, started: list[Watcher], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="restorepoint.preempt")
    gcp.drop_flavor_next(3)  # as if a proxy stripped the header from the first requests
    watcher = start(started, GcpWatcher(gcp.url, timeout_s=2))
    until(lambda: gcp.forbidden == 3)
    gcp.arm_preempted()
    notice = watcher.notices.get(timeout=WAIT)
    assert notice.kind == "stop"
    assert alive(watcher)
    assert any("403" in r.getMessage() for r in caplog.records)


def test_gcp_long_poll_returns_on_change(gcp: GcpEmulator, started: list[Watcher]) -> None:
    # A long-poll timeout far beyond the wait below: the notice can only come from the poll
    # returning on the change.
    watcher = start(started, GcpWatcher(gcp.url, timeout_s=120))
    assert gcp.wait_for_poll("preempted", WAIT)
    gcp.arm_preempted()
    notice = watcher.notices.get(timeout=WAIT)
    assert notice.kind == "stop"
    # One read of the value, one long-poll that answered the change, the next one waiting:
    # no busy polling.
    assert gcp.wait_for_poll("preempted", WAIT)
    assert gcp.count(f"{GcpEmulator.PREFIX}preempted") == 3


def test_emulator_state_is_json(aws: AwsEmulator) -> None:
    """The bodies are what the AWS documentation shows: JSON objects with these keys."""
    aws.arm_instance_action("terminate", seconds=30)
    aws.arm_rebalance()
    watcher = AwsWatcher(aws.url)
    body = watcher._get("spot/instance-action")
    assert body is not None
    assert set(json.loads(body)) == {"action", "time"}
    assert json.loads(body)["time"].endswith("Z")
    rebalance = watcher._get("events/recommendations/rebalance")
    assert rebalance is not None
    assert set(json.loads(rebalance)) == {"noticeTime"}
