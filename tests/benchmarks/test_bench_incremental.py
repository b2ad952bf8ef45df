"""benchmarks/bench_incremental.py at a tiny size, so that it cannot rot: every case publishes
a run of restore points incrementally and fully through ResumableRun, on both stores, resumes
the newest bit for bit (the script checks it), and the report holds every figure. No time is
asserted on; the bytes only where the format promises them (a frozen backbone is not uploaded
again)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchrun import needs_torch_weights_and_s3, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def test_bench_incremental_runs_tiny(tmp_path: Path) -> None:
    needs_torch_weights_and_s3()
    doc, output = run_bench(
        "bench_incremental.py", "--model", "tiny", "--points", "3",
        "--workdir", str(tmp_path / "work"),
    )  # fmt: skip
    results = {(r["store"], r["case"], r["mode"]): r for r in doc["results"]}
    cases = ("frozen", "frozen-sgd", "full", "lora")
    modes = ("full", "incremental")
    assert set(results) == {(s, c, m) for s in ("local", "s3") for c in cases for m in modes}
    for key, result in results.items():
        assert result["resumed_bit_for_bit"], key
        assert len(result["points"]) == 3, key
        assert all(p["bytes"] > 0 and p["seconds"] > 0 for p in result["points"]), key
        if key[2] == "full":
            assert result["reused_total"] == 0, key
    for kind in ("local", "s3"):
        for case in ("frozen", "frozen-sgd", "lora"):
            inc, full = results[(kind, case, "incremental")], results[(kind, case, "full")]
            # The first restore point is full either way; the later ones reference the
            # backbone.
            assert inc["points"][0]["reused"] == 0
            assert all(p["reused"] > 0 and p["bases"] == 1 for p in inc["points"][1:])
            assert inc["bytes_median"] < full["bytes_median"] / 2, (kind, case)
    assert {(r["store"], r["case"]) for r in doc["ratios"]} == {
        (s, c) for s in ("local", "s3") for c in cases
    }
    assert "incremental / full" in output
