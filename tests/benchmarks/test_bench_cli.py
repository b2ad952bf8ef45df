"""benchmarks/bench_cli.py runs at a small size, so that it cannot rot: the CLI's pack and
verify beside the tar pipeline and sha256sum, on this checkout's code. No figure is asserted
on beyond its being there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from benchrun import ROOT, run_bench

pytestmark = pytest.mark.slow


def test_bench_cli_runs_small(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    missing = [tool for tool in ("tar", "zstd", "sha256sum") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the shell's tools the CLI is compared with are missing: {missing}")
    doc, _ = run_bench(
        "bench_cli.py", "--size-gib", "0.02", "--repeat", "1", "--workdir", str(tmp_path / "work"),
        timeout=300, PYTHONDONTWRITEBYTECODE="1",
    )  # fmt: skip
    # The CLI ran this checkout's code, compiled as an install compiles it, whatever the
    # interpreter has installed and though the environment forbids writing a cache.
    assert doc["restorepoint"].endswith("(this checkout)")
    assert list((ROOT / "restorepoint" / "_cli" / "__pycache__").glob("verify.*.pyc"))
    assert doc["pack_ratio"] > 0 and doc["verify_speed"] > 0
    (only,) = doc["rounds"]
    assert {"pack", "tar", "verify", "sha256sum", "load"} <= set(only)
    assert doc["sizes"]["restore point"] > 0
