"""The torch adapter against the adapter conformance suite, on a real ResumableRun."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from restorepoint.adapters.base import Adapter, load_adapter
from restorepoint.testing.adapter import AdapterConformance
from restorepoint.testing.trainer import CONFIG, train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-runs")
    config = {**CONFIG, "epochs": 1, "train": {"checkpoint_every": 10}}
    train(root, root / "final.pt", config=config, print_steps=False)
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


class TestTorchAdapter(AdapterConformance):
    @pytest.fixture
    def adapter(self) -> Adapter:
        return load_adapter("torch")

    @pytest.fixture
    def produced(self, run_dir: Path) -> Path:
        return run_dir

    @pytest.fixture
    def expected_step(self) -> int:
        # 1024 samples, batches of 16, 2 micro-batches per step: 32 steps; every 10th snapshots.
        return 30
