"""ResumableRun's publish chooses codec modes per chunk only while a store deadline is set (a
stop, a reclaim notice; every chunk is probed otherwise), and records what it chose in its
uploads and its ``uploaded`` event; the restore point it wrote resumes bit for bit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from restorepoint.storage import deadline_left, store_deadline  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402


def test_the_choice_is_made_under_a_deadline_and_recorded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    store = f"{tmp_path / 'store'}/"
    config = {"lr": 0.1}
    with ResumableRun(config, run_dir=tmp_path / "run", store=store, final_snapshot=False) as run:
        run.track(model=model)
        run.snapshot(wait=True)  # no deadline: every chunk probed
        before = run.uploads[-1]["codec_choices"]
        assert before["chunks"]["raw"] == 0
        assert before["chunks"]["probe"] > 0
        assert before["deadline_left_s"] is None
        run.commit()
        with store_deadline(time.monotonic() + 300):
            run.snapshot(wait=True)
        choices = run.uploads[-1]["codec_choices"]
        assert set(choices["chunks"]) == {"probe", "raw"}
        assert choices["deadline_left_s"] is not None
    assert deadline_left() is None
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    uploaded = [e for e in events if e["event"] == "uploaded"]
    assert uploaded[0]["codec_choices"] == before
    assert uploaded[-1]["codec_choices"] == choices
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    fresh = torch.nn.Linear(256, 256)
    with ResumableRun(config, run_dir=tmp_path / "fresh", store=store, final_snapshot=False) as run:
        run.track(model=fresh)
        run.resume()
        assert run.step == 1
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, saved[name])
