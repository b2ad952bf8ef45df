"""ResumableRun publishes a snapshot straight from its copy in memory (no snapshot file written
and read back before the pack): the restore point's payload is the one a pack of the run
directory gives, file for file and digest for digest (spec section 26); the snapshot file the
publish writes to the run directory from the same memory is that payload's ``last.pt``,
and a publish that fails still leaves it whole; a SIGKILL in the middle of the in-memory
publish leaves the store's previous restore point the newest, verifying, and the run
directory's previous snapshot whole; each snapshot is copied into the last one's memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.runtime.capture import Buffers, Copies  # noqa: E402
from restorepoint.runtime.contract import POSITION_FILE  # noqa: E402
from restorepoint.runtime.snapshot_file import SnapshotImage  # noqa: E402
from restorepoint.runtime.state import load_state, to_cpu  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

CONFIG = {"lr": 0.01, "seed": 3}


def _trained() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7)
    ).to(torch.float64)
    model[2].to(torch.bfloat16)  # dtypes of three widths: the layout sorts them
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        x = torch.randn(5, 64, dtype=torch.float64)
        model[2](model[1](model[0](x)).to(torch.bfloat16)).float().sum().backward()
        optimizer.step()
    return model, optimizer


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entries(url: str) -> dict[str, tuple[int, str]]:
    report = restorepoint.verify(url)
    return {e.path: (e.size, e.sha256) for e in report.manifest.payload or ()}


def test_the_in_memory_publish_packs_what_the_snapshot_file_holds(tmp_path: Path) -> None:
    model, optimizer = _trained()
    store = f"{tmp_path / 'store'}/"
    run_dir = tmp_path / "run"
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, final_snapshot=False) as run:
        run.track(model=model, optimizer=optimizer)
        for _ in range(2):  # the second replaces the directory's last.pt in the payload
            run.commit()
            run.snapshot(wait=True)
        assert [u["ok"] for u in run.uploads] == [True, True]
        url = run.uploads[-1]["url"]
    checkpoints = run_dir / "checkpoints"
    published = _entries(url)
    # The snapshot file written from the same memory is the payload's last.pt, byte for byte.
    assert sorted(published) == ["last.pt", POSITION_FILE]
    for name, (size, sha256) in published.items():
        assert (checkpoints / name).stat().st_size == size
        assert _sha256(checkpoints / name) == sha256, name
    assert load_state(checkpoints / "last.pt")["position"]["step"] == 2
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]
    # The pack of the run directory (the way every restore point was made before) gives the
    # same payload: the same files, sizes and digests.
    packed = restorepoint.pack(checkpoints, tmp_path / "from-files.rp", position=2)
    assert _entries(packed.url) == published

    # The image read in pieces of any size is the file write() makes.
    state = {"objects": {"model": to_cpu(model.state_dict())}, "n": 1}
    image = SnapshotImage(state)
    whole = io.BytesIO()
    image.write(whole)
    assert len(whole.getvalue()) == image.size
    stream = image.open()
    pieces = []
    for n in (1, 7, 8, 4093, 1 << 20, 3, 1 << 30):
        pieces.append(bytes(stream.read(n)))
    assert stream.read(1) == b""
    assert b"".join(pieces) == whole.getvalue()


def test_a_failed_publish_still_saves_the_snapshot(tmp_path: Path) -> None:
    model, optimizer = _trained()
    blocked = tmp_path / "not-a-directory"
    blocked.write_bytes(b"")
    run_dir = tmp_path / "run"
    with ResumableRun(
        CONFIG, run_dir=run_dir, store=f"{blocked}/store/", final_snapshot=False
    ) as run:
        run.track(model=model, optimizer=optimizer)
        run.commit()
        run.snapshot(wait=True)
        assert [u["ok"] for u in run.uploads] == [False]
    state = load_state(run_dir / "checkpoints" / "last.pt")
    assert state["position"]["step"] == 1
    torch.testing.assert_close(state["objects"]["model"], model.state_dict(), rtol=0, atol=0)
    assert json.loads((run_dir / "checkpoints" / POSITION_FILE).read_text())["step"] == 1
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]


TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from restorepoint.runtime import snapshot_file
    from restorepoint.torch import ResumableRun

    run_dir, store = sys.argv[1], sys.argv[2]
    real_read = snapshot_file.ImageReader.read
    seen = [0]

    def read(self, n=-1):
        data = real_read(self, n)
        seen[0] += len(data)
        # The second snapshot's publish, half way through the snapshot read from memory:
        # the head and some chunks are out, the restore point is not.
        if armed and seen[0] > (1 << 21):
            os.kill(os.getpid(), signal.SIGKILL)
        return data

    snapshot_file.ImageReader.read = read
    armed = False
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    with ResumableRun({"lr": 0.01}, run_dir=run_dir, store=store, final_snapshot=False,
                      background_nice=None, background="thread") as run:
        # (The thread's publish, read in this process; the publish process's twin is in
        # test_publish_process.py.)
        run.track(model=model)
        run.commit()
        run.snapshot(wait=True)
        assert run.uploads[-1]["ok"], run.uploads
        print("published", run.uploads[-1]["url"], flush=True)
        with torch.no_grad():
            model.weight.add_(1.0)
        run.commit()
        seen[0] = 0
        armed = True
        run.snapshot(wait=True)
    print("not killed", flush=True)
    """
)


def test_a_kill_during_the_in_memory_publish_keeps_the_previous_restore_point(
    tmp_path: Path,
) -> None:
    store = f"{tmp_path / 'store'}/"
    run_dir = tmp_path / "run"
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.run(
        [sys.executable, str(script), str(run_dir), store],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "not killed" not in proc.stdout
    (first,) = [
        line.split()[1] for line in proc.stdout.splitlines() if line.startswith("published")
    ]
    # The store's newest (and only) restore point is the first, whole and verifying.
    entries = restorepoint.list_store(store)
    assert [e.url for e in entries] == [first]
    report = restorepoint.verify(first)
    assert report.manifest.position.step == 1
    # The run directory's snapshot is whole: the first one, or the second when its own
    # write (on a thread beside the publish) landed before the kill; the kill left at most the
    # temporary file of the second (as a kill during any save does), never a torn last.pt.
    checkpoints = run_dir / "checkpoints"
    step = load_state(checkpoints / "last.pt")["position"]["step"]
    assert step in (1, 2)
    if step == 1:
        assert (
            _sha256(checkpoints / "last.pt")
            == dict((e.path, e.sha256) for e in report.manifest.payload or ())["last.pt"]
        )
    # A fresh run resumes from it.
    model = torch.nn.Linear(1024, 1024)
    with ResumableRun(
        {"lr": 0.01}, run_dir=tmp_path / "fresh", store=store, final_snapshot=False
    ) as run:
        run.track(model=model)
        assert run.resume().step == 1


def test_each_snapshot_is_copied_into_the_memory_of_the_last_one_done(tmp_path: Path) -> None:
    # A buffer given back is what the next copy of its dtype and shape goes into; one taken
    # is not handed out twice.
    buffers = Buffers()

    def take(like: Any) -> Any:
        copies = Copies(1)
        out = buffers.take(like, copies)
        copies.run()
        return out

    first = take(torch.arange(10.0))
    buffers.give({"w": [first], "n": 1})
    again = take(torch.arange(10.0) * 2)
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, torch.arange(10.0) * 2)
    other = take(torch.arange(10.0) * 3)
    assert other.data_ptr() != again.data_ptr()
    assert take(torch.ones(3, dtype=torch.int64)).dtype == torch.int64
    buffers.close()
    buffers.give({"w": other})
    assert take(torch.arange(10.0)).data_ptr() != other.data_ptr()

    # In a run: snapshots taken while the one before is still being published, the weights
    # changed between them; each restore point holds the weights of its own snapshot.
    model = torch.nn.Linear(256, 256)
    store = f"{tmp_path / 'store'}/"
    expected: dict[int, torch.Tensor] = {}
    with ResumableRun(CONFIG, run_dir=tmp_path / "run", store=store, final_snapshot=False) as run:
        run.track(model=model)
        for step in range(1, 5):
            run.commit()
            with torch.no_grad():
                model.weight.add_(1.0)
            expected[step] = model.weight.detach().clone()
            run.snapshot(wait=step % 2 == 0)
        run.wait()
        urls = {u["step"]: u["url"] for u in run.uploads if u["ok"]}
    assert 2 in urls and 4 in urls  # a snapshot taken while one was in hand may be coalesced
    for step, url in urls.items():
        dest = tmp_path / f"import-{step}"
        restorepoint.import_restore_point(url, dest)
        state = load_state(dest / "last.pt")
        assert state["position"]["step"] == step
        assert torch.equal(state["objects"]["model"]["weight"], expected[step]), step
