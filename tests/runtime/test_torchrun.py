"""torchrun keeps the resumable exit under ``restorepoint run``: two CPU workers over gloo
(tests/runtime/_trainer_variants.py's DDP trainer, started by the real
``python -m torch.distributed.run``), SIGTERM to the supervisor. torchrun turns its workers'
42 into its own 1; every worker left its stop marker, so ``restorepoint run`` exits 42. The run
then resumes from the store on a fresh machine and ends bit for bit where an uninterrupted
torchrun run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from restorepoint.ops import list_store  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = Path(tv.__file__)
WAIT = 240.0


def env() -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RESTOREPOINT_", "SUBMITIT_", "TORCHELASTIC_"))
    }
    if Path("/sys/class/net/lo").exists():
        # gloo picks an interface by the host name otherwise, which need not resolve.
        base["GLOO_SOCKET_IFNAME"] = "lo"
    return {**base, "OMP_NUM_THREADS": "1"}


def torchrun(work: Path, tag: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(SCRIPT), "ddp", "--out", str(work / f"{tag}-{{rank}}.pt"), *args,
    ]  # fmt: skip


def supervised(store: str, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "restorepoint", "run", "--store", store, "--", *command]


def test_sigterm_under_restorepoint_run_is_exit_42_and_the_resume_is_bit_for_bit(
    tmp_path: Path,
) -> None:
    store = f"{tmp_path / 'store'}/"
    reference = subprocess.run(
        torchrun(tmp_path, "ref", "--root", str(tmp_path / "ref-runs")),
        capture_output=True, text=True, env=env(), timeout=WAIT, check=False,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr

    out, err = tmp_path / "stopped.out", tmp_path / "stopped.err"
    command = torchrun(tmp_path, "a", "--root", str(tmp_path / "runs-a"), "--step-delay", "0.3")
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(supervised(store, command), stdout=stdout, stderr=stderr, env=env())
    try:
        deadline = time.monotonic() + WAIT
        while "step 3" not in out.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "no step 3"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr_text = err.read_text()
    assert code == 42, stderr_text
    (entry,) = list_store(store)
    assert 3 <= entry.step < tv.total_steps()
    lines = stderr_text.splitlines()
    # Rank 0 says it, once; the supervisor says why the launcher's 1 is a 42.
    stop = [ln for ln in lines if ln.startswith("restorepoint: stop (")]
    assert stop == [
        f"restorepoint: stop (SIGTERM) at step {entry.step}: restore point published to "
        f"{entry.url}; exiting 42 (resumable)"
    ]
    assert any(
        "launcher exited 1, and every worker stopped by the contract: exit 42" in ln for ln in lines
    ), stderr_text
    # Both ranks say it (their lines may interleave: each print is two writes, the text and
    # the newline, to the one file).
    assert out.read_text().count(f"exit 42 at step {entry.step}") == 2

    # Another machine: a fresh run directory, the same store.
    resumed = subprocess.run(
        supervised(store, torchrun(tmp_path, "b", "--root", str(tmp_path / "runs-b"))),
        capture_output=True, text=True, env=env(), timeout=WAIT, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count(f"resumed {entry.step} ") == 2, resumed.stdout
    for rank in (0, 1):
        got = torch.load(tmp_path / f"b-{rank}.pt", weights_only=False)
        want = torch.load(tmp_path / f"ref-{rank}.pt", weights_only=False)
        tv.assert_same_state(got, want, f"rank {rank}")
