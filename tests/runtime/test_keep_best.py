"""ResumableRun with retention by metric (spec 4.3, 19.5, 19.9): commit(metrics=...) records a
snapshot's metrics in its head, each publish prunes to the best k and the newest n, and a run
resumed from an older restore point protects it with a resume marker while it lives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.ops.store import entry_head, list_store, prune  # noqa: E402
from restorepoint.storage import resolve  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

CONFIG = {"seed": 0, "optimizer": {"lr": 0.1}}


def make(root: Path, store: str, **kwargs: Any) -> ResumableRun:
    options: dict[str, Any] = {
        "keep_last": 1, "keep_best": 1, "metric": "val_loss", "mode": "min",
        "snapshot_every": 2, "final_snapshot": False, **kwargs,
    }  # fmt: skip
    return ResumableRun(CONFIG, root=root, store=store, **options)


def train(run: ResumableRun, losses: dict[int, float | None], until: int) -> None:
    model = torch.nn.Linear(2, 2)
    run.track(model=model)
    run.resume()
    while run.step < until:
        loss = losses.get(run.step + 1)
        run.commit(metrics={"val_loss": loss} if loss is not None else None)
        run.wait()  # one publish (and its prune) per snapshot: none coalesced


def steps(store: str, run: str) -> dict[int, dict[str, Any]]:
    location = resolve(store)
    return {
        e.step: dict(entry_head(location.join(e.name), e).metrics)
        for e in list_store(store, run=run)
    }


def test_a_run_keeps_its_best_and_newest_and_protects_what_it_resumed_from(
    tmp_path: Path,
) -> None:
    store = f"{tmp_path}/store/"
    # First machine: snapshots at steps 2, 4, 6, 8; step 6 records no val_loss.
    with make(tmp_path / "a", store) as first:
        train(first, {2: 0.1, 4: 0.5, 6: None, 8: 0.4}, until=8)
    run_id = first.run_id
    # Each publish pruned to the newest (keep-last 1) and the best by val_loss (0.1, step 2).
    assert steps(store, run_id) == {2: {"val_loss": 0.1}, 8: {"val_loss": 0.4}}
    with pytest.raises(restorepoint.UsageError, match="finite"):
        make(tmp_path / "x", store).commit(metrics={"val_loss": float("nan")})
    with pytest.raises(restorepoint.UsageError, match="metric= NAME"):
        make(tmp_path / "x", store, metric=None)

    # A newer restore point of the run that this machine's gate refuses (another torch): a
    # second machine that accepts older ones resumes from step 8, an older branch.
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "last.pt").write_bytes(b"not for this machine")
    restorepoint.pack(
        payload, store, position=100, run=run_id, config=first.config,
        operational_keys=first.operational, trainer=first.trainer,
        terms={**first.terms, "torch": "0.0.0"}, level=0,
    )  # fmt: skip
    with make(tmp_path / "b", store, accept_older=True) as second:
        train(second, {10: 0.9}, until=10)
        assert second.resumed_from is not None and second.resumed_from.step == 8
        # Step 10 is published, and its prune kept step 8 for the live run alone.
        held = prune(store, keep_last=1, keep_best=1, metric="val_loss", dry_run=True)
        reasons = {e.step: r for e, r in held.runs[0].keep}
        assert reasons[8] == ["resumed from by a live run"]
        assert set(reasons) == {100, 8, 2}  # step 10 survived its own prune: just published
        assert reasons[2] == ["keep-best 1 val_loss min"]
        assert steps(store, run_id)[10] == {"val_loss": 0.9}
    # The run ended: its marker is gone, and step 8 goes like any other.
    assert not list((tmp_path / "store" / run_id).glob(".resumed-*.json"))
    report = prune(store, keep_last=1, keep_best=1, metric="val_loss")
    assert sorted(steps(store, run_id)) == [2, 100]
    assert len(report.deleted) == 2


def test_under_restorepoint_run_the_rule_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from restorepoint.ops.store import KeepBest

    monkeypatch.setenv("RESTOREPOINT_KEEP_BEST", "3 val_acc max")
    run = ResumableRun(CONFIG, root=tmp_path)
    assert run.keep_best == KeepBest(3, "val_acc", "max")
    assert run.publisher.keep_best == run.keep_best
    # Its own options win.
    own = ResumableRun(CONFIG, root=tmp_path, keep_best=1, metric="val_loss")
    assert own.keep_best == KeepBest(1, "val_loss", "min")
