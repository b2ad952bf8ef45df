"""The run directory: deterministic run ids, the identity record (refusal and adoption), the
status and event files (contents, and whole after every write), the tracker run id, and a
fresh start."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from restorepoint.errors import IncompatibleRestorePoint  # noqa: E402
from restorepoint.format import Position  # noqa: E402
from restorepoint.runtime import contract as run_contract  # noqa: E402
from restorepoint.runtime import publish as runtime_publish  # noqa: E402
from restorepoint.runtime.identity import RECOVERY_KEYS  # noqa: E402
from restorepoint.torch import ResumableRun, run_id_for  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

# The head's `run` field: what a run id must be to name restore points in a store.
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make(config: dict[str, Any] | None = None, **kwargs: Any) -> ResumableRun:
    kwargs.setdefault("root", "unused-root")
    kwargs.setdefault("operational", tv.OPERATIONAL)
    return ResumableRun(config if config is not None else tv.CONFIG, **kwargs)


# -- run ids -------------------------------------------------------------------------------


def test_run_id_is_deterministic(tmp_path: Path) -> None:
    base = make(root=tmp_path)
    assert RUN_NAME.match(base.run_id)
    assert base.run_dir == tmp_path / base.run_id
    reordered = json.loads(json.dumps(tv.CONFIG, sort_keys=True))
    assert make(reordered, root=tmp_path).run_id == base.run_id
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tv.CONFIG))
    assert make(path).run_id == base.run_id
    # Operational keys are not part of the identity: a resubmitted job with another
    # checkpoint interval finds its own run.
    assert make(tv.config_with(**{"train.snapshot_every": 9})).run_id == base.run_id
    assert make(tv.config_with(epochs=30)).run_id == base.run_id


@pytest.mark.parametrize(
    "change",
    [
        {"config": tv.config_with(**{"optimizer.lr": 0.02})},
        {"config": tv.config_with(**{"model.hidden": 17})},
        {"config": tv.config_with(seed=12)},
        {"seed": 12},
        {"name": "ablation"},
        # Without it declared operational, the interval is part of the identity.
        {"config": tv.config_with(**{"train.snapshot_every": 9}), "operational": ["epochs"]},
    ],
    ids=["lr", "hidden", "config-seed", "seed-argument", "name", "undeclared-operational"],
)
def test_run_id_changes_with_identity_seed_and_name(change: dict[str, Any]) -> None:
    base = make()
    assert make(**change).run_id != base.run_id


def test_the_interval_key_and_the_recovery_knobs_are_operational_by_themselves() -> None:
    """The key snapshot_every names, and every recovery knob, are operational without being
    declared: changing them never moves the run id. recovery_keys=() puts the knobs back into
    the identity."""
    base = make(operational=["epochs"], snapshot_every="train.snapshot_every")
    assert base.operational == sorted({"epochs", "train.snapshot_every", *RECOVERY_KEYS})
    interval = tv.config_with(**{"train.snapshot_every": 9})
    assert (
        make(interval, operational=["epochs"], snapshot_every="train.snapshot_every").run_id
        == base.run_id
    )
    alone = make(operational=["epochs"])
    for key in RECOVERY_KEYS:
        knob = tv.config_with(**{key: 5})
        assert make(knob, operational=["epochs"]).run_id == alone.run_id, key
        assert make(knob, operational=["epochs"], recovery_keys=()).run_id != alone.run_id, key


def test_run_id_names_are_valid_store_names() -> None:
    identity = make().identity
    for name in (None, "my exp/1", "_hidden", "..", "x" * 200, "ünïcode", "a.b-c_d"):
        rid = run_id_for(identity, 7, name)
        assert RUN_NAME.match(rid), rid
        assert rid == run_id_for(identity, 7, name)
    assert run_id_for(identity, 7, "my exp/1").startswith("my-exp-1-")
    assert run_id_for(identity, 7) != run_id_for(identity, 8)


# -- the identity record -------------------------------------------------------------------


def test_run_dir_of_another_config_is_refused_naming_the_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "shared-dir"
    first = tv.train(tmp_path, run_dir=run_dir, stop_at=2)
    assert first.code == 42
    record = json.loads((run_dir / "config_identity.json").read_text())
    assert first.run is not None and record["config_identity"] == first.run.identity
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    other = tv.config_with(**{"optimizer.lr": 0.5, "model.hidden": 8})
    capsys.readouterr()
    refused = tv.train(tmp_path, config=other, run_dir=run_dir)
    # Alone (no supervisor): exit 3 and the refusal on stderr, not a traceback.
    assert refused.code == 3
    err = refused.error
    assert isinstance(err, IncompatibleRestorePoint) and err.exit_code == 3
    assert [m["field"] for m in err.mismatches] == ["config.model.hidden", "config.optimizer.lr"]
    assert len(err.details) == 2
    assert "model.hidden" in err.details[0] and "optimizer.lr" in err.details[1]
    assert "(2 differences)" in str(err)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"restorepoint: error: {run_dir}: {err.message}"
    assert "refusing to attach: this run directory holds a run of another config" in lines[0]
    assert "(2 differences)" in lines[0]
    assert [ln.split(":")[1].strip() for ln in lines[1:]] == ["model.hidden", "optimizer.lr"]
    # Refused before anything was written.
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before

    # An operational change is the same run: it attaches and resumes.
    again = tv.train(
        tmp_path, config=tv.config_with(**{"train.snapshot_every": 3}), run_dir=run_dir
    )
    assert again.code == 0 and again.position == Position(2, 0, 2)


def strip_to_checkpoints(run_dir: Path) -> None:
    """What a run directory written before identity records (or copied by hand) holds."""
    for p in run_dir.iterdir():
        if p.name != "checkpoints":
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_older_run_dir_with_the_same_config_is_adopted(tmp_path: Path) -> None:
    first = tv.train(tmp_path, stop_at=4)
    assert first.run is not None
    run_dir = first.run.run_dir
    strip_to_checkpoints(run_dir)
    assert not (run_dir / "config_identity.json").exists()

    second = tv.train(tmp_path)
    assert second.code == 0 and second.position == Position(4, 0, 4)
    adopted = [e for e in tv.events(run_dir) if e["event"] == "adopted"]
    assert [e["step"] for e in adopted] == [4]
    record = json.loads((run_dir / "config_identity.json").read_text())
    assert second.run is not None
    assert record == {
        "config": tv.CONFIG,
        "config_identity": second.run.identity,
        "operational_keys": sorted({*tv.OPERATIONAL, *RECOVERY_KEYS}),
        "run": second.run.run_id,
        "seed": tv.CONFIG["seed"],
    }
    # Adopted once: the next attach finds the record.
    tv.train(tmp_path)
    assert len([e for e in tv.events(run_dir) if e["event"] == "adopted"]) == 1


def test_older_run_dir_of_another_config_is_refused(tmp_path: Path) -> None:
    other = tv.config_with(**{"optimizer.lr": 0.5})
    planted = tv.train(tmp_path / "elsewhere", config=other, stop_at=3)
    assert planted.run is not None
    target = make(root=tmp_path / "runs").run_dir
    shutil.copytree(planted.run.run_dir / "checkpoints", target / "checkpoints")
    refused = tv.train(tmp_path / "runs")
    assert refused.code == 3 and isinstance(refused.error, IncompatibleRestorePoint)
    assert [m["field"] for m in refused.error.mismatches] == ["config.optimizer.lr"]
    assert not (target / "config_identity.json").exists()


def test_older_checkpoint_without_a_config_is_refused(tmp_path: Path) -> None:
    target = make(root=tmp_path).run_dir
    (target / "checkpoints").mkdir(parents=True)
    torch.save({"model": {"w": torch.zeros(2)}}, target / "checkpoints" / "last.pt")
    refused = tv.train(tmp_path)
    assert refused.code == 3 and "another config" in str(refused.error)
    assert not (target / "config_identity.json").exists()


# -- status and events ---------------------------------------------------------------------


def test_status_and_events_contents(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store'}/"
    config = tv.config_with(**{"train.snapshot_every": 4})
    first = tv.train(tmp_path / "runs", config=config, store=store, stop_at=6)
    assert first.code == 42 and first.run is not None
    run_dir = first.run.run_dir
    status = json.loads((run_dir / "run_status.json").read_text())
    assert set(status) == {
        "last_signal",
        "max_resubmit_attempts",
        "resubmit_count",
        "run",
        "status",
        "step",
        "updated",
    }
    assert status["run"] == first.run.run_id and status["step"] == 6
    assert (status["status"], status["resubmit_count"], status["last_signal"]) == (
        "preempted",
        1,
        None,
    )
    assert ISO_UTC.match(status["updated"])

    events = tv.events(run_dir)
    assert all(ISO_UTC.match(e["time"]) for e in events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_kind.setdefault(e["event"], []).append(e)
    assert set(by_kind) == {"snapshot", "uploaded", "graceful_shutdown"}
    assert [e["step"] for e in by_kind["snapshot"]] == [4, 6]
    assert all(e["pause_s"] >= 0 for e in by_kind["snapshot"])
    # The worker runs at a low priority: on a loaded machine it may not have taken step 4's snapshot
    # before step 6's arrives, which then replaces it (coalesced, as designed). The last one
    # is always published before the exit.
    assert [e["step"] for e in by_kind["uploaded"]] in ([4, 6], [6])
    assert all(e["bytes"] > 0 and e["seconds"] >= 0 for e in by_kind["uploaded"])
    (shutdown,) = by_kind["graceful_shutdown"]
    assert shutdown == {
        "event": "graceful_shutdown",
        "resubmit_count": 1,
        "signal": None,
        "step": 6,
        "time": shutdown["time"],
        "upload_finished": True,
        # No supervisor: the stop's own upload_timeout (tv.train's default, 300 s) bounds it.
        "store_deadline_s": shutdown["store_deadline_s"],
        "deadline_from": "upload_timeout",
    }
    assert 250 < shutdown["store_deadline_s"] <= 300

    second = tv.train(tmp_path / "runs", config=config, store=store)
    assert second.code == 0
    status = json.loads((run_dir / "run_status.json").read_text())
    assert (status["status"], status["step"], status["resubmit_count"]) == (
        "completed",
        tv.total_steps(),
        1,
    )
    (resumed,) = [e for e in tv.events(run_dir) if e["event"] == "resumed"]
    assert resumed["source"] == "run directory" and resumed["step"] == 6


def test_failure_in_the_loop_is_recorded(tmp_path: Path) -> None:
    def boom(run: ResumableRun, step: int) -> None:
        if step == 3:
            raise ValueError("loss is nan")

    with pytest.raises(ValueError, match="nan"):
        tv.train(tmp_path, before_commit=boom)
    (run_dir,) = tmp_path.iterdir()
    status = json.loads((run_dir / "run_status.json").read_text())
    assert (status["status"], status["step"]) == ("failed", 2)
    assert status["error"] == "ValueError: loss is nan"


def test_status_and_events_are_whole_after_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[str] = []
    real_write = run_contract.atomic_write

    def checked_write(path: Path, data: bytes) -> None:
        real_write(path, data)
        writes.append(Path(path).name)
        if Path(path).suffix == ".json":
            json.loads(Path(path).read_text())

    # The run directory's files (contract) and the position sidecar (the run's save).
    monkeypatch.setattr(run_contract, "atomic_write", checked_write)
    monkeypatch.setattr(runtime_publish, "atomic_write", checked_write)
    run_dir = make(root=tmp_path).run_dir
    stop = threading.Event()
    seen = {"status": 0, "events": 0}
    problems: list[str] = []

    def reader() -> None:
        # A reader running beside the writer (a dashboard, `cat`): the status file is always
        # one whole JSON document, never missing once written; every event line that has its
        # newline is whole.
        while not stop.is_set():
            try:
                text = (run_dir / "run_status.json").read_text()
            except FileNotFoundError:
                if seen["status"]:
                    problems.append("run_status.json went missing")
            else:
                try:
                    json.loads(text)
                    seen["status"] += 1
                except ValueError as exc:
                    problems.append(f"run_status.json: {exc}")
            try:
                data = (run_dir / "events.jsonl").read_bytes()
            except FileNotFoundError:
                continue
            *whole, _rest = data.split(b"\n")
            for line in whole:
                try:
                    json.loads(line)
                except ValueError as exc:
                    problems.append(f"events.jsonl: {exc}: {line!r}")
            seen["events"] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        out = tv.train(tmp_path, config=tv.config_with(**{"train.snapshot_every": 1}))
    finally:
        stop.set()
        thread.join()
    assert out.code == 0
    assert problems == []
    assert seen["status"] > 0 and seen["events"] > 0
    # Snapshots still waiting when a newer one comes are replaced by it; the last is saved.
    assert 1 <= writes.count("position.json") <= tv.total_steps()
    position = json.loads((run_dir / "checkpoints" / "position.json").read_text())
    assert position["step"] == tv.total_steps()
    assert {"config_identity.json", "run_status.json", "position.json"} <= set(writes)
    data = (run_dir / "events.jsonl").read_bytes()
    assert data.endswith(b"\n")
    assert len([json.loads(line) for line in data.splitlines()]) == tv.total_steps()
    # Every temporary file was renamed into place.
    assert [p.name for p in run_dir.rglob(".*")] == []


def test_events_from_the_worker_and_the_main_thread_stay_in_time_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot worker (uploaded) and the training thread (snapshot) append events at the
    same moments; a line stamped first is written first. Stamping gives the other thread a
    chance to run, so an unlocked writer interleaves here nearly every time."""
    real_now = run_contract.now

    def yielding_now() -> str:
        stamp = real_now()
        time.sleep(0.0005)
        return stamp

    monkeypatch.setattr(run_contract, "now", yielding_now)
    run = make(root=tmp_path)
    run.run_dir.mkdir(parents=True)

    def append(kind: str) -> None:
        for i in range(100):
            run._event(kind, step=i)

    threads = [threading.Thread(target=append, args=(k,)) for k in ("snapshot", "uploaded")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = tv.events(run.run_dir)
    assert len(events) == 200
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    for kind in ("snapshot", "uploaded"):
        assert [e["step"] for e in events if e["event"] == kind] == list(range(100))


# -- tracker run id ------------------------------------------------------------------------


def test_tracker_run_id_round_trips_and_survives_a_resubmit(tmp_path: Path) -> None:
    run = make(root=tmp_path)
    with run:
        assert run.tracker_run_id is None
        run.tracker_run_id = "wandb-3f9a1c"
        assert run.tracker_run_id == "wandb-3f9a1c"
    assert make(root=tmp_path).tracker_run_id == "wandb-3f9a1c"


def test_tracker_run_id_is_best_effort(tmp_path: Path) -> None:
    run = make(root=tmp_path)
    assert run.tracker_run_id is None  # no run directory at all
    run.tracker_run_id = "no-dir-yet"  # nowhere to write: no exception
    with run:
        (run.run_dir / "tracker_run_id").mkdir()  # cannot be replaced by a file
        run.tracker_run_id = "abc"
        assert run.tracker_run_id is None
    assert sorted(p.name for p in run.run_dir.iterdir() if p.name.startswith(".")) == []


# -- a fresh start -------------------------------------------------------------------------


@pytest.mark.parametrize("with_store", [False, True], ids=["no-store", "empty-store"])
def test_nothing_there_starts_fresh(tmp_path: Path, with_store: bool) -> None:
    store = f"{tmp_path / 'store'}/" if with_store else None
    with make(root=tmp_path / "runs", store=store) as run:
        assert run.resume() == Position(0, 0, 0)
        assert run.resumed_from is None
        assert run.position == Position(0, 0, 0)
    assert [e["event"] for e in tv.events(run.run_dir)] == []
    assert json.loads((run.run_dir / "run_status.json").read_text())["status"] == "completed"
