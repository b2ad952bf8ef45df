"""The PreemptionCallback with retention by metric (spec 4.3, 19.5): each restore point it
publishes records the monitored value (a ModelCheckpoint's monitor, with its mode), and its
prune keeps the best k beside the newest n. A real Lightning Trainer on the CPU."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch", reason="needs the lightning extra")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from restorepoint import UsageError, list_store  # noqa: E402
from restorepoint.adapters.lightning import PreemptionCallback  # noqa: E402
from restorepoint.ops.store import entry_head  # noqa: E402
from restorepoint.storage import resolve  # noqa: E402

from .test_lightning import Regression, data, trainer_for  # noqa: E402
from .test_lightning import pytestmark as lightning_marks  # noqa: E402

pytestmark = [
    *lightning_marks,
    # Validation here has a loader of its own, small on purpose.
    pytest.mark.filterwarnings("ignore:The 'val_dataloader' does not have many workers"),
]


class Validated(Regression):
    """Regression with a validation loss, logged as val_loss."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(data(), batch_size=16, shuffle=False)


class Snapshots(pl.Callback):
    """Asks for a snapshot (SIGUSR1) at step 3, before any validation, and at every epoch's
    end, after its validation; records val_loss as the trainer had it each time."""

    def __init__(self) -> None:
        self.seen: dict[int, float | None] = {}

    def _ask(self, trainer: pl.Trainer) -> None:
        value = trainer.callback_metrics.get("val_loss")
        self.seen[trainer.global_step] = None if value is None else float(value)
        os.kill(os.getpid(), signal.SIGUSR1)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 3:
            self._ask(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ask(trainer)


@pytest.fixture(autouse=True)
def _clean_signals() -> Any:
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    torch.set_num_threads(1)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_the_monitored_value_is_recorded_and_the_best_kept(tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    # mode max: the worst loss is "best", so the best is not simply the newest.
    monitor = ModelCheckpoint(dirpath=tmp_path / "mc", monitor="val_loss", mode="max")
    callback = PreemptionCallback(
        tmp_path / "ckpt", store=store, run="r1", keep_last=1, keep_best=1, level=0
    )
    asks = Snapshots()
    trainer = trainer_for(tmp_path, 3, callback, monitor, asks)
    trainer.fit(Validated())
    assert callback.keep_best is not None
    assert (callback.keep_best.metric, callback.keep_best.mode) == ("val_loss", "max")
    packed = [e["step"] for e in callback.events if e["event"] == "packed"]
    assert packed == sorted(asks.seen) and len(packed) == 4  # step 3, and 3 epoch ends
    assert asks.seen[3] is None  # no validation yet: that restore point has no val_loss
    location = resolve(store)
    heads = {
        e.step: entry_head(location.join(e.name), e).metrics for e in list_store(store, run="r1")
    }
    scored = {s: v for s, v in asks.seen.items() if v is not None}
    best = max(scored, key=lambda s: scored[s])
    newest = max(asks.seen)
    assert set(heads) == {best, newest}
    for step, metrics in heads.items():
        assert math.isclose(metrics["val_loss"], scored[step], rel_tol=1e-6)


def test_keep_best_without_a_metric_or_a_monitor_is_refused(tmp_path: Path) -> None:
    callback = PreemptionCallback(tmp_path / "ckpt", store=f"{tmp_path}/s/", run="r", keep_best=2)
    with pytest.raises(UsageError, match="metric= NAME"):
        trainer_for(tmp_path, 1, callback).fit(Validated())
