"""The spot-queue loop of an external trainer (preempt/external.py) under a store deadline: a
newer committed snapshot that lands while an older one is published supersedes it where the
time left holds the newer's publish but not both, and the newest lands; without a deadline
both are published in turn. The loop is the real one, with the LichtFeld Studio adapter,
publishing to moto's S3 server through a bandwidth cap; its snapshots are handed to it as its
watcher hands them over (the trainer's own checkpoints are tests/preempt/test_external_loop.py's
subject)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from restorepoint.adapters.base import Snapshot, load_adapter
from restorepoint.format import Position
from restorepoint.ops import HeadSpec, PackOptions, list_store
from restorepoint.preempt.external import ExternalLoop
from restorepoint.preempt.telemetry import Telemetry
from restorepoint.storage import store_deadline

pytestmark = pytest.mark.s3


def _checkpoint(root: Path, step: int) -> Snapshot:
    """A committed checkpoint of 144 MiB (incompressible: far more than a publish's end holds
    in hand, past abandoning)."""
    name = f"checkpoints/checkpoint_{step}.resume"
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(144):
            f.write(os.urandom(1 << 20))
    return Snapshot(root, (name,), Position(step))


def _events(workdir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (workdir / "events.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d["event"] == kind]


@pytest.mark.parametrize("deadline", [True, False], ids=["under-a-deadline", "no-deadline"])
def test_a_newer_snapshot_under_a_deadline_supersedes_the_publish_in_flight(
    tmp_path: Path, s3_bucket: str, s3_capped: Any, deadline: bool
) -> None:
    options = s3_capped(48 << 20)
    store = f"s3://{s3_bucket}/external-supersede/"
    workdir = tmp_path / "work"
    loop = ExternalLoop(
        load_adapter("lichtfeld"),  # type: ignore[arg-type]
        workdir, store, HeadSpec(0, run="splat"), PackOptions(storage_options=options),
        Telemetry(None), keep_local=None,
    )  # fmt: skip
    loop._worker.start()
    try:
        loop._seen(_checkpoint(workdir, 500))
        assert loop._worker.wait(120)
        (first,) = _events(workdir, "uploaded")
        second, third = _checkpoint(workdir, 1000), _checkpoint(workdir, 1500)
        loop._seen(second)  # published in the background
        time.sleep(0.3)
        # A notice's deadline: two publishes' time, so the newer's fits even at half again
        # its estimate and both do not.
        left = 2.0 * first["seconds"] + PackOptions().deadline_margin
        with store_deadline(time.monotonic() + left if deadline else None):
            loop._seen(third)
            assert loop._worker.wait(120)
    finally:
        loop._worker.finish(120)
    steps = sorted(e.step for e in list_store(store, storage_options=options))
    uploaded = [e["step"] for e in _events(workdir, "uploaded")]
    superseded = _events(workdir, "upload_superseded")
    assert not _events(workdir, "upload_failed")
    if deadline:
        assert [(e["step"], e["by"]) for e in superseded] == [(1000, 1500)]
        assert uploaded == [500, 1500]
    else:
        assert superseded == []
        assert uploaded == [500, 1000, 1500]
    # keep_last 1: the newest only.
    assert steps == [1500]
