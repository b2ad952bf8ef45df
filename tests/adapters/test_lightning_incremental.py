"""Incremental restore points (spec section 28) through a real Lightning Trainer on moto's S3: a
frozen-backbone fine-tune (90% of the parameters frozen) whose PreemptionCallback publishes
``last.ckpt`` at each snapshot signal with ``incremental=True`` uploads at most 12% of a full
restore point each time, and the newest resumes bit for bit elsewhere."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from restorepoint import list_store, read_manifest
from restorepoint.adapters.lightning import PreemptionCallback, resume_checkpoint
from restorepoint.format.delta import DELTA_FEATURE
from restorepoint.ops.publish import HeadSpec, PackOptions, publish

pytestmark = [
    pytest.mark.s3,
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:The '.*' does not have many workers"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used"),
]

WIDTH = 512  # each Linear: 1 MiB of float32 weights
FROZEN_LAYERS = 9  # and one trained head: 90% of the parameters frozen
STEPS_PER_EPOCH = 8
EVERY = 4  # a snapshot signal every EVERY steps


class FrozenBackbone(pl.LightningModule):
    """Nine frozen layers and a trained head, plain SGD (no optimizer state beside the
    weights): a fine-tune whose checkpoint changes only in the head."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.backbone = torch.nn.Sequential(
            *(torch.nn.Linear(WIDTH, WIDTH) for _ in range(FROZEN_LAYERS))
        )
        self.backbone.requires_grad_(False)
        self.head = torch.nn.Linear(WIDTH, WIDTH)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(torch.tanh(self.backbone(x))), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, WIDTH, generator=g), torch.randn(64, WIDTH, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


class FullFineTune(FrozenBackbone):
    """The same layers, every one trained with Adam: nothing of a checkpoint is left in the
    next (the parameters and both moments change at every step)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.backbone.requires_grad_(True)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class SignalEvery(pl.Callback):
    """A snapshot signal at the end of every EVERY-th training step."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step % EVERY == 0:
            os.kill(os.getpid(), signal.SIGUSR2)


def trainer_for(root: Path, epochs: int, *callbacks: pl.Callback) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, default_root_dir=root, callbacks=list(callbacks),
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread_and_clean_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    before = signal.getsignal(signal.SIGUSR2)
    yield
    torch.set_num_threads(threads)
    signal.signal(signal.SIGUSR2, before)


def test_a_frozen_backbone_uploads_at_most_12_percent_and_resumes_bit_for_bit(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    config = {"lr": 0.01, "frozen_layers": FROZEN_LAYERS}
    store = f"s3://{s3_bucket}/runs/"
    options = s3_storage_options
    ckpt = tmp_path / "a" / "ckpt"
    callback = PreemptionCallback(
        ckpt, store=store, config=config, stop=False, storage_options=options, incremental=True
    )
    model = FrozenBackbone()
    frozen = sum(p.numel() for p in model.backbone.parameters())
    assert frozen / sum(p.numel() for p in model.parameters()) == pytest.approx(0.9)
    trainer_for(tmp_path / "a", 2, callback, SignalEvery()).fit(model)
    points = 2 * STEPS_PER_EPOCH // EVERY
    assert [e["event"] for e in callback.events] == ["saved", "packed"] * points

    entries = sorted(list_store(store, storage_options=options), key=lambda e: e.step)
    assert [e.step for e in entries] == [EVERY * (i + 1) for i in range(points)]
    # A full restore point of the same last.ckpt, for the comparison.
    full = publish(
        str(ckpt), f"s3://{s3_bucket}/full/",
        HeadSpec(position=entries[-1].step, run=callback.run),
        PackOptions(storage_options=options), include=["last.ckpt"],
    )  # fmt: skip
    # Random weights compress a little (zstd), the same in both.
    assert full.pack.size > 0.5 * FROZEN_LAYERS * WIDTH * WIDTH * 4
    assert read_manifest(entries[0].url, storage_options=options).bases == ()
    ratios = [round(e.size / full.pack.size, 4) for e in entries[1:]]
    print(f"bytes per incremental restore point / a full one: {ratios}")
    for entry in entries[1:]:
        assert entry.size <= 0.12 * full.pack.size, (entry.step, entry.size, full.pack.size)
        manifest = read_manifest(entry.url, storage_options=options)
        assert [b.name for b in manifest.bases or ()] == [entries[0].name]

    # Resumed elsewhere from the newest: last.ckpt bit for bit, and a Trainer restores it.
    elsewhere = tmp_path / "b" / "ckpt"
    path = resume_checkpoint(elsewhere, store, config=config, storage_options=options)
    assert path == str(elsewhere / "last.ckpt")
    assert (elsewhere / "last.ckpt").read_bytes() == (ckpt / "last.ckpt").read_bytes()
    resumed = FrozenBackbone(seed=1)  # other weights: everything comes from last.ckpt
    trainer = trainer_for(tmp_path / "b", 2)
    trainer.fit(resumed, ckpt_path=path, weights_only=True)
    assert trainer.global_step == entries[-1].step
    want, got = model.state_dict(), resumed.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_the_callback_pickles_with_its_rest(tmp_path: Path) -> None:
    # Lightning pickles the trainer's callbacks for ddp_spawn: the callback's rest (spec 28.4)
    # goes with it, count and all, with a lock of its own.
    import pickle

    callback = PreemptionCallback(dirpath=tmp_path, config={"lr": 1}, store=f"{tmp_path}/s/")
    callback._rest.start(f"{tmp_path}/s/", "r")
    copy = pickle.loads(pickle.dumps(callback))
    assert copy._rest.take(f"{tmp_path}/s/", "r") == callback._rest.length


@pytest.mark.parametrize("module", [FullFineTune, FrozenBackbone])
def test_a_full_fine_tunes_first_restore_point_names_no_chunks(
    tmp_path: Path, module: type[FrozenBackbone]
) -> None:
    # The callback tells its rest what the Trainer's optimizers step (spec 28.4): a full
    # fine-tune's first restore point, into a store that holds nothing of the run, names no
    # chunks (no sha256 of each chunk for references nothing would make), and its next rests
    # too; a frozen backbone's first names them, and its next references it.
    store = f"{tmp_path / 'store'}/"
    callback = PreemptionCallback(
        tmp_path / "ckpt", store=store, config={"module": module.__name__}, stop=False
    )
    trainer_for(tmp_path, 1, callback, SignalEvery()).fit(module())
    entries = sorted(list_store(store), key=lambda e: e.step)
    assert [e.step for e in entries] == [EVERY, 2 * EVERY]
    first, second = (read_manifest(e.url) for e in entries)
    trained = module is FullFineTune
    assert (DELTA_FEATURE in first.required_features) is not trained
    if trained:
        assert DELTA_FEATURE not in second.required_features
    else:
        assert [b.name for b in second.bases or ()] == [entries[0].name]
