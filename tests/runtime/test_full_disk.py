"""A ResumableRun whose run directory is on a small tmpfs the test mounts (docs/reliability.md,
"Full disks"): the low-space warning comes once, before the snapshot that does not fit; that
snapshot fails naming its file, leaves the previous one whole and readable and no temporary
file, training goes on, a stop still exits 42, and the run resumes from the previous snapshot
once there is room again."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from fulldisk import fill, small_disk  # noqa: E402

from restorepoint._posix import atomic_write  # noqa: E402
from restorepoint.errors import StorageError  # noqa: E402
from restorepoint.runtime.contract import POSITION_FILE  # noqa: E402
from restorepoint.runtime.state import load_state, save_state  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

MiB = 1 << 20
#: What the ballast adds to every snapshot: the snapshots are about this size.
BALLAST = 512 << 10


class Ballast:
    """A tracked object whose state is BALLAST bytes of tensor."""

    def __init__(self, size: int = BALLAST) -> None:
        self.w = torch.zeros(size // 4)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w = state["w"]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", 4 * MiB) as mounted:
        yield mounted


def hidden(run_dir: Path) -> list[str]:
    """Temporary files (a save's, an atomic write's) anywhere in the run directory."""
    return [str(p) for p in run_dir.rglob(".*")]


def test_save_state_on_a_full_disk_keeps_the_previous_file(disk: Path) -> None:
    target = disk / "last.pt"
    save_state({"step": 1, "w": torch.ones(1000)}, target, disk)
    before = target.read_bytes()
    with pytest.raises(StorageError) as info:
        save_state({"step": 2, "w": torch.ones(2 * MiB)}, target, disk)
    assert str(info.value) == f"{target}: no space left on the device"
    assert info.value.exit_code == 4
    assert target.read_bytes() == before
    assert sorted(p.name for p in disk.iterdir()) == ["last.pt"]

    # The position sidecar and the run's status files: the same, through atomic_write.
    sidecar = disk / "position.json"
    atomic_write(sidecar, b"{}")
    fill(disk)
    with pytest.raises(OSError, match="No space left") as failed:
        atomic_write(sidecar, b"x" * (64 << 10))
    assert failed.value.errno == errno.ENOSPC
    assert failed.value.filename == str(sidecar)
    assert sidecar.read_bytes() == b"{}"
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "last.pt", "position.json"]


def test_a_run_on_a_disk_that_fills_warns_then_keeps_its_last_snapshot(
    disk: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tv.config_with(**{"train.snapshot_every": 1})

    def squeeze(run: ResumableRun, step: int) -> None:
        # Each snapshot handled before the next is taken (none coalesced away). Another
        # writer takes the disk: before step 2, room for one more snapshot beside the last (so
        # the warning, and a snapshot that still fits); before step 4, for none.
        run.wait()
        if step in (2, 4):
            fill(disk, leave=(3 * BALLAST) // 2 if step == 2 else BALLAST // 2)

    caplog.set_level(logging.WARNING, logger="restorepoint.torch")
    out = tv.train(
        disk,
        config=config,
        before_commit=squeeze,
        stop_at=5,
        extra_objects={"ballast": Ballast()},
        background_nice=0,
    )
    assert out.code == 42
    run = out.run
    assert run is not None
    run_dir = run.run_dir
    checkpoints = run_dir / "checkpoints"

    # One warning, before the first snapshot that failed; then each failure names the file.
    messages = [r.getMessage() for r in caplog.records]
    warnings = [i for i, m in enumerate(messages) if "low disk space for snapshots" in m]
    failures = [i for i, m in enumerate(messages) if m.startswith("snapshot at step")]
    assert len(warnings) == 1, messages
    assert failures and warnings[0] < failures[0], messages
    assert messages[failures[0]] == (
        f"snapshot at step 4 failed: {checkpoints}/last.pt: no space left on the device"
    )
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (low,) = [e for e in events if e["event"] == "disk_space_low"]
    assert low["step"] == 2
    assert low["need"] >= BALLAST
    failed = [e["step"] for e in events if e["event"] == "snapshot_failed"]
    assert failed == [4, 5]

    # The stop says that its snapshot was not saved, and exits 42 all the same.
    stop_line = capsys.readouterr().err.splitlines()[-1]
    assert stop_line == (
        f"restorepoint: stop (requested) at step 5: the snapshot was not saved "
        f"({checkpoints}/last.pt: no space left on the device): the previous snapshot in "
        f"{checkpoints} stays the newest; exiting 42 (resumable)"
    )

    # The previous last snapshot: whole, readable, and what the sidecar names; no litter.
    state = load_state(checkpoints / "last.pt")
    assert state["position"]["step"] == 3
    assert json.loads((checkpoints / POSITION_FILE).read_text())["step"] == 3
    assert hidden(run_dir) == []

    # With room again, the run resumes from it and trains to the end.
    (disk / "filler").unlink()
    resumed = tv.train(disk, config=config, extra_objects={"ballast": Ballast()}, background_nice=0)
    assert resumed.code == 0
    assert resumed.position is not None and resumed.position.step == 3
    assert load_state(checkpoints / "last.pt")["position"]["step"] == tv.total_steps(config)


def test_the_first_snapshot_is_checked_against_the_state_size(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the first snapshot there is no last one to measure: the tracked state's bytes
    stand for it, so a disk too small for any snapshot is said before the first one fails."""
    config = tv.config_with(**{"train.snapshot_every": 2, "epochs": 1})
    caplog.set_level(logging.WARNING, logger="restorepoint.torch")
    out = tv.train(
        disk, config=config, extra_objects={"ballast": Ballast(6 * MiB)}, background_nice=0
    )
    assert out.code == 0  # a snapshot that cannot be written never stops training
    messages = [r.getMessage() for r in caplog.records]
    warning = next(i for i, m in enumerate(messages) if "low disk space for snapshots" in m)
    assert "step 2 failed" in messages[warning + 1], messages
    assert out.run is not None
    assert not (out.run.run_dir / "checkpoints" / "last.pt").exists()
    assert hidden(out.run.run_dir) == []


def test_with_a_store_a_full_run_directory_does_not_keep_the_snapshot_from_the_store(
    disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore point is packed from memory: the snapshot file written beside the publish
    meets the full disk, the publish does not; the save fails as before (named, no litter).
    The publish process writes the file and answers the failure: the training process does
    not write it again."""
    here = tv.saves_here(monkeypatch)
    store = f"{tmp_path / 'store'}/"
    run_dir = disk / "run"
    ballast = Ballast(6 * MiB)
    with ResumableRun({"lr": 0.1}, run_dir=run_dir, store=store, final_snapshot=False) as run:
        run.track(ballast=ballast)
        run.commit()
        run.snapshot(wait=True)
        assert [u["ok"] for u in run.uploads] == [True]
        checkpoints = run_dir / "checkpoints"
        assert run.publisher.save_errors == {
            1: f"{checkpoints}/last.pt: no space left on the device"
        }
    assert not (checkpoints / "last.pt").exists()
    assert hidden(run_dir) == []
    assert here == []
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] in ("uploaded", "snapshot_failed")] == [
        "uploaded",
        "snapshot_failed",
    ]
    fresh = Ballast(6 * MiB)
    with ResumableRun(
        {"lr": 0.1}, run_dir=tmp_path / "fresh", store=store, final_snapshot=False
    ) as run:
        run.track(ballast=fresh)
        assert run.resume().step == 1
    assert torch.equal(fresh.w, ballast.w)
