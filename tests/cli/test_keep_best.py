"""Retention by metric (spec 4.3, 19.5, 19.9): restore points that record metrics, prune
--keep-best beside --keep-last, and the resume markers that protect what a live run resumed
from. Real subprocesses for the CLI; the stores are seeded with the library."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

import restorepoint
from restorepoint.ops.resumed import MAX_LEASE_S, ResumeMarker
from restorepoint.ops.store import KeepBest, entry_name, prune
from restorepoint.storage import resolve

CHUNK = 65536
#: val_loss of the restore points of run r, oldest (step 1) first; None: not recorded.
LOSSES: list[float | None] = [0.9, 0.2, None, 0.5, 0.1, None, 0.7, 0.8]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(3000))
    return src


def seed(source: Path, store: str, opts: dict[str, Any] | None = None) -> list[str]:
    """Run r at steps 1..8 with LOSSES (some without the metric): the store names."""
    names = []
    for step, loss in enumerate(LOSSES, start=1):
        made = restorepoint.pack(
            source, store, position=step, run="r", chunk_size=CHUNK, level=0,
            created=f"2026-01-01T00:{step:02d}:00.000Z", storage_options=opts,
            incremental=False,  # the rules over full restore points (chains: test_delta.py)
            metrics={"val_loss": loss, "step_time": 1.5} if loss is not None else {"acc": 0.5},
        )  # fmt: skip
        names.append(entry_name(made.manifest))
    return names


def kept(report: dict[str, Any]) -> dict[str, list[str]]:
    ((run,),) = [report["runs"]]
    return {e["name"]: e["reasons"] for e in run["keep"]}


def test_pack_records_metrics_and_inspect_shows_them(source: Path, tmp_path: Path) -> None:
    url = str(tmp_path / "one.rp")
    proc = cli(
        "pack", str(source), url, "--step", "3", "--metric", "val_loss=0.213",
        "--metric", "tokens=1500", "--metric", "val/acc=9.5e-1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    head = json.loads(cli("inspect", url, "--json").stdout)["manifest"]
    assert "metrics       tokens=1500, val/acc=0.95, val_loss=0.213" in cli("inspect", url).stdout
    assert head["metrics"] == {"tokens": 1500, "val/acc": 0.95, "val_loss": 0.213}
    # Without --metric the member is absent: heads of old writers and new ones alike.
    assert restorepoint.pack(source, str(tmp_path / "two.rp"), position=1).manifest.metrics == {}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--metric", "val_loss=nan"], "finite"),
        (["--metric", "val_loss=inf"], "finite"),
        (["--metric", "val_loss=fast"], "not a number"),
        (["--metric", "val loss=1"], "metric name"),
        (["--metric", "val_loss"], "NAME=VALUE"),
        (["--metric", "a=1", "--metric", "a=2"], "twice"),
        (["--keep-best", "2"], "--best-metric"),
    ],
)
def test_pack_refuses_bad_metrics(
    source: Path, tmp_path: Path, args: list[str], words: str
) -> None:
    proc = cli("pack", str(source), f"{tmp_path}/store/", "--step", "1", "--run", "r", *args)
    assert proc.returncode == 2
    assert words in one_error_line(proc)
    assert not (tmp_path / "store").exists()  # nothing published


def test_too_many_metrics_is_refused_before_anything_is_written(
    source: Path, tmp_path: Path
) -> None:
    with pytest.raises(restorepoint.UsageError, match="65 metrics"):
        restorepoint.pack(
            source, str(tmp_path / "x.rp"), position=1, metrics={f"m{i}": i for i in range(65)}
        )
    assert not (tmp_path / "x.rp").exists()


def test_prune_keeps_the_best_and_the_newest(source: Path, tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    names = seed(source, store)
    proc = cli(
        "prune", store, "--keep-best", "2", "--metric", "val_loss", "--keep-last", "1",
        "--dry-run", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = kept(json.loads(proc.stdout))
    rule = "keep-best 2 val_loss min"
    # Best by val_loss: step 5 (0.1), step 2 (0.2); step 8 is the newest. Steps 3 and 6 do
    # not record val_loss: never best, so only keep-last could keep them.
    assert plan == {
        names[7]: ["newest", "newest that verifies", "keep-last 1"],
        names[4]: [rule],
        names[1]: [rule],
    }
    # max: the highest val_loss (0.9 at step 1, then 0.8 at step 8); without --keep-last.
    proc = cli("prune", store, "--keep-best", "2", "--metric", "val_loss", "--mode", "max")
    assert proc.returncode == 0, proc.stderr
    left = {e.name for e in restorepoint.list_store(store)}
    assert left == {names[0], names[7]}
    assert "deleted 6 restore points" in proc.stdout
    assert "keep-best 2 val_loss max" in proc.stdout


def test_a_metric_no_restore_point_records_keeps_nothing_more(source: Path, tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    names = seed(source, store)
    report = prune(store, keep_best=3, metric="loss_typo", dry_run=True).to_dict()
    assert set(kept(report)) == {names[7]}  # only the newest (which verifies)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--metric", "val_loss"], "--keep-best"),
        (["--mode", "max", "--keep-last", "1"], "--keep-best"),
        (["--keep-best", "2"], "--metric"),
        (["--keep-best", "2", "--metric", "val_loss", "--mode", "median"], "min or max"),
        (["--keep-best", "2", "--metric", "val loss"], "metric name"),
    ],
)
def test_prune_refuses_bad_keep_best(tmp_path: Path, args: list[str], words: str) -> None:
    proc = cli("prune", f"{tmp_path}/", *args)
    assert proc.returncode == 2
    assert words in one_error_line(proc)


def test_a_live_resume_marker_protects_an_older_branch(source: Path, tmp_path: Path) -> None:
    """A run resumed from step 3 (an older restore point, no val_loss): while its marker
    lives, no prune deletes step 3; once it expires or is released, keep-last decides."""
    store = f"{tmp_path}/store/"
    names = seed(source, store)
    location = resolve(store)
    marker = ResumeMarker(location, names[2], lease_s=3600)
    marker.renew()
    # Hostile markers protect nothing: garbage, a lease beyond MAX_LEASE_S, another run's
    # name, a name that is no restore point's.
    run_dir = tmp_path / "store" / "r"
    far = int(time.time()) + MAX_LEASE_S + 3600
    hostile = {
        "0" * 32: b"\x00not json",
        "1" * 32: json.dumps({"expires": far, "name": names[0]}, separators=(",", ":")).encode(),
        "2" * 32: b'{"expires":1,"name":"' + names[1].encode() + b'"}',
        "3" * 32: b'{"expires":' + str(far - MAX_LEASE_S).encode() + b',"name":"r/x.rp"}',
    }
    for holder, data in hostile.items():
        (run_dir / f".resumed-{holder}.json").write_bytes(data)
    proc = cli("prune", store, "--keep-last", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = kept(json.loads(proc.stdout))
    assert plan[names[2]] == ["resumed from by a live run"]
    assert set(plan) == {names[7], names[6], names[2]}
    # The markers are not restore points: list shows none of them, prune deletes none.
    assert len(restorepoint.list_store(store)) == 3
    assert len(list(run_dir.glob(".resumed-*.json"))) == 5
    # Expired (a run that died): step 3 goes like any other.
    report = prune(store, keep_last=2, now=time.time() + 7200)
    assert [Path(u).name for u in report.deleted] == [names[2].split("/")[1]]
    # Released: the marker is gone.
    marker.release()
    assert len(list(run_dir.glob(".resumed-*.json"))) == 4


def test_keep_best_value_checks_itself() -> None:
    with pytest.raises(restorepoint.UsageError):
        KeepBest(0, "val_loss")
    assert KeepBest.of(None, None, None) is None
    assert KeepBest.of(1, "val_loss", None) == KeepBest(1, "val_loss", "min")


@pytest.mark.s3
def test_keep_best_on_s3(
    source: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_env: dict[str, str]
) -> None:
    store = f"s3://{s3_bucket}/store/"
    names = seed(source, store, s3_storage_options)
    marker = ResumeMarker(resolve(store, s3_storage_options), names[0])
    marker.renew()
    proc = cli(
        "prune", store, "--keep-best", "1", "--metric", "val_loss", "--keep-last", "1", "--json",
        env=s3_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = kept(json.loads(proc.stdout))
    assert plan == {
        names[7]: ["newest", "newest that verifies", "keep-last 1"],
        names[4]: ["keep-best 1 val_loss min"],
        names[0]: ["resumed from by a live run"],
    }
    left = {e.name for e in restorepoint.list_store(store, storage_options=s3_storage_options)}
    assert left == {names[0], names[4], names[7]}
    marker.release()


def test_pack_then_prune_keeps_the_best(source: Path, tmp_path: Path) -> None:
    """pack --keep-last with --keep-best: the pack's own prune keeps the best too (19.7)."""
    store = f"{tmp_path}/store/"
    names = seed(source, store)
    proc = cli(
        "pack", str(source), store, "--step", "9", "--run", "r", "--metric", "val_loss=0.95",
        "--keep-last", "1", "--keep-best", "1", "--best-metric", "val_loss", "--json", "--full",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    left = {e.name for e in restorepoint.list_store(store)}
    assert left == {out["url"].removeprefix(store), names[4]}  # the new one, the best (0.1)
    assert len(out["pruned"]) == 7


def test_run_hands_keep_best_to_the_trainer(tmp_path: Path) -> None:
    """restorepoint run --keep-best: the trainer (a ResumableRun or the Lightning callback
    under it) finds the rule in its environment and prunes by it."""
    show = "import os; print(os.environ['RESTOREPOINT_KEEP_BEST'])"
    store = f"{tmp_path}/store/"
    proc = cli(
        "run", "--store", store, "--keep-best", "2", "--metric", "val_loss", "--mode", "max",
        "--", sys.executable, "-c", show,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "2 val_loss max"
    assert KeepBest.from_text("2 val_loss max") == KeepBest(2, "val_loss", "max")
    proc = cli("run", "--store", store, "--metric", "val_loss", "--", sys.executable, "-c", "0")
    assert proc.returncode == 2
    assert "--keep-best" in one_error_line(proc)


def test_run_marks_what_it_resumed_from_while_the_trainer_lives(
    source: Path, tmp_path: Path
) -> None:
    """restorepoint run --resume-from a restore point of its own store: while the trainer runs
    (here: a prune of the store), that restore point is protected; after, it is not."""
    store = f"{tmp_path}/store/"
    names = seed(source, store)
    old = restorepoint.list_store(store)[-1]  # step 1
    assert old.name == names[0]
    proc = cli(
        # The seeded restore points record no torch term: the gate is not what this tests.
        "run", "--store", store, "--run", "r", "--resume-from", old.url, "--no-gate", "--force",
        "--",
        sys.executable, "-m", "restorepoint", "prune", store, "--keep-last", "1", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = kept(json.loads(proc.stdout))
    assert plan == {
        names[7]: ["newest", "newest that verifies", "keep-last 1"],
        names[0]: ["resumed from by a live run"],
    }
    assert not list((tmp_path / "store" / "r").glob(".resumed-*.json"))  # released
    # From the run's newest too: while the trainer runs, a newer restore point of the run and a
    # keep-last 1 prune leave the one it resumed from in place.
    newest = restorepoint.list_store(store)[0]
    step = (
        "import restorepoint as r, sys; "
        "r.pack(sys.argv[1], sys.argv[2], run='r', position=99, incremental=False)"
    )
    proc = cli(
        "run", "--store", store, "--run", "r", "--resume-from", newest.url, "--no-gate",
        "--force", "--", "sh", "-c",
        '"$0" -c "$1" "$2" "$3" && "$0" -m restorepoint prune "$3" --keep-last 1 --json',
        sys.executable, step, str(source), store,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = kept(json.loads(proc.stdout))
    assert plan[newest.name] == ["resumed from by a live run"]
    assert not list((tmp_path / "store" / "r").glob(".resumed-*.json"))  # released
