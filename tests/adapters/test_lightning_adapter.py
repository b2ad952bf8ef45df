"""The Lightning adapter against the adapter conformance suite: the snapshot is a last.ckpt that
a real Trainer saved through the preemption callback on a real signal."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from restorepoint import pack
from restorepoint.adapters.base import Adapter, load_adapter
from restorepoint.format import Position
from restorepoint.testing.adapter import AdapterConformance

from . import test_lightning
from .test_lightning import Regression, SignalAt, ckpt_step, trainer_for

pytestmark = test_lightning.pytestmark  # Lightning's known warnings
PREEMPTED_AT = 5


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from restorepoint.adapters.lightning import PreemptionCallback

    root = tmp_path_factory.mktemp("lightning-runs")
    ckpt = root / "checkpoints"
    before = signal.getsignal(signal.SIGUSR2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        callback = PreemptionCallback(ckpt, signal="USR2", stop=False)
        trainer_for(root, 1, callback, SignalAt(step=PREEMPTED_AT)).fit(Regression())
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGUSR2, before)
    assert ckpt_step(ckpt / "last.ckpt") == PREEMPTED_AT
    return ckpt


class TestLightningAdapter(AdapterConformance):
    @pytest.fixture
    def adapter(self) -> Adapter:
        return load_adapter("lightning")

    @pytest.fixture
    def produced(self, checkpoint_dir: Path) -> Path:
        return checkpoint_dir

    @pytest.fixture
    def expected_step(self) -> int:
        return PREEMPTED_AT


def test_the_run_directory_is_enough(checkpoint_dir: Path) -> None:
    """Lightning's default layout: ROOT/checkpoints/last.ckpt, found from ROOT."""
    snap = load_adapter("lightning").newest_snapshot(checkpoint_dir.parent)
    assert snap is not None
    assert snap.root == checkpoint_dir and snap.files == ("last.ckpt",)
    assert snap.position == Position(PREEMPTED_AT, 0)


def test_an_uncommitted_save_is_not_a_snapshot(tmp_path: Path, checkpoint_dir: Path) -> None:
    (tmp_path / "last.ckpt.preempt").write_bytes((checkpoint_dir / "last.ckpt").read_bytes())
    adapter = load_adapter("lightning")
    assert adapter.newest_snapshot(tmp_path) is None
    (tmp_path / "last.ckpt").write_bytes(b"not a checkpoint")
    assert adapter.newest_snapshot(tmp_path) is None


def test_options_and_the_resume_command(tmp_path: Path, checkpoint_dir: Path) -> None:
    adapter = load_adapter("lightning", signal_name="SIGUSR1")
    assert getattr(adapter, "snapshot_signal") == signal.SIGUSR1  # noqa: B009
    info = adapter.trainer()
    assert info.name == "lightning" and set(info.terms) == {"lightning", "torch"}
    assert info.terms["lightning"] == info.version
    url = str(tmp_path / "snapshot.rp")
    manifest = pack(checkpoint_dir, url, position=PREEMPTED_AT, include=["last.ckpt"]).manifest
    assert adapter.resume_command(tmp_path, manifest, ["train.py", "fit"]) == [
        "train.py",
        "fit",
        "--ckpt_path",
        str(tmp_path / "last.ckpt"),
    ]
