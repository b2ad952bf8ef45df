"""A stop while a periodic publish is in flight (runtime/_inflight.py): where the store deadline
holds the stop's publish but not the rest of the one in flight before it, that one is
abandoned and the stop's lands; where it holds both, both land. An abandoned publish leaves
the store as it was (nothing committed, no upload left open), and the child abandons only the
job it was asked to."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.errors import RestorePointError  # noqa: E402
from restorepoint.ops import HeadSpec, PackOptions  # noqa: E402
from restorepoint.ops._abandon import Abandon  # noqa: E402
from restorepoint.ops._publish_child import _Child  # noqa: E402
from restorepoint.ops.publish import publish  # noqa: E402
from restorepoint.runtime._inflight import RECENT, SAFETY, Flights, agreed, estimate  # noqa: E402
from restorepoint.storage import store_deadline  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

CONFIG = {"lr": 0.01, "seed": 5}


@pytest.mark.parametrize(
    ("elapsed", "estimate", "left", "expected"),
    [
        (0.5, 4.0, 30.0, False),  # both fit: 3.5 + 4 + margin 1 <= 30
        (0.5, 4.0, 7.0, True),  # 3.5 + 4 > 6, 4 <= 6: only the stop's fits
        (0.5, 4.0, 5.0, True),  # 4 <= 4: the stop's fits, just
        (0.5, 4.0, 4.9, False),  # not even the stop's fits: the one in flight may land
        (3.9, 4.0, 5.5, False),  # 0.1 + 4 <= 4.5: it is nearly done, both fit
        (9.0, 4.0, 5.5, False),  # past its estimate: about to land
        (0.5, None, 7.0, False),  # no publish has landed: nothing known
        (0.5, 4.0, None, False),  # no deadline: the stop waits for both
    ],
)
def test_the_stops_snapshot_supersedes_only_where_it_alone_fits(
    elapsed: float, estimate: float | None, left: float | None, expected: bool
) -> None:
    # One worker's view (``Flights.view``: None where nothing is known or there is no
    # deadline), as its own ``supersede`` judges it.
    view = (
        None
        if estimate is None or left is None
        else {"step": 7, "elapsed_s": elapsed, "estimate_s": estimate, "deadline_left_s": left}
    )
    assert (agreed([view], margin=1.0) is not None) is expected


def test_ranks_give_up_together_on_the_slowest_ranks_figures() -> None:
    """A commit lands with its slowest part: the longest estimate, the longest rest and the
    shortest time left decide, and only where every rank has the same step in flight."""

    def view(elapsed: float, guess: float, left: float, step: int = 7) -> dict[str, float]:
        return {"step": step, "elapsed_s": elapsed, "estimate_s": guess, "deadline_left_s": left}

    # Alone, rank 0 would keep both (3.5 + 4 <= 30 - 1); rank 1 has 8 s left: only the stop's.
    figures = agreed([view(0.5, 4.0, 30.0), view(0.5, 4.0, 8.0)], margin=1.0)
    assert figures == {"step": 7, "elapsed_s": 0.5, "estimate_s": 4.0, "deadline_left_s": 8.0}
    # Rank 1's publishes take 8 s: not even the stop's fits 7 s of room on it.
    assert agreed([view(0.5, 4.0, 8.0), view(0.5, 8.0, 8.0)], margin=1.0) is None
    # A rank with nothing known, or another step in flight: none gives up.
    assert agreed([view(0.5, 4.0, 8.0), None], margin=1.0) is None
    assert agreed([view(0.5, 4.0, 8.0), view(0.5, 4.0, 8.0, step=6)], margin=1.0) is None
    assert agreed([], margin=1.0) is None


def test_a_publish_is_estimated_at_half_again_the_slowest_of_the_runs_last_five() -> None:
    assert estimate([]) is None
    assert estimate([2.0, 3.0]) == SAFETY * 3.0 == 4.5
    # Only the last RECENT count: an early slow publish (a cold store) is forgotten.
    assert estimate([10.0] + [1.0] * RECENT) == SAFETY * 1.0


def test_a_workers_flights_supersede_from_their_last_five_and_only_an_older_step() -> None:
    """The worker's record: a publish that landed long ago (a cold store, 10 s) no longer
    counts after five more (1 s each); the one in flight is given up for a newer step only,
    and a publish that has ended is past giving up."""
    flights = Flights()
    for seconds in [10.0] + [1.0] * RECENT:
        flights.landed(seconds)
    flight = flights.begin(7)
    # 3.5 s left, 1 s margin: the newer's 1.5 s fits, its 1.5 s after this one's does not.
    with store_deadline(time.monotonic() + 3.5):
        assert flights.supersede(7, margin=1.0) is None  # the same step: nothing newer
        figures = flights.supersede(8, margin=1.0)
    assert figures is not None
    assert (figures["step"], figures["by"], figures["estimate_s"]) == (7, 8, SAFETY * 1.0)
    assert flight.abandon.asked
    with pytest.raises(RestorePointError, match="abandoned for the snapshot at step 8"):
        flight.abandon.check()
    flights.end()
    with store_deadline(time.monotonic() + 3.5):
        assert flights.supersede(9, margin=1.0) is None


def _tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_an_abandoned_publish_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """Asked at its third chunk (another thread's ask, as a stop's), the publish raises with
    the ask's words, and the store holds what it held: the previous restore point, whole."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(3 << 20))
    store = f"{tmp_path / 'store'}/"
    options = PackOptions(chunk_size=256 << 10)
    first = publish(source, store, HeadSpec(position=1, run="r"), options)
    before = _tree(tmp_path / "store")
    chunks = [0]

    def progress(n: int) -> None:
        chunks[0] += 1
        if chunks[0] == 3:
            token.ask("abandoned for a newer snapshot")

    token = Abandon(progress)
    (source / "weights.bin").write_bytes(os.urandom(3 << 20))
    with pytest.raises(RestorePointError, match="abandoned for a newer snapshot"):
        publish(source, store, HeadSpec(position=2, run="r"), options, progress=token)
    assert chunks[0] == 3
    assert _tree(tmp_path / "store") == before
    (entry,) = restorepoint.list_store(store)
    assert entry.url == first.url
    restorepoint.verify(entry.url)


def test_the_child_abandons_only_the_job_it_was_asked_to() -> None:
    """An ask that reaches the child before its job is kept for that job; one for a job that
    has ended is of no use to a later job."""
    r, w = os.pipe()
    with open(r, "rb") as inp, open(w, "wb") as out:
        child = _Child(os.getpid(), inp, out)
        child._abandon(2, "early")
        first = child._begin({"id": 1})
        assert not first.asked
        second = child._begin({"id": 2})
        assert second.asked
        with pytest.raises(RestorePointError, match="early"):
            second.check()
        child._abandon(2, "in hand")  # the job in hand: its token (asked already)
        child._abandon(1, "too late")  # ended: kept only until a later job begins
        third = child._begin({"id": 3})
        assert not third.asked
        child._abandon(3, "now")
        assert third.asked


def test_a_token_asked_before_its_publish_process_job_stops_it_from_starting(
    tmp_path: Path,
) -> None:
    from restorepoint.ops.publish_process import PublishProcess, available

    if not available():
        pytest.skip("the publish process needs Linux")
    process = PublishProcess()
    token = Abandon()
    token.ask("a newer snapshot waits")
    try:
        with pytest.raises(RestorePointError, match="a newer snapshot waits"):
            process.publish(
                str(tmp_path), f"{tmp_path / 'store'}/", HeadSpec(position=1), PackOptions(),
                memory={"a.bin": b"x" * 10}, abandon=token,
            )  # fmt: skip
    finally:
        process.close()
    assert not (tmp_path / "store").exists()


# -- a real run, to moto's S3 server through a bandwidth cap ---------------------------------------


def _events(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _stop_during_a_periodic_publish(
    run_dir: Path, store: str, options: dict[str, Any], background: str, publishes: float
) -> tuple[int, dict[str, Any]]:
    """Publish the snapshot at step 1 (its time is the estimate), start the one at step 2,
    and stop at step 3 while it is in flight, with an ``upload_timeout`` of ``publishes``
    times the estimate, plus the margin (the machine's speed sets the estimate, not this
    test). The exit code, and the stop's event."""
    torch.manual_seed(0)
    # 144 MiB of state (weights and Adam's two moments): far more than what the pipeline
    # and the S3 upload hold in hand, which a publish cannot abandon any more.
    model = torch.nn.Linear(4096, 3072)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 4096)).square().mean().backward()
    optimizer.step()
    code: Any = None
    try:
        with ResumableRun(
            CONFIG, run_dir=run_dir, store=store, storage_options=options, background=background
        ) as run:
            run.track(model=model, optimizer=optimizer)
            run.commit()
            run.snapshot(wait=True)
            (estimate,) = [u["seconds"] for u in run.uploads if u["ok"]]
            run.upload_timeout = publishes * estimate + PackOptions().deadline_margin
            run.commit()
            run.snapshot()
            time.sleep(0.3)
            run.request_stop()
            run.commit()
    except SystemExit as exc:  # the stop's exit
        code = exc.code
    (stop,) = [e for e in _events(run_dir) if e["event"] == "graceful_shutdown"]
    return int(code), stop


@pytest.mark.s3
@pytest.mark.parametrize("background", ["process", "thread"])
def test_a_stop_abandons_the_publish_in_flight_where_only_its_own_lands_in_time(
    tmp_path: Path, s3_bucket: str, s3_capped: Any, background: str
) -> None:
    options = s3_capped(48 << 20)
    store = f"s3://{s3_bucket}/supersede-{background}/"
    # Two publishes' time: the stop's fits even at half again its estimate, both do not.
    code, stop = _stop_during_a_periodic_publish(
        tmp_path / "run", store, options, background, publishes=2.0
    )
    events = _events(tmp_path / "run")
    assert code == 42
    assert stop["upload_finished"] is True
    (superseded,) = [e for e in events if e["event"] == "upload_superseded"]
    assert superseded["step"] == 2
    assert superseded["by"] == 3
    assert not [e for e in events if e["event"] == "upload_failed"]
    steps = sorted(e.step for e in restorepoint.list_store(store, storage_options=options))
    assert steps == [1, 3]


@pytest.mark.s3
def test_a_stop_whose_deadline_holds_both_publishes_lands_both(
    tmp_path: Path, s3_bucket: str, s3_capped: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    options = s3_capped(48 << 20)
    store = f"s3://{s3_bucket}/supersede-both/"
    code, stop = _stop_during_a_periodic_publish(
        tmp_path / "run", store, options, "process", publishes=4.0
    )
    assert code == 42
    assert stop["upload_finished"] is True
    events = _events(tmp_path / "run")
    assert not [e for e in events if e["event"] in ("upload_superseded", "upload_failed")]
    assert [e["step"] for e in events if e["event"] == "uploaded"] == [1, 2, 3]
    steps = sorted(e.step for e in restorepoint.list_store(store, storage_options=options))
    assert steps == [1, 2, 3]
    assert "restore point published to s3://" in capsys.readouterr().err
