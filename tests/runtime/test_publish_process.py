"""ResumableRun(background="process"): each snapshot is published by a process of its own,
which reads the snapshot's copy out of the training process's memory
(restorepoint/ops/publish_process.py). The restore point is the one the thread publishes
(it verifies, is signed when the run signs, and resumes bit for bit, from a local store and
from S3); the child runs at the worker's priority, follows the store deadline, and dies with
the training process; a child killed mid-publish is one failed upload and the next snapshot
starts a new one; a SIGKILL of the training process at any moment of a publish leaves the
store's previous restore point the newest and whole; where the child cannot start, the run
says so once and publishes on its thread."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.errors import UsageError  # noqa: E402
from restorepoint.ops import _publish_child, _publish_wire, publish_process  # noqa: E402
from restorepoint.storage import set_store_deadline  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

pytestmark = pytest.mark.skipif(
    not publish_process.available(), reason="the publish process needs Linux"
)

CONFIG = {"lr": 0.01, "seed": 3}


def _trained(seed: int = 0) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(8, 256)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def _events(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped by its parent counts as gone.
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.contextmanager
def _published_once(
    run_dir: Path, store: str, model: Any, optimizer: Any, **options: Any
) -> Iterator[ResumableRun]:
    """A run that publishes through its process, its first snapshot published."""
    with ResumableRun(
        CONFIG, run_dir=run_dir, store=store, final_snapshot=False, background="process",
        **options,
    ) as run:  # fmt: skip
        run.track(model=model, optimizer=optimizer)
        run.commit()
        run.snapshot(wait=True)
        yield run


def _resumed_equal(store: str, model: Any, optimizer: Any, where: Path, **options: Any) -> None:
    again, opt = _trained(seed=1)
    with ResumableRun(CONFIG, run_dir=where, store=store, final_snapshot=False, **options) as run:
        run.track(model=again, optimizer=opt)
        assert run.resume() is not None
    torch.testing.assert_close(again.state_dict(), model.state_dict(), rtol=0, atol=0)
    torch.testing.assert_close(opt.state_dict(), optimizer.state_dict(), rtol=0, atol=0)


def test_a_process_publish_verifies_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with ResumableRun(
        CONFIG, run_dir=run_dir, store=store, final_snapshot=False, background="process"
    ) as run:
        run.track(model=model, optimizer=optimizer)
        for _ in range(2):
            run.commit()
            run.snapshot(wait=True)
        process = run.publisher.process
        assert process is not None
        assert process.pid is not None
        child = process.pid
        # One child for the run, at the snapshot worker's priority (nice +10 by default).
        assert _nice(child) == min(19, _nice(0) + 10)
        assert run.worker.native_id is not None
        assert _nice(child) == _nice(run.worker.native_id)
        assert [u["ok"] for u in run.uploads] == [True, True]
        uploaded = [e for e in _events(run_dir) if e["event"] == "uploaded"]
        assert [e["step"] for e in uploaded] == [1, 2]
        assert all(e["bytes"] > 0 for e in uploaded)
    assert not _alive(child)
    entries = restorepoint.list_store(store)
    assert sorted(e.step for e in entries) == [1, 2]
    for entry in entries:
        assert restorepoint.verify(entry.url).manifest.run == run.run_id
    # The payload is what the run directory holds: last.pt and its position, digest for digest.
    report = restorepoint.verify(max(entries, key=lambda e: e.step).url)
    on_disk = hashlib.sha256((run_dir / "checkpoints" / "last.pt").read_bytes()).hexdigest()
    assert {e.path: e.sha256 for e in report.manifest.payload or ()}["last.pt"] == on_disk
    _resumed_equal(store, model, optimizer, tmp_path / "again")


def test_the_process_publish_signs_with_the_runs_key(tmp_path: Path) -> None:
    key, public = restorepoint.trust.generate(tmp_path / "signer")
    model, optimizer = _trained()
    store = f"{tmp_path / 'store'}/"
    with _published_once(tmp_path / "run", store, model, optimizer, sign=key) as run:
        assert run.publisher.process is not None
        assert run.uploads[-1]["ok"], run.uploads
    (entry,) = restorepoint.list_store(store)
    raw = restorepoint.trust.raw_public(restorepoint.trust.load_signing_key(key))
    assert restorepoint.verify(entry.url).signed_by == (restorepoint.trust.key_id(raw),)
    assert public.exists()


def test_the_store_deadline_reaches_the_publish_process(tmp_path: Path) -> None:
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with _published_once(run_dir, store, model, optimizer) as run:
        process = run.publisher.process
        assert process is not None
        assert process.ping()["deadline_left"] is None
        try:
            set_store_deadline(time.monotonic() + 300)
            left = process.ping()["deadline_left"]
            assert 250 < left <= 300
            # Under a deadline the adaptive codec choice is on (spec 13, W4b): the publish
            # in the child records what it chose against the deadline.
            run.commit()
            run.snapshot(wait=True)
            choices = run.uploads[-1]["codec_choices"]
            assert choices["deadline_left_s"] is not None
            assert 0 < choices["deadline_left_s"] <= 300
        finally:
            set_store_deadline(None)
        assert process.ping()["deadline_left"] is None


def test_a_child_killed_mid_publish_is_one_failed_upload(tmp_path: Path) -> None:
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with _published_once(run_dir, store, model, optimizer) as run:
        process = run.publisher.process
        assert process is not None
        first = process.pid
        assert first is not None
        # Stopped, the child takes the job and cannot answer; killed, the job fails.
        os.kill(first, signal.SIGSTOP)
        run.commit()
        run.snapshot()
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        run.wait()
        assert [u["ok"] for u in run.uploads] == [True, False]
        assert "killed by signal 9" in run.uploads[-1]["error"]
        # The child did not write the snapshot file: the training process did, after it.
        from restorepoint.runtime.state import load_state

        assert load_state(run_dir / "checkpoints" / "last.pt")["position"]["step"] == 2
        # The next snapshot starts a new child, and publishes.
        run.commit()
        run.snapshot(wait=True)
        assert run.uploads[-1]["ok"], run.uploads
        assert process.pid not in (None, first)
    failed = [e for e in _events(run_dir) if e["event"] == "upload_failed"]
    assert [e["step"] for e in failed] == [2]
    assert sorted(e.step for e in restorepoint.list_store(store)) == [1, 3]


def test_a_stop_whose_child_cannot_answer_in_time_keeps_the_previous_restore_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop waits for the child's publish once, within ``upload_timeout``; the store's
    previous restore point stays the newest. Leaving the run gives the child's publish up
    (the stop's snapshot is the tracked state's own memory) and waits ``RELEASE_S`` for it:
    the child, stopped, cannot answer, and once it runs again the publish ends at its next
    chunk, with nothing of it in the store (test_signals.py and test_stop_contract.py hold
    the thread's publish the same way)."""
    from restorepoint.runtime import stop as runtime_stop

    monkeypatch.setattr(runtime_stop, "RELEASE_S", 0.5)
    store = f"{tmp_path / 'store'}/"
    stopped: list[int] = []

    def hold_the_child(run: ResumableRun, step: int) -> None:
        if step == 3:  # step 2's publish done, then the child can answer nothing more
            run.wait()
            process = run.publisher.process
            assert process is not None and process.pid is not None
            os.kill(process.pid, signal.SIGSTOP)
            stopped.append(process.pid)

    try:
        out = tv.train(
            tmp_path / "runs", config=tv.config_with(**{"train.snapshot_every": 2}),
            store=store, stop_at=3, upload_timeout=0.5, before_commit=hold_the_child,
        )  # fmt: skip
        assert out.code == 42 and out.run is not None
        (line,) = [
            line
            for line in capsys.readouterr().err.splitlines()
            if line.startswith("restorepoint: stop (")
        ]
        assert "did not land within upload_timeout (0.5 s)" in line
        assert [e.step for e in restorepoint.list_store(store)] == [2]
        run_dir = out.run.run_dir
        (shutdown,) = [e for e in _events(run_dir) if e["event"] == "graceful_shutdown"]
        assert shutdown["upload_finished"] is False
        assert [e["step"] for e in _events(run_dir) if e["event"] == "upload_abandoned"] == [3]
        assert (run_dir / "checkpoints" / "last.pt").exists()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    # Given up, not killed: the child hears it once it runs again, ends the publish at its
    # next chunk, and ends; the store keeps step 2.
    assert out.run.wait(60)
    assert sorted(e.step for e in restorepoint.list_store(store)) == [2]
    (child,) = stopped
    for _ in range(500):
        if not _alive(child):
            break
        time.sleep(0.02)
    assert not _alive(child)


def test_a_stop_gives_the_child_the_training_priority_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("raising a process's priority back needs root (or RLIMIT_NICE)")
    base = _nice(0)
    seen: list[tuple[str, set[int]]] = []

    def threads(pid: int) -> set[int]:
        return {_nice(int(task)) for task in os.listdir(f"/proc/{pid}/task")}

    def low_until_the_stop(run: ResumableRun, step: int) -> None:
        process = run.publisher.process
        if step in (3, 5):
            run.wait()  # the child idle: the ping below is the one question it answers
        if step == 3 and process is not None and process.pid is not None:
            seen.append(("periodic", threads(process.pid)))

    real = publish_process.PublishProcess.unthrottle

    def unthrottle(self: publish_process.PublishProcess) -> None:
        real(self)
        self.ping()  # answered after the priority message: every thread has it now
        assert self.pid is not None
        seen.append(("stop", threads(self.pid)))

    monkeypatch.setattr(publish_process.PublishProcess, "unthrottle", unthrottle)
    store = f"{tmp_path / 'store'}/"
    out = tv.train(
        tmp_path / "runs", config=tv.config_with(**{"train.snapshot_every": 2}), store=store,
        stop_at=5, before_commit=low_until_the_stop,
    )  # fmt: skip
    assert out.code == 42
    assert seen == [("periodic", {min(19, base + 10)}), ("stop", {base})]
    assert max(e.step for e in restorepoint.list_store(store)) == 5


@pytest.mark.parametrize("background", ["process", "thread"])
def test_a_stop_publishes_on_every_core_and_a_periodic_publish_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: str
) -> None:
    """Training waits for a stop's publish whole, so it encodes on a thread per core (up to
    the pack's default); a periodic publish keeps the run's one thread, which leaves the
    training thread a core."""
    from restorepoint.ops._threads import default_threads
    from restorepoint.runtime import publish as runtime_publish

    threads: list[tuple[str, int | None]] = []
    real_child = publish_process.PublishProcess.publish
    real_here = runtime_publish.publish

    def in_child(self: Any, source: Any, dest: Any, head: Any, options: Any, **kw: Any) -> Any:
        threads.append(("process", options.threads))
        return real_child(self, source, dest, head, options, **kw)

    def here(source: Any, dest: Any, head: Any, options: Any, **kw: Any) -> Any:
        threads.append(("thread", options.threads))
        return real_here(source, dest, head, options, **kw)

    monkeypatch.setattr(publish_process.PublishProcess, "publish", in_child)
    monkeypatch.setattr(runtime_publish, "publish", here)
    store = f"{tmp_path / 'store'}/"
    out = tv.train(
        tmp_path / "runs", config=tv.config_with(**{"train.snapshot_every": 2}), store=store,
        stop_at=5, background=background,
        # Each snapshot published before the next is taken: none is coalesced away.
        before_commit=lambda run, step: run.wait(),
    )  # fmt: skip
    assert out.code == 42
    # Steps 2 and 4, then the stop's at 5: each where the run publishes.
    assert threads == [(background, 1), (background, 1), (background, default_threads())]
    assert sorted(e.step for e in restorepoint.list_store(store)) == [2, 4, 5]


def test_without_a_publish_process_the_run_says_so_and_publishes_on_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = publish_process.PublishProcess.__init__

    def nowhere(self: Any, python: str | None = None) -> None:
        real(self, str(tmp_path / "no-such-python"))

    monkeypatch.setattr(publish_process.PublishProcess, "__init__", nowhere)
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with _published_once(run_dir, store, model, optimizer) as run:
        assert run.publisher.process is None
        assert run.uploads[-1]["ok"], run.uploads
    (said,) = [e for e in _events(run_dir) if e["event"] == "publish_process_unavailable"]
    assert "the publish process did not start" in said["error"]
    assert "publishing in the training process instead" in caplog.text
    _resumed_equal(store, model, optimizer, tmp_path / "again")


def test_where_the_default_can_have_no_process_it_says_so_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not asked for by name, a child that cannot start is an event and an info line (a
    container whose seccomp filter refuses ``process_vm_readv``), not a warning each run."""
    real = publish_process.PublishProcess.__init__

    def nowhere(self: Any, python: str | None = None) -> None:
        real(self, str(tmp_path / "no-such-python"))

    monkeypatch.setattr(publish_process.PublishProcess, "__init__", nowhere)
    caplog.set_level("INFO", logger="restorepoint")
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, final_snapshot=False) as run:
        run.track(model=model, optimizer=optimizer)
        run.commit()
        run.snapshot(wait=True)
        assert run.publisher.process is None
        assert run.uploads[-1]["ok"], run.uploads
    (said,) = [e for e in _events(run_dir) if e["event"] == "publish_process_unavailable"]
    assert "the publish process did not start" in said["error"]
    (record,) = [r for r in caplog.records if "training process instead" in r.getMessage()]
    assert record.levelname == "INFO"
    _resumed_equal(store, model, optimizer, tmp_path / "again")


def test_background_is_auto_process_or_thread(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="background must be one of auto, process, thread"):
        ResumableRun(CONFIG, run_dir=tmp_path / "run", background="fork")


def test_the_default_publishes_through_a_process_and_thread_keeps_it_in_the_run(
    tmp_path: Path,
) -> None:
    """``auto`` (the default) takes the child where it can run; ``thread`` keeps the publish
    in the training process; a run without a store, or an encrypted one, starts none."""
    model, optimizer = _trained()
    store = f"{tmp_path / 'store'}/"
    with ResumableRun(CONFIG, run_dir=tmp_path / "a", store=store, final_snapshot=False) as run:
        run.track(model=model, optimizer=optimizer)
        # Not beside the resume, which has every core's work until the first step: the
        # child starts once it is over.
        assert not run.worker.prepared.wait(0.2)
        assert run.publisher.process is not None and run.publisher.process.pid is None
        run.resume()
        assert run.worker.prepared.wait(60)
        assert run.publisher.process.pid is not None
        run.commit()
        run.snapshot(wait=True)
        assert run.publisher.process is not None and run.publisher.process.pid is not None
        assert run.uploads[-1]["ok"], run.uploads
    for where, kwargs in (("b", {"store": store, "background": "thread"}), ("c", {})):
        with ResumableRun(
            CONFIG, run_dir=tmp_path / where, final_snapshot=False, **kwargs
        ) as run:  # fmt: skip
            run.track(model=model, optimizer=optimizer)
            run.commit()
            run.snapshot(wait=True)
            assert run.publisher.process is None, kwargs


@pytest.mark.s3
def test_a_process_publish_to_s3_resumes_bit_for_bit(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    model, optimizer = _trained()
    store = f"s3://{s3_bucket}/process/"
    options = s3_storage_options
    with _published_once(tmp_path / "run", store, model, optimizer, storage_options=options) as run:
        assert run.publisher.process is not None
        assert run.uploads[-1]["ok"], run.uploads
    (entry,) = restorepoint.list_store(store, storage_options=options)
    restorepoint.verify(entry.url, storage_options=options)
    _resumed_equal(store, model, optimizer, tmp_path / "again", storage_options=options)


TRAINER = textwrap.dedent(
    """
    import sys, time
    import torch
    from restorepoint.torch import ResumableRun

    run_dir, store = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)  # 16 MiB: a publish of a few tenths of a second
    with ResumableRun({"lr": 0.01}, run_dir=run_dir, store=store, final_snapshot=False,
                      background="process") as run:
        run.track(model=model)
        run.commit()
        run.snapshot(wait=True)
        assert run.uploads[-1]["ok"], run.uploads
        print("published", run.uploads[-1]["url"], run.publisher.process.pid, flush=True)
        for _ in range(1000):
            with torch.no_grad():
                model.weight.add_(1.0)
            run.commit()
            run.snapshot(wait=True)
            print("published", run.uploads[-1]["url"], flush=True)
    """
)


@pytest.mark.parametrize("seed", range(3))
def test_a_kill_during_a_process_publish_leaves_the_store_whole(tmp_path: Path, seed: int) -> None:
    """SIGKILL of the training process at a random moment of its publishes: the child dies
    with it, and every restore point the store lists is whole and verifies, the newest
    published one among them."""
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), store],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[0] == "published", line
    child = int(line[2])
    time.sleep(random.Random(seed).uniform(0.05, 1.5))
    proc.kill()
    rest, _ = proc.communicate(timeout=60)
    published = [line[1]] + [
        words[1] for words in (x.split() for x in rest.splitlines()) if words[:1] == ["published"]
    ]
    # The child dies with the training process (PR_SET_PDEATHSIG).
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    entries = restorepoint.list_store(store)
    assert published[-1] in [e.url for e in entries]
    for entry in entries:
        restorepoint.verify(entry.url)
    model = torch.nn.Linear(2048, 2048)
    with ResumableRun(
        {"lr": 0.01}, run_dir=tmp_path / "fresh", store=store, final_snapshot=False
    ) as run:
        run.track(model=model)
        assert run.resume().step == max(e.step for e in entries)


STOPPED = textwrap.dedent(
    """
    import sys, time
    import torch
    from restorepoint.torch import ResumableRun

    run_dir, store = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    with ResumableRun({"lr": 0.01}, run_dir=run_dir, store=store, background="process") as run:
        run.track(model=model)
        run.commit()  # training has begun: the child starts
        run.worker.prepared.wait(60)  # and has answered
        for step in range(10_000):
            with torch.no_grad():
                model.weight.mul_(0.999)
            run.commit()
            print("step", run.step, run.publisher.process.pid, flush=True)
            time.sleep(0.02)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT])
def test_a_stop_signal_to_every_process_publishes_through_the_child_and_exits_42(
    tmp_path: Path, signum: int
) -> None:
    """Slurm signals every process of a job step (the template's SIGUSR2, the preemption's
    SIGTERM), and a terminal every process of its group (Ctrl-C): the child ignores them all,
    and the trainer's stop publishes through it."""
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    script = tmp_path / "trainer.py"
    script.write_text(STOPPED)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), store],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        words = line.split()
        if words[:2] == ["step", "5"]:
            child = int(words[2])
            os.kill(child, signum)
            proc.send_signal(signum)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 42, err
    events = _events(run_dir)
    (shutdown,) = [e for e in events if e["event"] == "graceful_shutdown"]
    assert shutdown["upload_finished"] is True
    assert not [e for e in events if e["event"] in ("publish_process_unavailable", "upload_failed")]
    (uploaded,) = [e for e in events if e["event"] == "uploaded"]
    assert uploaded["step"] == shutdown["step"] >= 5
    (entry,) = restorepoint.list_store(store)
    assert restorepoint.verify(entry.url).manifest.position.step == shutdown["step"]
    assert not _alive(child)


def test_read_memory_copies_another_process_memory_or_refuses() -> None:
    import ctypes

    from restorepoint._posix import read_memory

    source = bytearray(os.urandom(1 << 16))
    into = bytearray(len(source))
    address = ctypes.addressof((ctypes.c_char * len(source)).from_buffer(source))
    target = ctypes.addressof((ctypes.c_char * len(into)).from_buffer(into))
    read_memory(os.getpid(), address, target, len(source))
    assert into == source
    # Memory that is not mapped there is an OSError, never bytes made up.
    with pytest.raises(OSError, match="process_vm_readv"):
        read_memory(os.getpid(), 8, target, 16)


def test_the_publish_process_imports_no_torch() -> None:
    code = (
        "import sys, restorepoint.ops.publish_process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_a_frozen_backbone_publishes_incremental_restore_points_through_the_process(
    tmp_path: Path,
) -> None:
    """A frozen backbone's restore points name their chunks (spec 28.4): the child's publish
    samples chunks of the parent's memory before it writes (its reader seeks, as the thread's
    does); the second references the first's chunks and resumes bit for bit."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(8)))
    net[:7].requires_grad_(False)
    opt = torch.optim.SGD(net[7].parameters(), lr=0.1)
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with ResumableRun(
        CONFIG, run_dir=run_dir, store=store, final_snapshot=False, background="process"
    ) as run:
        run.track(model=net, optimizer=opt)
        for _ in range(2):
            net(torch.randn(4, 256)).square().mean().backward()
            opt.step()
            run.commit()
            run.snapshot(wait=True)
        assert run.publisher.process is not None
        assert [u["ok"] for u in run.uploads] == [True, True], run.uploads
        assert run.uploads[-1]["incremental"]["reused"] > 0
    first, second = sorted(restorepoint.list_store(store), key=lambda e: e.step)
    assert [b.name for b in restorepoint.read_manifest(second.url).bases or ()] == [first.name]
    restorepoint.verify(second.url)
    again = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(8)))
    with ResumableRun(CONFIG, run_dir=tmp_path / "again", store=store, final_snapshot=False) as run:
        run.track(model=again)
        assert run.resume().step == 2
    torch.testing.assert_close(again.state_dict(), net.state_dict(), rtol=0, atol=0)


def test_the_childs_reader_seeks_and_reads_what_the_pieces_hold() -> None:
    import ctypes

    memory = bytearray(os.urandom(3000))
    address = ctypes.addressof((ctypes.c_char * len(memory)).from_buffer(memory))
    peer = publish_process.Peer(b"head", ((address, 1000), (address + 2000, 1000)))
    reader = _publish_child._PeerSource(os.getpid(), peer).open()
    whole = b"head" + bytes(memory[:1000]) + bytes(memory[2000:])
    assert peer.size == len(whole) == 2004
    assert reader.seekable()
    assert bytes(reader.read(10)) == whole[:10]
    assert reader.seek(1500) == 1500
    assert bytes(reader.read(600)) == whole[1500:2004]
    reader.seek(3)
    assert bytes(reader.read()) == whole[3:]


def test_a_job_goes_to_the_child_as_json_and_comes_back_whole(tmp_path: Path) -> None:
    """No unpickler on either side: the head, the options (a signing key too) and the
    retention travel as JSON and are made again, validated, in the child; what JSON cannot
    carry (a storage option that is an object) is Unavailable, published on the thread."""
    from restorepoint.format import Position, Trainer
    from restorepoint.ops.publish import HeadSpec, PackOptions
    from restorepoint.ops.store import KeepBest

    key, _ = restorepoint.trust.generate(tmp_path / "signer")
    head = HeadSpec(
        Position(7, 1, 3), trainer=Trainer("t", "1.0"), terms={"torch": "2.13"},
        config={"lr": 0.5, "layers": [1, 2]}, operational_keys=("lr",),
        cache_keys={"data": "abc"}, run="run-1", metrics={"val_loss": 0.25},
    )  # fmt: skip
    options = PackOptions(
        level=3, sign=(restorepoint.trust.load_signing_key(key),), adaptive="deadline",
        storage_options={"anon": True}, incremental=False,
    )  # fmt: skip
    best = KeepBest(2, "val_loss", "min")
    memory = {"a": publish_process.Peer(b"h", ((4096, 10),)), "b": b"pos"}
    doc = _publish_wire.job_document("src", "dest/", head, options, memory, 3, best)
    text = json.dumps(doc)
    again, options2, best2 = _publish_wire.job_from(json.loads(text))
    assert again.manifest.to_dict() | {"id": None, "created": None} == head.manifest.to_dict() | {
        "id": None,
        "created": None,
    }
    # Every field as it was; the key (an object, compared by identity) by its raw bytes.
    assert dataclasses.replace(options2, sign=()) == dataclasses.replace(options, sign=())
    assert [k.private_bytes_raw() for k in options2.sign] == [
        k.private_bytes_raw() for k in options.sign
    ]
    assert options2.storage_options == {"anon": True}
    assert best2 == best
    with pytest.raises(publish_process.Unavailable, match="not JSON"):
        _publish_wire.job_document(
            "src", "dest/", head, PackOptions(storage_options={"session": object()}), {}, None, None
        )


def test_a_forked_process_holding_the_pipe_does_not_keep_the_child_at_close() -> None:
    """A data loader's workers are forked from the training process after the child started,
    and hold a copy of its input's write end: ``close`` tells the child to end, and it ends
    by itself (not killed after close's wait). (In a run the child also dies with the
    snapshot worker's thread, which ends before the run's close.)"""
    process = publish_process.PublishProcess()
    process.start()
    child = process._child
    assert child is not None
    holder = os.fork()
    if holder == 0:  # the worker: holds every descriptor, does nothing
        time.sleep(120)
        os._exit(0)
    try:
        process.close()
        assert child.returncode == 0  # ended by itself; close kills with -9 after 5 s
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)


def test_the_child_writes_last_pt_beside_its_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a publish process, the snapshot file is the child's to write too (read out of the
    training process's memory, past the page cache): no thread of the training process
    writes it, and it is the same file the training process would have written."""
    from restorepoint.runtime.snapshot_file import SnapshotImage
    from restorepoint.runtime.state import load_state, save_image

    here = tv.saves_here(monkeypatch)
    model, optimizer = _trained()
    store, run_dir = f"{tmp_path / 'store'}/", tmp_path / "run"
    with _published_once(run_dir, store, model, optimizer) as run:
        assert run.publisher.process is not None
        assert run.uploads[-1]["ok"], run.uploads
        last = run_dir / "checkpoints" / "last.pt"
        state = load_state(last)
        assert state["position"]["step"] == 1
        torch.testing.assert_close(state["objects"]["model"], model.state_dict(), rtol=0, atol=0)
        # Byte for byte the file the training process writes of the same state.
        mine = tmp_path / "mine.pt"
        save_image(SnapshotImage(dict(load_state(last))), mine, tmp_path)
        assert mine.read_bytes() == last.read_bytes()
    assert here == []
    assert [str(p) for p in run_dir.rglob(".*")] == []  # no temporary file left


def test_the_childs_save_runs_lowest_beside_a_periodic_publish_and_a_stop_raises_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's thread that writes the snapshot file takes the nice the job names (19
    beside a periodic publish); a stop's priority message raises it while it writes. Run in
    this process (the child's job function, reading this process's memory), so that the
    write can be held at its first read."""
    if os.geteuid() != 0:
        pytest.skip("raising a thread's priority back needs root (or RLIMIT_NICE)")
    import ctypes
    import threading

    from restorepoint.format import Position
    from restorepoint.ops._increment import Rest
    from restorepoint.ops.publish import HeadSpec, PackOptions

    base = _nice(0)
    data = bytearray(os.urandom(3 << 20))
    address = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
    peer = publish_process.Peer(b"HEAD" * 2, ((address, len(data)),))
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    head = HeadSpec(Position(1, 0, 1), config={"lr": 0.1}, run="run-1")
    memory = {"last.pt": peer, "position.json": b"{}\n"}
    job = _publish_wire.job_document(
        str(checkpoints), f"{tmp_path / 'store'}/", head, PackOptions(), memory, None, None
    )
    save = publish_process.SaveJob("last.pt", str(checkpoints / "last.pt"), str(run_dir), 19)
    job.update(expect=None, deadline=None, save=save.document())
    job = json.loads(json.dumps(job))  # as the wire carries it

    seen: dict[str, int] = {}
    held, release = threading.Event(), threading.Event()
    real = _publish_child.read_memory

    def watched(pid: int, at: int, into: int, n: int) -> None:
        if threading.current_thread().name == "rp-save" and not held.is_set():
            seen["tid"] = threading.get_native_id()
            seen["periodic"] = _nice(seen["tid"])
            held.set()
            assert release.wait(60)
        real(pid, at, into, n)

    monkeypatch.setattr(_publish_child, "read_memory", watched)
    saver = _publish_child._Saver(os.getpid())
    box: list[dict[str, Any]] = []

    def work() -> None:
        outcome, saving = _publish_child._job(os.getpid(), job, Rest(), saver)
        assert saving is not None
        box.extend([outcome, saving.result()])

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert held.wait(60)
        saver.raise_all(base)  # the stop's priority message
        seen["stop"] = _nice(seen["tid"])
    finally:
        release.set()
        worker.join(60)
    outcome, saved = box
    assert outcome["ok"], outcome
    assert saved == {"ok": True}
    assert (seen["periodic"], seen["stop"]) == (19, base)
    assert (checkpoints / "last.pt").read_bytes() == b"HEAD" * 2 + bytes(data)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]  # no temporary file


def test_the_child_has_a_process_group_of_its_own_in_the_trainers_session() -> None:
    """A terminal's Ctrl-C (to the trainer's foreground group) does not reach the child, and
    the scheduler weighs the child's threads by their nice against the trainer's: a session
    of its own would have been a group of the scheduler's own (autogroup) that weighed as
    much as the whole training process."""
    process = publish_process.PublishProcess()
    process.start()
    try:
        pid = process.pid
        assert pid is not None
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert os.getsid(pid) == os.getsid(0)
        mine = Path("/proc/self/autogroup")
        if mine.exists():  # a kernel with autogroup: the child in the trainer's
            assert Path(f"/proc/{pid}/autogroup").read_text() == mine.read_text()
    finally:
        process.close()
