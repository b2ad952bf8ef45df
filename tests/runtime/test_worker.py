"""The snapshot worker's switch interval (``runtime.worker.switch_interval``): lowered while a
snapshot is handled, so that the training thread waits less for the GIL the publish's Python
holds, and the process's own put back after, whoever else uses it meanwhile."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from restorepoint.runtime.worker import SWITCH_INTERVAL, SnapshotWorker, switch_interval


@pytest.fixture(autouse=True)
def _process_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_lowered_inside_and_put_back_after() -> None:
    with switch_interval(0.0005):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_never_raised_and_none_leaves_it_alone() -> None:
    sys.setswitchinterval(0.0002)
    with switch_interval(0.0005):
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    with switch_interval(None):
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0002)


def test_put_back_only_when_the_last_user_leaves() -> None:
    first = switch_interval(0.0005)
    second = switch_interval(0.0005)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(0.0005)  # the second still works
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_change_made_meanwhile_is_kept() -> None:
    with switch_interval(0.0005):
        sys.setswitchinterval(0.002)  # the user's, while a snapshot is handled
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_put_back_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), switch_interval(0.0005):
        raise RuntimeError("a failed publish")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def _interval_seen(switch: float | None = SWITCH_INTERVAL) -> float:
    """The switch interval a worker's handler ran at, for one snapshot."""
    seen: list[float] = []
    worker: SnapshotWorker[int] = SnapshotWorker(
        lambda snap: seen.append(sys.getswitchinterval()), nice=None, switch_interval=switch
    )
    worker.start()
    try:
        worker.submit(1)
        assert worker.wait(10)
    finally:
        assert worker.finish(10)
    (interval,) = seen
    return interval


def test_the_worker_handles_each_snapshot_at_the_lower_interval() -> None:
    assert _interval_seen() == pytest.approx(SWITCH_INTERVAL)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    # switch_interval=None: the process's interval, untouched.
    assert _interval_seen(None) == pytest.approx(0.005)
