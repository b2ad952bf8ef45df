"""The one way out (spec 19.7): every publish goes through ``ops.publish``, and a just-published
restore point survives its own prune when an older branch of the run has a higher step (a run
resumed from an older restore point publishes lower steps). Shown on each integration path:
the library, the CLI, the PyTorch runtime under ``restorepoint run --resume-from``, and the
Lightning callback. (The supervisor publishing an external trainer's snapshots:
tests/preempt/test_external_loop.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from clirun import cli
from crafted import (
    RUN,
    pack_demo,
    preempted_checkpoint,
    sigterm_at_step,
    trainer_command,
)

import restorepoint
from restorepoint import UsageError, list_store
from restorepoint.ops.publish import HeadSpec, PackOptions, publish


def checkpoint(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "state.bin").write_bytes(b"weights" * 100)
    return root


def steps(store: str, run: str) -> list[int]:
    return [e.step for e in list_store(store, run=run)]


def test_the_library_publish_protects_what_it_published(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store'}/"
    source = checkpoint(tmp_path / "ckpt")
    # Full restore points: an incremental one would keep its base too (spec 28.5).
    full = PackOptions(incremental=False)
    for step in (500, 2000):
        publish(source, store, HeadSpec(step, run="r1"), full)
    done = publish(source, store, HeadSpec(1000, run="r1"), full, keep_last=1)
    assert done.prune_error is None and done.pruned is not None
    assert steps(store, "r1") == [2000, 1000]
    kept = {e.step: reasons for e, reasons in done.pruned.runs[0].keep}
    assert kept[1000] == ["just published"]
    assert done.to_dict()["pruned"] == [u for u in done.pruned.deleted]


def test_publish_to_a_url_replaces_and_refuses_keep_last(tmp_path: Path) -> None:
    source = checkpoint(tmp_path / "ckpt")
    url = str(tmp_path / "one.rp")
    first = publish(source, url, HeadSpec(1))
    second = publish(source, url, HeadSpec(2), PackOptions(level=0), handoff=tmp_path / "h.json")
    assert restorepoint.read_manifest(url).position.step == 2 != first.manifest.position.step
    assert json.loads((tmp_path / "h.json").read_text())["id"] == second.manifest.id
    with pytest.raises(UsageError, match="needs a store DEST"):
        publish(source, url, HeadSpec(3), keep_last=1)


def test_a_head_is_validated_once_where_it_is_made() -> None:
    with pytest.raises(UsageError):
        HeadSpec(1, run="not a run id")
    head = HeadSpec(3, config={"lr": 1}, operational_keys=("b", "a"))
    assert head.run is not None and head.run.startswith("cfg-")
    assert head.operational_keys == ("a", "b")
    assert head.at(restorepoint.Position(4)).position.step == 4


def test_the_cli_pack_keep_last_protects_what_it_published(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store'}/"
    source = checkpoint(tmp_path / "ckpt")
    for step in ("500", "2000"):
        proc = cli("pack", str(source), store, "--step", step, "--run", "r1", "--full")
        assert proc.returncode == 0, proc.stderr
    proc = cli(
        "pack", str(source), store, "--step", "1000", "--run", "r1", "--keep-last", "1", "--full"
    )
    assert proc.returncode == 0, proc.stderr
    assert steps(store, "r1") == [2000, 1000]
    assert "deleted " in proc.stdout and "0000000000000500-" in proc.stdout


def test_the_runtime_resumed_from_an_older_restore_point_keeps_what_it_publishes(
    tmp_path: Path,
) -> None:
    """The issue's case: a run resumed with ``restorepoint run --resume-from`` an older restore
    point of its run, ``keep_last=1``, in a store that also holds a restore point of that run
    with a higher step, is preempted: it publishes, and its own prune keeps what it published
    (before the one publish path, it deleted it at once)."""
    checkpoints = preempted_checkpoint(tmp_path / "a", at_step=5)
    at = json.loads((checkpoints / "position.json").read_text())
    older = restorepoint.Position(at["step"], at["epoch"], at["batch"])
    store = f"{tmp_path / 'store'}/"
    # Full restore points (an incremental one keeps its base too, spec 28.5): the supervisor's
    # --full reaches the trainer's own publishes.
    resumed = pack_demo(checkpoints, store, position=older, incremental=False)
    pack_demo(checkpoints, store, position=restorepoint.Position(90, 2, 26), incremental=False)
    command = [
        *(sys.executable, "-m", "restorepoint", "run", "--store", store, "--full"),
        *("--resume-from", resumed.url, "--"),
        *trainer_command(tmp_path / "b" / "runs", tmp_path / "b" / "out.pt", "--keep-last",
                         "1", "--step-delay", "0.02"),
    ]  # fmt: skip
    code, err = sigterm_at_step(command, older.step + 4)
    assert code == 42, err
    published = [s for s in steps(store, RUN) if s not in (90, older.step)]
    assert len(published) == 1 and older.step < published[0] < 90
    (mine,) = [e for e in restorepoint.list_store(store, run=RUN) if e.step == published[0]]
    assert restorepoint.read_manifest(f"{store}{mine.name}").format_version == "1.0"
    # The newest (the other branch) and what was just published stay; so does the older one
    # it resumed from, which the supervisor's resume marker protected while the run lived
    # (spec 19.9). The run has ended: its marker is gone, and the next prune takes it.
    assert steps(store, RUN) == [90, published[0], older.step]
    assert not list((tmp_path / "store" / RUN).glob(".resumed-*.json"))
    restorepoint.prune(store, keep_last=2, run=RUN)
    assert steps(store, RUN) == [90, published[0]]


def test_the_lightning_callback_keeps_what_it_publishes(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from restorepoint.adapters.lightning import LAST, PreemptionCallback, _trainer_info

    store = f"{tmp_path / 'store'}/"
    info = _trainer_info()
    source = tmp_path / "other-branch"
    source.mkdir()
    (source / LAST).write_bytes(b"a later checkpoint of the run")
    restorepoint.pack(
        source, store, position=50, trainer=(info.name, info.version), terms=dict(info.terms),
        run="lit",
    )  # fmt: skip
    callback = PreemptionCallback(tmp_path / "ckpt", store=store, run="lit", keep_last=1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / LAST).write_bytes(b"the checkpoint at step 6")
    callback._pack(6, 0)
    assert [e["event"] for e in callback.events] == ["packed"]
    assert steps(store, "lit") == [50, 6]
