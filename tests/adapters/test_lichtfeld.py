"""The LichtFeld Studio adapter, against the fake trainer (restorepoint.testing.fake_lichtfeld):
the adapter conformance suite, command lines, snapshot signals, cleaning the project, and the
CLI's pack and import --exec round trip."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clirun import cli, one_error_line

from restorepoint.adapters.base import Adapter, Snapshot, load_adapter
from restorepoint.adapters.external import LichtFeldAdapter
from restorepoint.errors import UsageError
from restorepoint.format import Position
from restorepoint.ops import pack, read_manifest, verify
from restorepoint.testing.adapter import AdapterConformance
from restorepoint.testing.fake_lichtfeld import FAKE_COMMIT, FAKE_VERSION, SIGTERM_EXIT, scale_steps

FAKE = [sys.executable, "-m", "restorepoint.testing.fake_lichtfeld"]
FAKE_BINARY = shlex.join(FAKE)
#: Long enough that a test always finds the trainer running; it is stopped well before.
FOREVER = 10**7
WAIT = 60.0


def fake_adapter() -> LichtFeldAdapter:
    return LichtFeldAdapter(binary=FAKE)


def make_data(root: Path) -> Path:
    data = root / "data"
    (data / "images").mkdir(parents=True)
    for i in range(3):
        (data / "images" / f"DSC{i:04d}.JPG").write_bytes(bytes([i]) * 64)
    (data / "sparse.txt").write_text("cameras\n")
    return data


def train(
    adapter: LichtFeldAdapter,
    data: Path,
    out: Path,
    *,
    iterations: int,
    checkpoint_every: int = 0,
    extra: tuple[str, ...] = (),
) -> int:
    command = adapter.build_command(data, out, iterations, checkpoint_every, extra)
    with adapter.run(command, out) as trainer:
        for _ in trainer:
            pass
    code = trainer.returncode
    assert code is not None
    return code


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("scene"))


@pytest.fixture(scope="module")
def project(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run: 2000 iterations, a snapshot every 500 (500, 1000, 1500)."""
    out = tmp_path_factory.mktemp("lichtfeld") / "output"
    assert train(fake_adapter(), data, out, iterations=2000, checkpoint_every=500) == 0
    return out


class TestLichtFeldAdapter(AdapterConformance):
    @pytest.fixture
    def adapter(self) -> Adapter:
        return load_adapter("lichtfeld", binary=FAKE_BINARY)

    @pytest.fixture
    def produced(self, project: Path) -> Path:
        return project

    @pytest.fixture
    def expected_step(self) -> int:
        return 1500


def test_the_fake_trainer_reports_itself() -> None:
    info = fake_adapter().trainer()
    assert (info.name, info.version) == ("lichtfeld-studio", FAKE_VERSION)
    assert info.terms == {"lichtfeld.commit": FAKE_COMMIT}


def test_a_missing_binary_is_one_usage_error() -> None:
    with pytest.raises(UsageError, match="not found"):
        LichtFeldAdapter(binary="no-such-lichtfeld-binary").trainer()


# -- command lines -------------------------------------------------------------------------------


def test_command_line_and_save_steps_from_checkpoint_every() -> None:
    a = LichtFeldAdapter(binary="LichtFeld-Studio")
    base = ["LichtFeld-Studio", "--headless", "-d", "scene", "-o", "out", "-i", "3000"]
    assert a.build_command("scene", "out", iterations=3000) == base
    assert a.build_command("scene", "out", iterations=3000, checkpoint_every=0) == base
    assert a.build_command("scene", "out", iterations=3000, checkpoint_every=1000) == [
        *base,
        "--save-steps",
        "1000,2000",
    ]
    # The trainer does not save at its last iteration: 3000 is not asked for.
    assert a.snapshot_steps(3000, 500) == [500, 1000, 1500, 2000, 2500]
    # Without -i the trainer's default iteration count bounds the list.
    assert a.snapshot_steps(None, 10000) == [10000, 20000]
    extra = ["--strategy", "mcmc"]
    assert a.build_command("scene", "out", checkpoint_every=15000, extra=extra) == [
        "LichtFeld-Studio",
        "--headless",
        "-d",
        "scene",
        "-o",
        "out",
        "--strategy",
        "mcmc",
        "--save-steps",
        "15000",
    ]


@pytest.mark.parametrize("every", [1, 100, 499])
def test_checkpoint_every_below_the_minimum_is_refused(every: int) -> None:
    with pytest.raises(UsageError, match="minimum of 500"):
        LichtFeldAdapter().build_command("scene", "out", iterations=3000, checkpoint_every=every)


@pytest.mark.parametrize("every", [-500, True, 1000.0, "1000"])
def test_checkpoint_every_must_be_a_non_negative_integer(every: object) -> None:
    with pytest.raises(UsageError, match=r"train\.checkpoint_every"):
        LichtFeldAdapter().snapshot_steps(3000, every)  # type: ignore[arg-type]


def test_a_save_steps_list_too_long_for_one_argument_is_refused() -> None:
    a = LichtFeldAdapter()
    assert len(a.snapshot_steps(5_000_000, 500)) == 9999
    with pytest.raises(UsageError, match="more than 10000 snapshots"):
        a.snapshot_steps(10**8, 500)


def test_save_steps_already_in_the_extra_arguments_are_refused() -> None:
    with pytest.raises(UsageError, match="already hold --save-steps"):
        LichtFeldAdapter().build_command("s", "o", checkpoint_every=500, extra=["--save-steps=7"])


@pytest.mark.parametrize("scaler", [2.0, 0.5, 1.5, 3.0, 0.37])
def test_save_steps_are_scaled_like_the_trainers_eval_steps(scaler: float) -> None:
    a = LichtFeldAdapter()
    extra = ["--steps-scaler", str(scaler)]
    values = a.snapshot_steps(7000, 1000, extra)
    landed = scale_steps(values, scaler)  # what the trainer makes of them
    total = scale_steps([7000], scaler)[0]
    targets = list(range(1000, total, 1000))
    assert len(landed) == len(targets)
    for got, want in zip(landed, targets, strict=True):
        assert abs(got - want) <= scaler / 2 + 0.5
    if scaler == 2.0:
        assert landed == targets  # exact when the wanted steps divide evenly
    assert a.snapshot_steps(7000, 1000, [f"--steps-scaler={scaler}"]) == values


def test_scaled_save_steps_land_where_asked_in_a_real_run(data: Path, tmp_path: Path) -> None:
    a = fake_adapter()
    out = tmp_path / "out"
    code = train(a, data, out, iterations=1000, checkpoint_every=500, extra=("--steps-scaler", "2"))
    assert code == 0
    # 1000 iterations scaled by 2 are 2000 real ones; a snapshot every 500 real steps.
    assert [s.step for s in a.committed_snapshots(out)] == [500, 1000, 1500]
    assert (out / "splat_2000.ply").is_file()


def test_checkpoint_every_is_operational(data: Path, tmp_path: Path) -> None:
    a = LichtFeldAdapter()
    with_it = {"scene": "garden", "train": {"iterations": 7000, "checkpoint_every": 1000}}
    without = {"scene": "garden", "train": {"iterations": 7000}}
    off = {"scene": "garden", "train": {"iterations": 7000, "checkpoint_every": 0}}
    assert "train.checkpoint_every" in a.operational_keys
    assert a.checkpoint_every(with_it) == 1000
    assert a.checkpoint_every(without) == 0
    assert a.cache_keys(with_it) == a.cache_keys(without) == a.cache_keys(off)
    other = {"scene": "garden", "train": {"iterations": 8000}}
    assert a.cache_keys(other) != a.cache_keys(without)
    with pytest.raises(UsageError, match="minimum"):
        a.checkpoint_every({"train": {"checkpoint_every": 50}})
    # Packed with the adapter's operational keys, the identity and cache keys do not move.
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "checkpoint_1000.resume").write_bytes(b"x" * 100)
    heads = []
    for n, config in enumerate((with_it, without)):
        url = str(tmp_path / f"{n}.rp")
        pack(
            src,
            url,
            position=Position(step=1000),
            config=config,
            operational_keys=a.operational_keys,
            cache_keys=a.cache_keys(config),
        )
        heads.append(read_manifest(url))
    assert heads[0].config_identity == heads[1].config_identity
    assert heads[0].cache_keys == heads[1].cache_keys
    assert heads[0].run == heads[1].run
    # Only the snapshot-steps flag differs between the two command lines.
    cmd_with = a.build_command(data, "out", iterations=7000, checkpoint_every=1000)
    cmd_without = a.build_command(data, "out", iterations=7000)
    assert cmd_with[: len(cmd_without)] == cmd_without
    assert cmd_with[len(cmd_without) :] == ["--save-steps", "1000,2000,3000,4000,5000,6000"]


# -- snapshot signals ----------------------------------------------------------------------------


def _long_run(adapter: LichtFeldAdapter, data: Path, out: Path) -> list[str]:
    return adapter.build_command(data, out, iterations=FOREVER, extra=["--step-delay", "0.0005"])


def test_sigusr1_gives_a_committed_snapshot_without_stopping(data: Path, tmp_path: Path) -> None:
    a = fake_adapter()
    out = tmp_path / "out"
    with a.run(_long_run(a, data, out), out) as trainer:
        assert trainer.wait_ready(WAIT)
        a.request_snapshot(trainer.pid)
        first = trainer.next_snapshot(WAIT)
        assert first is not None and first.step > 0
        assert (first.root / first.files[0]).stat().st_size > 0
        assert trainer.returncode is None  # still training
        a.request_snapshot(trainer.pid)
        second = trainer.next_snapshot(WAIT)
        assert second is not None and second.step > first.step
        assert a.newest_snapshot(out) == second
        trainer.terminate()
        assert trainer.wait(WAIT) == SIGTERM_EXIT


def test_sigusr1_then_sigterm_still_exits_promptly(data: Path, tmp_path: Path) -> None:
    a = fake_adapter()
    out = tmp_path / "out"
    with a.run(_long_run(a, data, out), out) as trainer:
        assert trainer.wait_ready(WAIT)
        a.request_snapshot(trainer.pid)
        trainer.terminate()
        assert trainer.wait(WAIT) == SIGTERM_EXIT
    # Whatever was announced before the exit is complete; nothing half-written counts.
    for snap in a.committed_snapshots(out):
        assert (snap.root / snap.files[0]).stat().st_size > 0


def test_a_trainer_not_yet_up_is_never_sent_the_snapshot_signal(tmp_path: Path) -> None:
    a = LichtFeldAdapter(binary=[sys.executable, "-c", "import time; time.sleep(60)"])
    trainer = a.start([*a.binary], tmp_path)
    try:
        with pytest.raises(UsageError, match="not reported itself up"):
            a.request_snapshot(trainer.pid)
        assert trainer.returncode is None  # not killed by an unhandled SIGUSR1
    finally:
        trainer.terminate()
        trainer.wait(WAIT)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_a_process_it_did_not_start_is_checked_through_proc(data: Path, tmp_path: Path) -> None:
    a = fake_adapter()
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(UsageError, match="would kill it"):
            a.request_snapshot(idle.pid)
        assert idle.poll() is None
    finally:
        idle.kill()
        idle.wait()
    out = tmp_path / "out"
    log = tmp_path / "foreign.log"
    with open(log, "wb") as sink:
        foreign = subprocess.Popen(_long_run(a, data, out), stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT
        while b"Starting training loop" not in log.read_bytes():
            assert foreign.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        a.request_snapshot(foreign.pid)
        while not list((out / "checkpoints").glob("checkpoint_*.resume")):
            assert foreign.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        foreign.terminate()
        assert foreign.wait(WAIT) == SIGTERM_EXIT


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers need the main thread",
)
def test_run_forwards_signals_to_the_trainer(data: Path, tmp_path: Path) -> None:
    a = fake_adapter()
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    with a.run(_long_run(a, data, out), out) as trainer:
        # A snapshot request that arrives before the trainer is up is held, then delivered.
        os.kill(os.getpid(), signal.SIGUSR1)
        snap = trainer.next_snapshot(WAIT)
        assert snap is not None and trainer.ready.is_set()
        # SIGTERM to this process goes straight to the trainer, which stops.
        os.kill(os.getpid(), signal.SIGTERM)
        assert trainer.wait(WAIT) == SIGTERM_EXIT
    assert signal.getsignal(signal.SIGTERM) is before


# -- cleaning the project ------------------------------------------------------------------------


def test_clean_project_keeps_only_the_newest_once_it_is_committed(
    project: Path, tmp_path: Path
) -> None:
    out = tmp_path / "output"
    shutil.copytree(project, out)
    ckpts = out / "checkpoints"
    (ckpts / "checkpoint_1800.resume").write_bytes(b"announced nowhere")
    (ckpts / "checkpoint_1900.resume.tmp").write_bytes(b"a write in progress")
    a = fake_adapter()
    everything = sorted(p.name for p in ckpts.iterdir())

    # Not committed (no announcement): refused, and nothing is removed.
    with pytest.raises(UsageError, match="not a committed snapshot"):
        a.clean_project(out, keep=Snapshot(ckpts, ("checkpoint_1800.resume",), Position(1800)))
    assert sorted(p.name for p in ckpts.iterdir()) == everything

    # The caller's order: newest committed snapshot -> pack -> verify -> clean.
    newest = a.newest_snapshot(out)
    assert newest is not None and newest.step == 1500
    url = str(tmp_path / "rp" / "1500.rp")
    pack(newest.root, url, position=newest.position, include=list(newest.files))
    verify(url)
    removed = a.clean_project(out, keep=newest)
    assert sorted(p.name for p in removed) == ["checkpoint_1000.resume", "checkpoint_500.resume"]
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "checkpoint_1500.resume",
        "checkpoint_1800.resume",  # newer than what was verified: not ours to judge
        "checkpoint_1900.resume.tmp",  # partial: left alone
    ]
    # What is kept is still the newest committed snapshot, and still packs and verifies.
    assert a.newest_snapshot(out) == newest
    again = str(tmp_path / "rp" / "again.rp")
    pack(newest.root, again, position=newest.position, include=list(newest.files))
    assert verify(again).files == 1
    assert a.clean_project(out, keep=newest) == []

    # A snapshot whose file is gone is not committed any more.
    (ckpts / "checkpoint_1500.resume").unlink()
    with pytest.raises(UsageError, match="nothing removed"):
        a.clean_project(out, keep=newest)
    assert (ckpts / "checkpoint_1800.resume").exists()


def test_clean_project_with_nothing_committed_removes_nothing(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint_100.resume").write_bytes(b"x")
    (tmp_path / "restorepoint-trainer.log").write_text("Starting training loop\n")
    assert fake_adapter().clean_project(tmp_path) == []
    assert (tmp_path / "checkpoints" / "checkpoint_100.resume").exists()


# -- through the CLI -----------------------------------------------------------------------------


def test_pack_with_the_adapter_through_the_cli(project: Path, tmp_path: Path) -> None:
    url = str(tmp_path / "store" / "snapshot.rp")
    proc = cli(
        "pack",
        str(project),
        url,
        "--adapter",
        "lichtfeld",
        "--adapter-option",
        f"binary={FAKE_BINARY}",
    )
    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(url)
    assert manifest.trainer is not None
    assert (manifest.trainer.name, manifest.trainer.version) == ("lichtfeld-studio", FAKE_VERSION)
    assert dict(manifest.terms) == {"lichtfeld.commit": FAKE_COMMIT}
    assert manifest.position.step == 1500
    assert manifest.payload is not None
    assert [e.path for e in manifest.payload] == ["checkpoint_1500.resume"]
    assert verify(url).files == 1


def test_pack_of_a_project_without_snapshots_is_one_error_line(tmp_path: Path) -> None:
    proc = cli("pack", str(tmp_path), str(tmp_path / "x.rp"), "--adapter", "lichtfeld")
    assert proc.returncode == 2
    assert "no committed snapshot" in one_error_line(proc)


def test_import_prints_the_resume_command_and_exec_resumes_to_the_same_state(
    data: Path, project: Path, tmp_path: Path
) -> None:
    a = fake_adapter()
    # A run preempted by SIGTERM after its snapshot at step 1000 (of 2000).
    out = tmp_path / "preempted"
    command = a.build_command(
        data, out, iterations=2000, checkpoint_every=500, extra=["--step-delay", "0.002"]
    )
    with a.run(command, out) as trainer:
        while (snap := trainer.next_snapshot(WAIT)) is not None and snap.step < 1000:
            pass
        trainer.terminate()
        assert trainer.wait(WAIT) == SIGTERM_EXIT
    assert not (out / "splat_2000.ply").exists()
    url = str(tmp_path / "store" / "preempted.rp")
    # Packed with this machine's view of its data: --exec gates the resume strictly, and the
    # data digest of the trainer's own -d must match.
    proc = cli(
        "pack", str(out), url, "--adapter", "lichtfeld", "--adapter-option",
        f"binary={FAKE_BINARY}", "--data", str(data),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    step = read_manifest(url).position.step
    assert step >= 1000

    # Machine B: import, print the resume command.
    resumed = tmp_path / "resumed"
    base = [*FAKE, "--headless", "-d", str(data), "-o", str(resumed)]
    dest = tmp_path / "restored"
    proc = cli(
        "import",
        url,
        str(dest),
        "--adapter",
        "lichtfeld",
        "--adapter-option",
        f"binary={FAKE_BINARY}",
        "--",
        *base,
    )
    assert proc.returncode == 0, proc.stderr
    checkpoint = dest / f"checkpoint_{step}.resume"
    expected = [*base, "--resume", str(checkpoint), "--export=ply"]
    assert proc.stdout.strip().splitlines()[-1] == shlex.join(expected)
    assert checkpoint.is_file()

    # --exec: the trainer resumes from the checkpoint and finishes where an uninterrupted
    # run finishes, bit for bit.
    dest2 = tmp_path / "restored-exec"
    proc = cli(
        "import",
        url,
        str(dest2),
        "--adapter",
        "lichtfeld",
        "--adapter-option",
        f"binary={FAKE_BINARY}",
        "--exec",
        "--",
        *base,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"iter {step})" in proc.stdout  # "Checkpoint loaded: ... iter STEP)"
    final = resumed / "splat_2000.ply"
    assert final.read_bytes() == (project / "splat_2000.ply").read_bytes()
