"""Two CPU ranks over gloo (two subprocesses, a file:// rendezvous in tmp_path: no port to
choose): a DDP model on ResumableRun with a store. A stop requested on rank 0 only is agreed by
both ranks, which exit 42 at the same step; one restore point holds both ranks' files (a part
each, spec section 25); a
2-rank resume ends bit for bit where an uninterrupted 2-rank run ends, from the run directory
and from the store on a fresh machine. A default group that carries no CPU tensor (an NCCL
job's) is never the runtime's. Without a process group the same code runs alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from restorepoint.ops import (  # noqa: E402
    import_restore_point,
    list_store,
    read_manifest,
    verify,
)
from restorepoint.runtime.state import read_state  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402
from ._ranks import final, launch  # noqa: E402

pytestmark = pytest.mark.slow

TOTAL = tv.total_steps()


def rank_step(path: Path) -> int:
    return int(read_state(path)["position"]["step"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-rank run. It snapshots every 4 steps into its own store with a slow
    pack, which must change nothing about training (the preempted runs never snapshot
    periodically) and publish each step's own files."""
    work = tmp_path_factory.mktemp("ddp-reference")
    ranks = launch(
        work,
        "ref",
        *("--root", str(work / "runs"), "--store", f"{work / 'store'}/"),
        *("--snapshot-every", "4", "--pack-delay", "0.3"),
    )
    assert [r.code for r in ranks] == [0, 0], ranks[0].err + ranks[1].err
    return work


def test_reference_ranks_agree_and_each_restore_point_holds_its_own_step(
    reference: Path,
) -> None:
    a, b = final(reference, "ref", 0), final(reference, "ref", 1)
    # DDP: both ranks hold the same weights after every step.
    tv.assert_same_state(a["model"], b["model"], "model")
    entries = list_store(f"{reference / 'store'}/")
    # Every 4 steps, and the state at completion (a final snapshot: on with a store).
    assert sorted(e.step for e in entries) == [4, 8, 12, 16, TOTAL]
    for entry in entries:
        dest = reference / "imported" / str(entry.step)
        import_restore_point(entry.url, dest)
        assert [rank_step(dest / f"last.rank{r}.pt") for r in (0, 1)] == [entry.step] * 2
        assert json.loads((dest / "position.json").read_text())["step"] == entry.step


def test_stop_on_rank_0_is_agreed_published_once_and_resumes_bit_for_bit(
    tmp_path: Path, reference: Path
) -> None:
    runs, store = tmp_path / "runs", f"{tmp_path / 'store'}/"
    ranks = launch(tmp_path, "pre", "--root", str(runs), "--store", store, "--stop-at", "5")
    assert [r.code for r in ranks] == [42, 42], ranks[0].err + ranks[1].err
    # Rank 1 never asked: it stopped because the flag is or-ed across ranks at the boundary.
    assert [r.out[-1] for r in ranks] == ["exit 42 at step 5"] * 2
    (run_dir,) = runs.iterdir()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    # What both ranks hold alike (DDP: model, optimizer, scheduler) is saved once, in a
    # shared file named by its content; each rank's own file holds its RNG and position.
    (shared,) = [name for name in checkpoints if name.startswith("shared-")]
    assert checkpoints == ["last.rank0.pt", "last.rank1.pt", "position.json", shared]
    tracked = ["model", "optimizer", "scheduler"]
    for r in (0, 1):
        state = read_state(run_dir / "checkpoints" / f"last.rank{r}.pt")
        assert (state["rank"], state["world_size"], state["position"]["step"]) == (r, 2, 5)
        assert state["objects"] == {}
        assert state["shared"] == {"file": shared, "objects": tracked}
    common = read_state(run_dir / "checkpoints" / shared)
    assert sorted(common["objects"]) == tracked
    assert "rng" not in common
    (entry,) = list_store(store)
    assert (entry.step, entry.run) == (5, run_dir.name)
    # One commit, a part per rank and the shared part (spec section 25), which holds the
    # shared state and the position sidecar: the model is stored once, not once a rank.
    assert read_manifest(entry.url).payload == ()
    report = verify(entry.url)
    held = {
        p.manifest.part.rank: sorted(e.path for e in p.manifest.payload or ())
        for p in report.parts
        if p.manifest.part is not None
    }
    assert held == {0: ["last.rank0.pt"], 1: ["last.rank1.pt"], None: ["position.json", shared]}
    status = json.loads((run_dir / "run_status.json").read_text())
    assert (status["status"], status["step"], status["resubmit_count"]) == ("preempted", 5, 1)
    events = tv.events(run_dir)
    assert [e["step"] for e in events if e["event"] == "graceful_shutdown"] == [5]
    assert [e["step"] for e in events if e["event"] == "uploaded"] == [5]

    # The store as the stop left it, for another machine below: the run that completes here
    # publishes its final state into the store it runs with.
    shutil.copytree(tmp_path / "store", tmp_path / "store-b")
    # The same machine: from the run directory.
    ranks = launch(tmp_path, "local", "--root", str(runs), "--store", store)
    assert [r.code for r in ranks] == [0, 0], ranks[0].err + ranks[1].err
    assert all("resumed 5 0 5" in r.out for r in ranks)
    # Another machine: nothing but the store; both ranks import at once.
    fresh = tmp_path / "machine-b"
    store = f"{tmp_path / 'store-b'}/"
    ranks = launch(tmp_path, "store", "--root", str(fresh), "--store", store)
    assert [r.code for r in ranks] == [0, 0], ranks[0].err + ranks[1].err
    assert all("resumed 5 0 5" in r.out for r in ranks)
    # From the store, in memory: the store is a local path, as near as a copy in the run
    # directory would be, so none is written (a store that is not keeps one a rank, named
    # after the restore point: tests/runtime/test_multinode.py). Each rank imports its own
    # part: each resumes its own state, below.
    machine_b = fresh / run_dir.name
    assert not (machine_b / "imports").exists()
    resumed = [e for e in tv.events(machine_b) if e["event"] == "resumed"]
    assert [(e["step"], e["source"]) for e in resumed] == [(5, "store")]
    for tag in ("local", "store"):
        for r in (0, 1):
            tv.assert_same_state(final(reference, "ref", r), final(tmp_path, tag, r), f"{tag}{r}")


def test_a_default_group_that_carries_no_cpu_tensor_is_never_the_runtimes(tmp_path: Path) -> None:
    """An NCCL job's default group has no CPU backend: a collective of a CPU tensor on it
    raises. "cuda:gloo" is such a group on a machine without a GPU. The runtime's own
    agreements (a completed run, the flags at each boundary, the resume's step, the stop's
    barrier) and its parts' go on gloo groups of its own: a stop on rank 0 is agreed, both
    ranks exit 42 with one commit, and a fresh machine resumes from the store and ends bit for
    bit where an uninterrupted run of the same job ends. (The trainer does no collective of
    its own on CPU tensors, as an NCCL job's are on the GPU: no DDP here.)"""
    cpu_less = ("--backend", "cuda:gloo")
    store = f"{tmp_path / 'store'}/"
    ranks = launch(tmp_path, "pre", "--root", str(tmp_path / "runs"), "--store", store,
                   "--stop-at", "5", *cpu_less)  # fmt: skip
    assert [r.code for r in ranks] == [42, 42], ranks[0].err + ranks[1].err
    for r in ranks:
        assert r.out[0].startswith("the default group refuses a CPU tensor: No backend type")
        assert r.out[-1] == "exit 42 at step 5"
    (entry,) = list_store(store)
    assert entry.step == 5
    # A part a rank, and the shared part (the position, and what the ranks hold alike).
    parts = [p.manifest.part.rank for p in verify(entry.url).parts if p.manifest.part]
    assert sorted(parts, key=str) == [0, 1, None]

    fresh = launch(tmp_path, "b", "--root", str(tmp_path / "machine-b"), "--store", store,
                   *cpu_less)  # fmt: skip
    assert [r.code for r in fresh] == [0, 0], fresh[0].err + fresh[1].err
    assert all("resumed 5 0 5" in r.out and r.out[-1] == f"step {TOTAL}" for r in fresh)
    whole = launch(tmp_path, "whole", "--root", str(tmp_path / "whole"), *cpu_less)
    assert [r.code for r in whole] == [0, 0], whole[0].err + whole[1].err
    for r in (0, 1):
        tv.assert_same_state(final(tmp_path, "whole", r), final(tmp_path, "b", r), f"rank {r}")


def test_without_a_process_group_the_same_code_runs_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not torch.distributed.is_initialized()
    threads = torch.get_num_threads()
    runs = tmp_path / "runs"
    common = ["--world", "1", "--rank", "0", "--root", str(runs)]
    try:
        assert tv.ddp_main([*common, "--out", str(tmp_path / "a.pt"), "--stop-at", "5"]) == 42
        assert capsys.readouterr().out.splitlines()[-1] == "exit 42 at step 5"
        (run_dir,) = runs.iterdir()
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
            "last.pt",
            "position.json",
        ]
        assert tv.ddp_main([*common, "--out", str(tmp_path / "b.pt")]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out.splitlines()
    assert "resumed 5 0 5" in out and out[-1] == f"step {TOTAL}"
