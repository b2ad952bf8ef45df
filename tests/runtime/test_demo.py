"""`restorepoint demo`: the README's main command, run as a user runs it (a subprocess), with
torch and without."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the demo needs torch")

from clirun import cli, one_error_line

from restorepoint.ops import list_store, verify

pytestmark = pytest.mark.slow

FIELDS = {
    "bitwise_identical",
    "import_seconds",
    "imported_files",
    "ok",
    "pack_seconds",
    "preempted_at_step",
    "restore_point",
    "signal_sent_after_step",
    "snapshot_pause_seconds",
    "steps_total",
}


def test_demo_json_is_bitwise_identical(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = cli("demo", "--json", "--seed", "5", "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == FIELDS
    assert result["bitwise_identical"] is True and result["ok"] is True
    assert result["steps_total"] == 96
    # The signal takes effect at the next effective-batch boundary, before the end.
    assert result["signal_sent_after_step"] <= result["preempted_at_step"] < 96
    for key in ("import_seconds", "pack_seconds", "snapshot_pause_seconds"):
        assert isinstance(result[key], float) and result[key] >= 0, key
    assert result["imported_files"] >= 1
    (entry,) = list_store(f"{workdir / 'store'}/")
    assert entry.url == result["restore_point"]
    assert entry.step == result["preempted_at_step"]
    assert verify(entry.url).manifest.position.step == entry.step


def test_demo_refuses_a_non_empty_workdir(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("mine\n")
    proc = cli("demo", "--workdir", str(tmp_path))
    assert proc.returncode == 2
    assert "is not empty" in one_error_line(proc)
    assert [p.name for p in tmp_path.iterdir()] == ["something"]


@pytest.mark.parametrize("json_flag", [False, True], ids=["text", "json"])
def test_demo_without_torch_is_one_line_exit_2(json_flag: bool) -> None:
    args = ["demo", "--json"] if json_flag else ["demo"]
    # torch made unimportable in the child only: None in sys.modules makes `import torch`
    # raise ImportError, as on a machine without the extra.
    code = (
        "import sys; sys.modules['torch'] = None; "
        f"sys.argv = ['restorepoint', *{args!r}]; "
        "from restorepoint._cli import main; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert "pip install 'restorepoint[torch]'" in line
    if json_flag:
        error = json.loads(proc.stdout)["error"]
        assert error["exit_code"] == 2


def test_demo_without_numpy_prints_no_warning(tmp_path: Path) -> None:
    """torch's CPU wheel without numpy warns at import ("Failed to initialize NumPy"): the
    README's first command must not show a newcomer a warning they cannot act on. numpy is
    made unimportable in the children only, as on a machine without it."""
    blocker = tmp_path / "no-numpy" / "numpy"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), *sys.path])}
    # The warning is really there without restorepoint: torch imported alone shows it.
    alone = subprocess.run(
        [sys.executable, "-c", "import torch"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert "Failed to initialize NumPy" in alone.stderr
    # Without --workdir: the store is deleted with the temporary directory, so no path is shown.
    proc = cli("demo", "--seed", "3", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "bitwise identical to the uninterrupted run: yes" in proc.stdout
    (where,) = [line for line in proc.stdout.splitlines() if line.startswith("restore point")]
    assert where == (
        "restore point deleted with the demo's temporary files (--workdir DIR keeps them)"
    )
    runtime = subprocess.run(
        [sys.executable, "-c", "import restorepoint.torch"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert runtime.returncode == 0 and runtime.stderr == ""
