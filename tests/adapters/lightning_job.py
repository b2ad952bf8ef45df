"""A Lightning job as a user writes one, without submitit: the tests run it as a process and
signal it (tests/adapters/test_lightning_stop.py, tests/slurm/test_slurm_lightning.py).

    python lightning_job.py --ckpt DIR [--store URL] [--lr LR] [--epochs N] [--step-delay S]
                            [--standin FILE] [--no-stop]

It prints ``step N`` after each training step and ``done N`` at the end (stdout, flushed).
``--standin FILE``: a stand-in for submitit's requeue handler is installed on SIGUSR2 before
the Trainer (a real earlier handler): it appends a line to FILE and exits 17. Without
``--store`` the callback takes ``$RESTOREPOINT_STORE`` (``restorepoint run``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from restorepoint.adapters.lightning import PreemptionCallback, resume_checkpoint

STEPS_PER_EPOCH = 8


class Regression(pl.LightningModule):
    def __init__(self, lr: float, delay: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.lr, self.delay = lr, delay

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.delay)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        print(f"step {self.trainer.global_step}", flush=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


def standin(record: Path) -> Any:
    def requeue(signum: int, frame: Any) -> None:
        last = ARGS.ckpt / "last.ckpt"
        step = torch.load(last, weights_only=False)["global_step"] if last.exists() else None
        with record.open("a") as f:
            f.write(f"called {signal.Signals(signum).name} last.ckpt step {step}\n")
        sys.exit(17)

    return requeue


def main() -> None:
    torch.set_num_threads(1)
    config = {"lr": ARGS.lr, "epochs": ARGS.epochs}
    if ARGS.standin is not None:
        signal.signal(signal.SIGUSR2, standin(ARGS.standin))
    # Before the Trainer, so that a refusal is the only line on stderr.
    start = resume_checkpoint(ARGS.ckpt, store=ARGS.store, config=config)
    callback = PreemptionCallback(
        ARGS.ckpt, store=ARGS.store, config=config, stop=not ARGS.no_stop, keep_last=5
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=ARGS.epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=ARGS.ckpt.parent,
        callbacks=[callback],
    )
    print(f"start {os.getpid()} from {start}", flush=True)
    trainer.fit(Regression(ARGS.lr, ARGS.step_delay), ckpt_path=start, weights_only=True)
    print(f"done {trainer.global_step}", flush=True)


parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", type=Path, required=True)
parser.add_argument("--store")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--step-delay", type=float, default=0.2)
parser.add_argument("--standin", type=Path)
parser.add_argument("--no-stop", action="store_true")
ARGS = parser.parse_args()

if __name__ == "__main__":
    main()
