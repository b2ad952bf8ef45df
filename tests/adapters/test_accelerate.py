"""restorepoint.adapters.accelerate in one process, with a real Accelerator on the CPU and a
store on moto's S3 server: a publish and a resume onto a fresh directory give back the model,
the optimizer, the scheduler and the RNG bit for bit; a changed config is refused with its
field named; a code-running optimizer.bin is refused before anything loads it; a half-written
local state is skipped; a snapshot request (SIGUSR1) publishes on the snapshot worker; a SIGTERM at
a step boundary publishes, prints the stop line and exits 42, and leaves no handler, store
deadline or thread behind."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from crafted import RunsCode  # noqa: E402

from restorepoint.adapters.accelerate import (  # noqa: E402
    STATE_RECORD,
    AccelerateRun,
    publish_state,
    resume_state,
)
from restorepoint.errors import IncompatibleRestorePoint, UnsafeCheckpoint  # noqa: E402
from restorepoint.format import Position  # noqa: E402
from restorepoint.ops import list_store  # noqa: E402
from restorepoint.ops.publish import publish  # noqa: E402
from restorepoint.ops.verify import inspect_restore_point  # noqa: E402
from restorepoint.storage import deadline_left  # noqa: E402

CONFIG = {"lr": 0.05, "model": "mlp-4-8-2"}


@pytest.fixture
def fresh() -> Iterator[Any]:
    """A new Accelerator (one process, CPU) each call, with a model, an optimizer and a
    scheduler prepared; Accelerate's process-wide state is reset after the test."""

    def make(seed: int = 0) -> tuple[Any, Any, Any, Any]:
        AcceleratorState._reset_state(True)
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"])
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return (accelerator, *accelerator.prepare(model, optimizer, scheduler))

    yield make
    AcceleratorState._reset_state(True)


def train(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def snapshot(model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    # Copies: a state dict holds the live tensors, which training goes on changing.
    return copy.deepcopy(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
        }
    )


def assert_same(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.fixture
def store(s3_bucket: str, s3_storage_options: dict[str, Any]) -> dict[str, Any]:
    return {
        "store": f"s3://{s3_bucket}/runs/",
        "config": CONFIG,
        "storage_options": s3_storage_options,
    }


def test_publish_and_resume_from_the_store_bit_for_bit(
    tmp_path: Path, fresh: Any, store: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 3)
    url = publish_state(accelerator, tmp_path / "a", step=3, epoch=1, **store)
    assert url is not None
    want = snapshot(model, optimizer, scheduler)

    head = inspect_restore_point(url, storage_options=store["storage_options"]).manifest
    assert head.position == Position(3, 1)
    assert head.trainer is not None
    assert (head.trainer.name, head.trainer.version) == ("accelerate", accelerate.__version__)
    assert head.terms["accelerate"] == accelerate.__version__
    assert head.terms["torch"] == torch.__version__.split("+")[0]
    assert head.config == CONFIG
    assert head.run is not None and head.run.startswith("cfg-")
    assert {e.path for e in head.payload or ()} == {
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin",
    }  # fmt: skip

    # The state record says of each file what the published index says: the files were
    # hashed once, by the publish, not again for the record.
    record = json.loads((tmp_path / "a" / STATE_RECORD).read_text())
    assert record["files"] == {
        e.path: {"sha256": e.sha256, "size": e.size} for e in head.payload or ()
    }

    # Another machine: other weights, a fresh directory, the same store.
    accelerator, model, optimizer, scheduler = fresh(seed=1)
    torch.manual_seed(99)
    position = resume_state(accelerator, tmp_path / "b", **store)
    assert position == Position(3, 1)
    assert_same(snapshot(model, optimizer, scheduler), want)
    assert (tmp_path / "b" / STATE_RECORD).is_file()
    err = capsys.readouterr().err
    assert f"restorepoint: resumed from {url}, imported into {tmp_path / 'b'}: step 3" in err

    # Trained on, the two runs stay equal; and the imported directory is now complete locally.
    accelerator, model, optimizer, scheduler = fresh(seed=2)
    assert resume_state(accelerator, tmp_path / "b", **store) == Position(3, 1)
    assert f"resumed from {tmp_path / 'b'}: step 3" in capsys.readouterr().err


class Counter:
    """An object registered for checkpointing: Accelerate saves its state dict as
    ``custom_checkpoint_0.pkl`` and loads it with ``weights_only=False``."""

    def __init__(self, seen: int = 0) -> None:
        self.seen, self.scale = seen, torch.full((3,), float(seen))

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen, self.scale = state["seen"], state["scale"]


def test_every_load_of_load_state_is_weights_only_and_a_custom_checkpoint_round_trips(
    tmp_path: Path, fresh: Any, store: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Accelerate loads a registered object's custom checkpoint with weights_only=False: the
    # resume runs load_state with every torch.load forced to weights-only, and the object's
    # state (a tensor and an int) still comes back.
    accelerator, model, optimizer, scheduler = fresh()
    counter = Counter(7)
    accelerator.register_for_checkpointing(counter)
    train(accelerator, model, optimizer, scheduler, 2)
    publish_state(accelerator, tmp_path / "a", step=2, **store)
    assert (tmp_path / "a" / "custom_checkpoint_0.pkl").is_file()

    accelerator, *_ = fresh(seed=1)
    again = Counter()
    accelerator.register_for_checkpointing(again)
    forced: list[tuple[str, Any]] = []
    real_load = torch.load

    def spy(f: Any, *args: Any, **kwargs: Any) -> Any:
        forced.append((os.path.basename(str(f)), os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")))
        return real_load(f, *args, **kwargs)

    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    monkeypatch.setattr(torch, "load", spy)
    assert resume_state(accelerator, tmp_path / "b", **store) == Position(2, 0)
    assert again.seen == 7 and torch.equal(again.scale, torch.full((3,), 7.0))
    loaded_by_accelerate = [name for name, flag in forced if flag == "1"]
    assert "custom_checkpoint_0.pkl" in loaded_by_accelerate
    assert "optimizer.bin" in loaded_by_accelerate
    # Outside load_state no torch.load was forced, and the switch is gone afterwards.
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


@pytest.mark.parametrize("frozen", [False, True])
def test_a_full_fine_tunes_first_restore_point_names_no_chunks(
    tmp_path: Path, frozen: bool
) -> None:
    # The run tells its rest what the Accelerator's optimizers step (spec 28.4): with every
    # layer trained by AdamW nothing of a restore point is left in the next, and the first,
    # into a store that holds nothing of the run, names no chunks; a frozen backbone's names
    # them, and the next references it.
    from restorepoint.format.delta import DELTA_FEATURE

    AcceleratorState._reset_state(True)
    try:
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(0)
        backbone, head = torch.nn.Linear(512, 512), torch.nn.Linear(512, 8)
        backbone.requires_grad_(not frozen)
        model = torch.nn.Sequential(backbone, torch.nn.Tanh(), head)
        trained = [p for p in model.parameters() if p.requires_grad]
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(trained, lr=1e-4))
        store = {"store": f"{tmp_path / 'store'}/", "config": {**CONFIG, "frozen": frozen}}
        rp = AccelerateRun(accelerator, tmp_path / "a", **store)
        for step in (1, 2):
            accelerator.backward(model(torch.randn(8, 512)).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            rp.publish(step=step)
    finally:
        AcceleratorState._reset_state(True)
    entries = sorted(list_store(store["store"]), key=lambda e: e.step)
    first, second = (inspect_restore_point(e.url).manifest for e in entries)
    assert (DELTA_FEATURE in first.required_features) is frozen
    if frozen:
        assert [b.name for b in second.bases or ()] == [entries[0].name]
    else:
        assert DELTA_FEATURE not in second.required_features


def test_a_changed_config_is_refused_naming_the_field(
    tmp_path: Path, fresh: Any, store: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 2)
    # A run named apart from its config: a changed config is the same run, refused. (Named by
    # its config alone, a changed config is another run, and starts fresh.)
    store = {**store, "run": "tune"}
    publish_state(accelerator, tmp_path / "a", step=2, **store)
    changed = {**store, "config": {**CONFIG, "lr": 0.5}}

    accelerator, *_ = fresh()
    with pytest.raises(IncompatibleRestorePoint, match=r"config\.lr") as info:
        resume_state(accelerator, tmp_path / "b", exit_on_refusal=False, **changed)
    assert "config.lr: here 0.5 (config=), in the restore point 0.05" in info.value.details[0]
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())
    # The local state directory is gated the same way.
    with pytest.raises(IncompatibleRestorePoint, match=r"config\.lr"):
        resume_state(accelerator, tmp_path / "a", config=changed["config"], exit_on_refusal=False)
    # By default: one line (and the mismatch) on stderr, and exit 3.
    with pytest.raises(SystemExit) as exited:
        resume_state(accelerator, tmp_path / "b", **changed)
    assert exited.value.code == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("restorepoint: error: ") and "(config.lr)" in err[0]
    assert err[1] == "restorepoint:   config.lr: here 0.5 (config=), in the restore point 0.05"


def test_a_code_running_optimizer_bin_is_refused_before_accelerate_loads_it(
    tmp_path: Path, fresh: Any, store: dict[str, Any]
) -> None:
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 2)
    publish_state(accelerator, tmp_path / "a", step=2, **store)
    # A restore point of the run, one step on, whose optimizer.bin runs code when unpickled.
    marker = tmp_path / "ran"
    torch.save({"state": {0: RunsCode(marker)}, "param_groups": []}, tmp_path / "a/optimizer.bin")
    rp = AccelerateRun(accelerator, tmp_path / "a", **store)
    files = [p.name for p in (tmp_path / "a").iterdir() if p.name != STATE_RECORD]
    options = rp.options
    publish(tmp_path / "a", store["store"], rp.head(Position(3)), options, include=files)

    accelerator, *_ = fresh(seed=1)
    with pytest.raises(UnsafeCheckpoint, match=r"optimizer\.bin"):
        resume_state(accelerator, tmp_path / "b", exit_on_refusal=False, **store)
    assert not marker.exists()
    # Nothing of it took the state's names.
    assert not (tmp_path / "b" / "optimizer.bin").exists()
    with pytest.raises(SystemExit) as exited:
        resume_state(accelerator, tmp_path / "b", **store)
    assert exited.value.code == 1
    assert not marker.exists()


def test_a_half_written_local_state_is_skipped_for_the_store(
    tmp_path: Path, fresh: Any, store: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 2)
    publish_state(accelerator, tmp_path / "a", step=2, **store)
    want = snapshot(model, optimizer, scheduler)
    # Saved again at step 4 (a newer record), then torn: a file truncated, one removed.
    train(accelerator, model, optimizer, scheduler, 2)
    publish_state(accelerator, tmp_path / "a", step=4, config=CONFIG)
    record = json.loads((tmp_path / "a" / STATE_RECORD).read_text())
    assert record["head"]["position"]["step"] == 4
    with (tmp_path / "a/optimizer.bin").open("r+b") as f:
        f.truncate(100)
    (tmp_path / "a/scheduler.bin").unlink()

    accelerator, model, optimizer, scheduler = fresh(seed=1)
    assert resume_state(accelerator, tmp_path / "a", **store) == Position(2, 0)
    assert "skipping the state in" in caplog.text
    assert_same(snapshot(model, optimizer, scheduler), want)


def workers() -> set[int | None]:
    return {t.ident for t in threading.enumerate() if t.name == "rp-snapshots"}


def test_sigterm_at_a_step_boundary_publishes_and_exits_42(
    tmp_path: Path, fresh: Any, store: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    # An earlier test's abandoned upload may still be finishing on its own thread.
    workers_before = workers()
    accelerator, model, optimizer, scheduler = fresh()
    with AccelerateRun(accelerator, tmp_path / "a", **store) as rp:
        train(accelerator, model, optimizer, scheduler, 1)
        # A snapshot request: published at the boundary, on the runtime's snapshot worker.
        os.kill(os.getpid(), signal.SIGUSR1)
        rp.check(step=1)
        assert rp.uploads == [] or rp.uploads[-1]["step"] == 1
        train(accelerator, model, optimizer, scheduler, 1)
        assert rp.wait(60)
        assert rp.uploads[-1]["ok"] and rp.uploads[-1]["step"] == 1
        assert not rp.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert rp.should_stop()
        with pytest.raises(SystemExit) as exited:
            rp.stop(step=2)
    assert exited.value.code == 42
    entry, periodic = list_store(store["store"], storage_options=store["storage_options"])
    assert (entry.step, periodic.step) == (2, 1)
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"restorepoint: stop (SIGTERM) at step 2: restore point published to {entry.url} and "
        "verified; exiting 42 (resumable)"
    )
    # Nothing of the run is left behind: the handler, the store deadline, the worker thread.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before
    assert deadline_left() is None
    assert rp.worker is None
    assert workers() <= workers_before


def test_a_restore_point_handed_over_by_restorepoint_run_resume_from(
    tmp_path: Path, fresh: Any
) -> None:
    """``restorepoint run --resume-from`` imports the restore point and hands it to the job
    (tests/adapters/_accelerate_job.py, the same model), which gates it again and resumes."""
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 2)
    config = {"lr": CONFIG["lr"], "model": CONFIG["model"], "steps": 8}
    url = publish_state(
        accelerator, tmp_path / "a", step=2, store=f"{tmp_path / 'store'}/", run="handed",
        config=config, operational=["steps"],
    )  # fmt: skip
    assert url is not None
    job = Path(__file__).with_name("_accelerate_job.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESTOREPOINT_")}
    done = subprocess.run(
        [sys.executable, "-m", "restorepoint", "run", "--store", f"{tmp_path / 'other'}/",
         "--term", f"accelerate={accelerate.__version__}", "--resume-from", url, "--",
         sys.executable, str(job), "--dir", str(tmp_path / "b"), "--out", str(tmp_path / "b"),
         "--run", "handed", "--steps", "3"],
        capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "start 2\n" in done.stdout
    assert (
        f"restorepoint: resumed from {url}, handed over by restorepoint run, copied into "
        f"{tmp_path / 'b'}: step 2"
    ) in done.stderr
    assert (tmp_path / "b" / STATE_RECORD).is_file()


def test_with_a_store_the_files_are_hashed_once_by_the_publish(
    tmp_path: Path, fresh: Any, store: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import restorepoint.adapters._accelerate_state as state

    def hashed_again(*args: Any) -> Any:
        raise AssertionError("the state record hashed the files the publish had hashed")

    monkeypatch.setattr(state, "hashed_index", hashed_again)
    accelerator, model, optimizer, scheduler = fresh()
    train(accelerator, model, optimizer, scheduler, 1)
    url = publish_state(accelerator, tmp_path / "a", step=1, **store)
    assert url is not None
    payload = inspect_restore_point(url, storage_options=store["storage_options"]).manifest.payload
    record = json.loads((tmp_path / "a" / STATE_RECORD).read_text())
    assert record["files"] == {e.path: {"sha256": e.sha256, "size": e.size} for e in payload or ()}
    # Without a store there is no index to take them from: hashed here, at the save. (Not
    # compared with the first record: the RNG files may differ, a retry's jitter draws.)
    monkeypatch.undo()
    publish_state(accelerator, tmp_path / "c", step=1, config=CONFIG)
    local = json.loads((tmp_path / "c" / STATE_RECORD).read_text())
    assert local["files"].keys() == record["files"].keys()
    for name, entry in local["files"].items():
        data = (tmp_path / "c" / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
