"""benchmarks/bench_stop_inflight.py runs at a small size, so that it cannot rot: both ways
(abandon, wait) stop with exit 42 at each deadline, each run in a process of its own, and the
table and the JSON hold every run. No figure is asserted on: which way lands what depends on
the machine's timing."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchrun import needs_torch_weights_and_s3, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def test_bench_stop_inflight_runs_at_32m(tmp_path: Path) -> None:
    needs_torch_weights_and_s3()
    doc, output = run_bench(
        "bench_stop_inflight.py", "--size", "32M", "--rounds", "1", "--factors", "2,4",
        "--lead", "0", "--workdir", str(tmp_path / "work"),
    )  # fmt: skip
    assert doc["env"]["restorepoint"].endswith("(this checkout)")
    results = doc["results"]
    assert sorted((r["factor"], r["way"]) for r in results) == [
        (2.0, "abandon"), (2.0, "wait"), (4.0, "abandon"), (4.0, "wait"),
    ]  # fmt: skip
    for r in results:
        assert r["code"] == 42
        assert r["first_publish_s"] > 0
        assert r["newest"] is not None and r["newest"] >= 1
        # The code before never abandons.
        assert not (r["way"] == "wait" and r["superseded"])
    assert "| upload_timeout | way |" in output
