"""Multi-node jobs: ranks that share only the store (spec section 25).

Every rank is a subprocess over gloo with a run directory of its own (``--root-per-rank``: two
or four "nodes"), the store moto's S3 server (a local directory where only the ranks' steps are
at stake). Each rank publishes its own part and
rank 0 the commit once every part is in; a resume on fresh directories imports, on each rank,
only its own part. Shown: SIGTERM on every rank at a random step gives one restore point with
every rank's state (what DDP's ranks hold alike stored once), and the resumed ranks end bit for
bit where an uninterrupted run ends (2 and 4 ranks); ranks whose run directories disagree resume
from the store; a rank SIGKILLed while its part uploads leaves no new restore point, the
previous one the newest and resumable; a resume on another world size is refused."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from clirun import cli  # noqa: E402

from restorepoint.ops import latest, list_store, verify  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402
from ._ranks import SCRIPT, final, launch  # noqa: E402

pytestmark = pytest.mark.slow

TOTAL = tv.total_steps()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Uninterrupted runs of 2 and 4 ranks, without a store."""
    out = {}
    for world in (2, 4):
        work = tmp_path_factory.mktemp(f"ref{world}")
        ranks = launch(work, "ref", "--root", str(work / "runs"), *_ddp(world),
                       per_rank_root=True, world=world)  # fmt: skip
        assert [r.code for r in ranks] == [0] * world, "".join(r.err for r in ranks)
        out[world] = work
    return out


def _ddp(world: int) -> tuple[str, ...]:
    """DDP's options for a bitwise resume. Beyond two ranks the order of a gradient sum depends
    on DDP's bucket layout, which DDP rebuilds after the first step of every process: a resumed
    process's first step sums in another order than the uninterrupted run's. Without the
    rebuild (find_unused_parameters=True) every step sums alike (docs/adapters.md)."""
    return ("--ddp-option", "find_unused_parameters=true") if world > 2 else ()


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    if kind == "local":
        return f"{tmp_path / 'store'}/", None, None
    bucket = request.getfixturevalue("s3_bucket")
    options = request.getfixturevalue("s3_storage_options")
    env = request.getfixturevalue("s3_env_factory")(options)
    return f"s3://{bucket}/runs/", options, env


@pytest.mark.parametrize(("world", "kind"), [(2, "s3"), (4, "s3")])
def test_sigterm_on_every_rank_then_resume_on_fresh_nodes(
    world: int,
    kind: str,
    tmp_path: Path,
    references: dict[int, Path],
    request: pytest.FixtureRequest,
) -> None:
    store, options, env = _store(kind, tmp_path, request)
    step = random.Random(os.urandom(8)).randrange(2, TOTAL - 1)
    print(f"SIGTERM at step {step}")
    args = ("--root", str(tmp_path / "a"), "--store", store, "--sigterm-at", str(step),
            *_ddp(world))  # fmt: skip
    ranks = launch(tmp_path, "pre", *args, per_rank_root=True, world=world, env=env)
    assert [r.code for r in ranks] == [42] * world, "".join(r.err for r in ranks)
    # Each node holds its own rank's file only: nothing was shared but the store.
    for r in range(world):
        (run_dir,) = (tmp_path / "a" / f"node{r}").iterdir()
        files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        assert f"last.rank{r}.pt" in files
        assert not [f for f in files if f.startswith("last.rank") and f != f"last.rank{r}.pt"]
    (entry,) = list_store(store, storage_options=options)
    assert entry.step == step
    report = verify(entry.url, storage_options=options)
    assert report.manifest.parts is not None
    assert report.manifest.parts.world_size == world
    ranks_of = [p.manifest.part.rank for p in report.parts if p.manifest.part]
    # A part per rank, and the shared part: DDP's model and optimizer, stored once.
    assert sorted(r for r in ranks_of if r is not None) == list(range(world))
    assert ranks_of.count(None) == 1
    # Fresh nodes: each rank imports its own part from the store and trains to the end.
    ranks = launch(tmp_path, "res", "--root", str(tmp_path / "b"), "--store", store,
                   *_ddp(world), per_rank_root=True, world=world, env=env)  # fmt: skip
    assert [r.code for r in ranks] == [0] * world, "".join(r.err for r in ranks)
    assert all(f"resumed {step}" in " ".join(r.out) for r in ranks)
    for r in range(world):
        (run_dir,) = (tmp_path / "b" / f"node{r}").iterdir()
        (imported,) = (run_dir / "imports").iterdir()
        assert imported.name.endswith(f".rank{r}")
        assert sorted(p.name for p in imported.iterdir() if p.name.startswith("last.")) == [
            f"last.rank{r}.pt"
        ]
        resumed = final(tmp_path, "res", r)
        # DDP: every resumed rank holds the same weights.
        tv.assert_same_state(final(tmp_path, "res", 0)["model"], resumed["model"], f"model{r}")
        tv.assert_same_state(final(references[world], "ref", r), resumed, str(r))


def test_a_rank_killed_in_its_upload_leaves_the_previous_newest(
    tmp_path: Path, references: dict[int, Path], request: pytest.FixtureRequest
) -> None:
    store, opts, env = _store("s3", tmp_path, request)
    first = 3
    args = ("--root", str(tmp_path / "a"), "--store", store, "--sigterm-at", str(first))
    ranks = launch(tmp_path, "pre", *args, per_rank_root=True, world=2, env=env)
    assert [r.code for r in ranks] == [42, 42], "".join(r.err for r in ranks)
    before = latest(store, verify_it=True, storage_options=opts)
    assert before.step == first
    # Resumed, and at the next snapshot rank 1 dies while its part uploads.
    args = ("--root", str(tmp_path / "a"), "--store", store, "--sigterm-at", str(first + 3),
            "--kill-in-upload", "1")  # fmt: skip
    ranks = launch(tmp_path, "killed", *args, per_rank_root=True, world=2, env=env)
    assert ranks[1].code == -9
    assert ranks[0].code != 0
    assert [e.url for e in list_store(store, storage_options=opts)] == [before.url]
    assert latest(store, verify_it=True, storage_options=opts).url == before.url
    # The previous one resumes, on fresh nodes, to the uninterrupted end.
    ranks = launch(
        tmp_path,
        "res",
        "--root",
        str(tmp_path / "b"),
        "--store",
        store,
        per_rank_root=True,
        world=2,
        env=env,
    )
    assert [r.code for r in ranks] == [0, 0], "".join(r.err for r in ranks)
    assert all(f"resumed {first}" in " ".join(r.out) for r in ranks)
    for r in (0, 1):
        tv.assert_same_state(final(references[2], "ref", r), final(tmp_path, "res", r), str(r))


def test_another_world_size_is_refused(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store'}/"
    args = ("--root", str(tmp_path / "a"), "--store", store, "--sigterm-at", "3")
    ranks = launch(tmp_path, "pre", *args, per_rank_root=True, world=2)
    assert [r.code for r in ranks] == [42, 42], "".join(r.err for r in ranks)
    (alone,) = launch(
        tmp_path,
        "one",
        "--root",
        str(tmp_path / "b"),
        "--store",
        store,
        per_rank_root=True,
        world=1,
    )
    assert alone.code != 0
    # Refused by the gate (choose), the world size a field like any other.
    assert "world_size: here 1 (one process), in the restore point 2" in alone.err
    assert "not declared reshardable" in alone.err
    assert not any(line.startswith("step ") for line in alone.out)
    # Under the supervisor the refusal is the trainer's exit 3, one error line, not requeued.
    trainer = [sys.executable, str(SCRIPT), "ddp", "--rank", "0", "--world", "1",
               "--out", str(tmp_path / "sup.pt"), "--root", str(tmp_path / "c")]  # fmt: skip
    proc = cli("run", "--store", store, "--", *trainer, timeout=240)
    assert proc.returncode == 3, proc.stderr
    assert "world_size: here 1 (one process), in the restore point 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "\nstep " not in proc.stdout


def test_ranks_whose_run_directories_disagree_resume_from_the_store(
    tmp_path: Path, references: dict[int, Path]
) -> None:
    """Rank 1's node lost its newest snapshot (as a kill in its save leaves it): rank 0's run
    directory is at step 6, rank 1's at 3. The ranks agree: both resume from the store's
    newest (step 3), never each from its own; without a store they refuse."""
    store = f"{tmp_path / 'store'}/"
    root = tmp_path / "a"
    ranks = launch(tmp_path, "pre", "--root", str(root), "--store", store, "--sigterm-at", "3",
                   per_rank_root=True, world=2)  # fmt: skip
    assert [r.code for r in ranks] == [42, 42], "".join(r.err for r in ranks)
    (run1,) = (root / "node1").iterdir()
    saved = {p.name: p.read_bytes() for p in (run1 / "checkpoints").iterdir()}
    # On to step 6 without the store: both run directories move on, the store stays at 3.
    ranks = launch(tmp_path, "on", "--root", str(root), "--sigterm-at", "6",
                   per_rank_root=True, world=2)  # fmt: skip
    assert [r.code for r in ranks] == [42, 42], "".join(r.err for r in ranks)
    assert all("resumed 3" in " ".join(r.out) for r in ranks)
    for name, data in saved.items():
        (run1 / "checkpoints" / name).write_bytes(data)
    ranks = launch(tmp_path, "no-store", "--root", str(root), per_rank_root=True, world=2)
    assert all(r.code != 0 for r in ranks)
    assert all("hold snapshots of steps [6, 3]" in r.err for r in ranks), ranks[0].err
    assert not any(line.startswith("step ") for r in ranks for line in r.out)
    ranks = launch(tmp_path, "res", "--root", str(root), "--store", store,
                   per_rank_root=True, world=2)  # fmt: skip
    assert [r.code for r in ranks] == [0, 0], "".join(r.err for r in ranks)
    assert all("resumed 3" in " ".join(r.out) for r in ranks)
    for r in (0, 1):
        tv.assert_same_state(final(references[2], "ref", r), final(tmp_path, "res", r), str(r))
