"""tests/run's refusal of a CUDA build, on pip installation reports of the shapes pip writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from install_guard import refusal

GUARD = Path(__file__).resolve().parent / "install_guard.py"


def report(*items: tuple[str, str]) -> dict[str, object]:
    return {
        "version": "1",
        "install": [{"metadata": {"name": n, "version": v}} for n, v in items],
    }


def test_the_cpu_build_passes() -> None:
    assert refusal(report(("torch", "2.13.0+cpu"), ("numpy", "2.4.6"), ("sympy", "1.14"))) is None
    assert refusal(report(("torch", "2.13.0"), ("filelock", "3"))) is None  # macOS: no label


def test_a_cuda_build_is_refused_naming_torch_and_what_it_pulls() -> None:
    pulled = [(f"nvidia-lib{i}", "13.0") for i in range(5)]
    line = refusal(report(("torch", "2.14.1"), ("triton", "3.7.1"), *pulled))
    assert line is not None
    assert line.startswith("tests/run: refusing to install a CUDA build (torch 2.14.1, which pulls")
    assert "nvidia-lib0 13.0" in line
    assert "and 3 more" in line
    assert "\n" not in line


def test_a_cuda_local_version_alone_is_refused() -> None:
    line = refusal(report(("torch", "2.13.0+cu130")))
    assert line is not None
    assert "torch 2.13.0+cu130" in line


def guard(path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(GUARD), str(path)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_the_script_exits_1_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report(("torch", "2.14.1"), ("nvidia-cublas", "13"))))
    bad = guard(path)
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1
    path.write_text(json.dumps(report(("torch", "2.13.0+cpu"))))
    good = guard(path)
    assert (good.returncode, good.stdout, good.stderr) == (0, "", "")
