"""benchmarks/bench_cli.py runs at a small size, so that it cannot rot: the CLI's pack and
verify beside the tar pipeline and sha256sum, on this checkout's code. No figure is asserted
on beyond its being there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_bench_cli_runs_small(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    missing = [tool for tool in ("tar", "zstd", "sha256sum") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the shell's tools the CLI is compared with are missing: {missing}")
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_cli.py", "--size-gib", "0.02", "--repeat", "1",
         "--workdir", str(tmp_path / "work"), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout[proc.stdout.index("\n{") :])
    # The CLI ran this checkout's code, compiled as an install compiles it, whatever the
    # interpreter has installed and though the environment forbids writing a cache.
    assert doc["restorepoint"].endswith("(this checkout)")
    assert list((ROOT / "restorepoint" / "_cli" / "__pycache__").glob("verify.*.pyc"))
    assert doc["pack_ratio"] > 0 and doc["verify_speed"] > 0
    (only,) = doc["rounds"]
    assert {"pack", "tar", "verify", "sha256sum", "load"} <= set(only)
    assert doc["sizes"]["restore point"] > 0
