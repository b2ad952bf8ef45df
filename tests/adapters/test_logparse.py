"""The LichtFeld profile's log parser on logs shaped like the real trainer's (tests/adapters/logs):
colour escapes, progress bars redrawn with carriage returns, evaluation blocks interleaved,
failed saves, an older build's wording, CRLF line ends, one checkpoint file overwritten, and a
line cut off at the end. Each log's snapshots are found at their real steps, read whole (as
newest_snapshot reads a log) and streamed in small chunks (as `run` reads a trainer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from restorepoint.adapters.external import LichtFeldAdapter, Profile, load_profile, parse_log

LOGS = Path(__file__).parent / "logs"

#: For each sample log: every announcement, in order, as (step, checkpoint file name).
EXPECTED = {
    "console_garden_30k.log": [
        (7000, "checkpoint_7000.resume"),
        (9876, "checkpoint_9876.resume"),
        (14000, "checkpoint_14000.resume"),
        (21000, "checkpoint_21000.resume"),
    ],
    "logfile_bicycle_bilateral.log": [
        (5000, "checkpoint_5000.resume"),
        (10000, "checkpoint_10000.resume"),
        (15000, "checkpoint_15000.resume"),
    ],
    "legacy_saved_to.log": [
        (3000, "checkpoint_3000.resume"),
        (6000, "checkpoint_6000.resume"),
    ],
    "single_file_windows.log": [
        (7000, "checkpoint.resume"),
        (14000, "checkpoint.resume"),
        (21000, "checkpoint.resume"),
    ],
}

# Writes a log to stdout in chunks of a given size, as a trainer's output arrives: lines and
# colour escapes are split across reads.
REPLAY = (
    "import sys, time\n"
    "data = open(sys.argv[1], 'rb').read(); n = int(sys.argv[2])\n"
    "for i in range(0, len(data), n):\n"
    "    sys.stdout.buffer.write(data[i:i + n]); sys.stdout.buffer.flush()\n"
)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("lichtfeld")


def test_every_sample_log_is_covered() -> None:
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_finds_every_snapshot_at_its_real_step(name: str, profile: Profile) -> None:
    text = (LOGS / name).read_text(encoding="utf-8")
    found = [(e.step, e.name) for e in parse_log(text, profile)]
    assert found == EXPECTED[name]


def test_a_line_still_being_written_is_not_an_announcement(profile: Profile) -> None:
    text = (LOGS / "console_garden_30k.log").read_text(encoding="utf-8")
    assert "checkpoint_28000.resu" in text.rsplit("\n", 1)[-1]
    assert all(e.step != 28000 for e in parse_log(text, profile))
    # Once the trainer finishes the line, it counts.
    completed = text + "me (902315 Gaussians, iter 28000)\n"
    assert parse_log(completed, profile)[-1].step == 28000


def test_paths_with_spaces_and_extras_after_the_iteration(profile: Profile) -> None:
    text = (LOGS / "logfile_bicycle_bilateral.log").read_text(encoding="utf-8")
    entries = parse_log(text, profile)
    assert entries[1].path == "/data/my scenes/bicycle/out/checkpoints/checkpoint_10000.resume"


def _project(tmp_path: Path, name: str, missing: tuple[str, ...] = ()) -> Path:
    project = tmp_path / "project"
    (project / "checkpoints").mkdir(parents=True)
    (project / "trainer.log").write_bytes((LOGS / name).read_bytes())
    for _, file in EXPECTED[name]:
        if file not in missing:
            (project / "checkpoints" / file).write_bytes(b"checkpoint bytes")
    return project


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_snapshots_from_a_project_log(name: str, tmp_path: Path) -> None:
    project = _project(tmp_path, name)
    adapter = LichtFeldAdapter(log="trainer.log")
    snaps = adapter.committed_snapshots(project)
    # One snapshot per file: a file announced again holds its latest announcement's step.
    last: dict[str, int] = {}
    for step, file in EXPECTED[name]:
        last.pop(file, None)
        last[file] = step
    assert [(s.step, s.files) for s in snaps] == [(step, (f,)) for f, step in last.items()]
    newest = adapter.newest_snapshot(project)
    assert newest is not None and newest.step == EXPECTED[name][-1][0]
    assert newest.root == project / "checkpoints"


def test_an_announced_file_that_is_gone_or_empty_is_not_a_snapshot(tmp_path: Path) -> None:
    name = "console_garden_30k.log"
    project = _project(tmp_path, name, missing=("checkpoint_21000.resume",))
    (project / "checkpoints" / "checkpoint_14000.resume").write_bytes(b"")
    adapter = LichtFeldAdapter(log="trainer.log")
    assert [s.step for s in adapter.committed_snapshots(project)] == [7000, 9876]


def test_an_unannounced_file_is_not_a_snapshot_while_a_log_exists(tmp_path: Path) -> None:
    project = _project(tmp_path, "legacy_saved_to.log")
    (project / "checkpoints" / "checkpoint_6500.resume").write_bytes(b"being written")
    newest = LichtFeldAdapter(log="trainer.log").newest_snapshot(project)
    assert newest is not None and newest.step == 6000


@pytest.mark.parametrize("chunk", [1, 7, 4096])
@pytest.mark.parametrize("name", ["console_garden_30k.log", "legacy_saved_to.log"])
def test_streamed_output_gives_the_same_snapshots(name: str, chunk: int, tmp_path: Path) -> None:
    project = _project(tmp_path, name)
    (project / "trainer.log").unlink()
    adapter = LichtFeldAdapter()
    command = [sys.executable, "-c", REPLAY, str(LOGS / name), str(chunk)]
    with adapter.run(command, project) as trainer:
        events = [(s.step, s.files[0]) for s in trainer]
    assert trainer.returncode == 0
    assert trainer.ready.is_set()
    assert events == EXPECTED[name]
    # What `run` wrote is the trainer's output byte for byte, and reads back the same way.
    assert (project / "restorepoint-trainer.log").read_bytes() == (LOGS / name).read_bytes()
    newest = adapter.newest_snapshot(project)
    assert newest is not None and newest.step == EXPECTED[name][-1][0]
