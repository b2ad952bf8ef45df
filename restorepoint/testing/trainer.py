"""A small, real PyTorch trainer on the ResumableRun contract, for the demo and the tests.

    python -m restorepoint.testing.trainer --root RUNS --out FINAL.pt [--store URL] [--epochs N]
        [--lr LR] [--data DIR] [--cache-root P] [--marker FILE] [--accept-older] [--keep-last N]
        [--no-auto-resume]

It trains an MLP with dropout, Adam, a step scheduler and gradient accumulation over a shuffled
synthetic data set, on the CPU, deterministically (one thread). It prints ``step N`` after every
committed effective batch, so that a test or the demo can send it a real signal at a chosen
step; SIGTERM makes it snapshot and exit 42, SIGUSR1 makes it snapshot and train on. At the end
it saves the final model and optimizer state to ``--out``.

``--lr`` changes the config (and so the run's identity); ``--data DIR`` makes the data digest of
DIR its cache key ``data``; ``--cache-root`` its cache root; ``--marker FILE`` is written once
``resume()`` has returned, just before the first step: a test knows from it whether training
started at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..ops.local_view import DATA_KEY, data_digest
from ..runtime.run import ResumableRun

__all__ = ["CONFIG", "OPERATIONAL", "TRAINER", "main", "train"]

CONFIG: dict[str, Any] = {
    "model": {"hidden": 64, "dropout": 0.1, "inputs": 32},
    "optimizer": {"lr": 0.01},
    "scheduler": {"step_size": 20, "gamma": 0.9},
    "data": {"samples": 1024, "batch_size": 16, "accumulate": 2, "seed": 1234},
    "epochs": 3,
    "seed": 7,
    "train": {"checkpoint_every": 0},
}
OPERATIONAL = ["train.checkpoint_every", "epochs"]
#: The trainer the demo's restore points record.
TRAINER = ("restorepoint-demo-mlp", "1")


def dataset(config: dict[str, Any]) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(config["data"]["seed"])
    x = torch.randn(config["data"]["samples"], config["model"]["inputs"], generator=g)
    w = torch.randn(config["model"]["inputs"], 1, generator=g)
    y = (x @ w + 0.1 * torch.randn(x.shape[0], 1, generator=g) > 0).float()
    return torch.utils.data.TensorDataset(x, y)


def train(  # noqa: PLR0913 - the test trainer's knobs, each a keyword the tests set
    root: Path,
    out: Path,
    *,
    store: str | None = None,
    epochs: int | None = None,
    config: dict[str, Any] | None = None,
    print_steps: bool = True,
    step_delay: float = 0.0,
    lr: float | None = None,
    data_dir: Path | None = None,
    cache_root: str | None = None,
    marker: Path | None = None,
    accept_older: bool = False,
    keep_last: int | None = None,
    auto_resume: bool = True,
) -> int:
    """Run (or resume) training to the end; returns the number of steps trained here."""
    config = json.loads(json.dumps(config or CONFIG))
    if epochs is not None:
        config["epochs"] = epochs
    if lr is not None:
        config["optimizer"]["lr"] = lr
    cache_keys = {DATA_KEY: data_digest(data_dir)} if data_dir is not None else None
    torch.set_num_threads(1)
    data = dataset(config)
    with ResumableRun(
        config,
        root=root,
        store=store,
        operational=OPERATIONAL,
        snapshot_every="train.checkpoint_every",
        trainer=TRAINER,
        cache_keys=cache_keys,
        cache_root=cache_root,
        accept_older=accept_older,
        keep_last=keep_last,
        auto_resume=auto_resume,
    ) as run:
        torch.manual_seed(run.seed)
        m = config["model"]
        model = torch.nn.Sequential(
            torch.nn.Linear(m["inputs"], m["hidden"]),
            torch.nn.ReLU(),
            torch.nn.Dropout(m["dropout"]),
            torch.nn.Linear(m["hidden"], 1),
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=config["optimizer"]["lr"])
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, config["scheduler"]["step_size"], config["scheduler"]["gamma"]
        )
        run.track(model=model, optimizer=optimizer, scheduler=scheduler)
        start = run.resume().step
        if marker is not None:
            marker.write_text(f"training from step {start}\n")
        batch, accumulate = config["data"]["batch_size"], config["data"]["accumulate"]
        for _epoch in run.epochs(config["epochs"]):
            loader = run.dataloader(data, batch, accumulate)
            for group in run.effective_batches(loader, accumulate):
                for x, y in group:
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
                    (loss / len(group)).backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                if step_delay:
                    time.sleep(step_delay)
                run.commit()
                if print_steps:
                    print(f"step {run.step}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
        return run.step - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="runs directory")
    parser.add_argument("--out", type=Path, required=True, help="where the final state goes")
    parser.add_argument("--store", help="store URL for restore points")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per step")
    parser.add_argument("--quiet", action="store_true", help="do not print every step")
    parser.add_argument("--lr", type=float, help="the optimizer's learning rate (the config's)")
    parser.add_argument("--data", type=Path, help="data directory: its digest is a cache key")
    parser.add_argument("--cache-root", help="the run's cache root")
    parser.add_argument("--marker", type=Path, help="written when training starts")
    parser.add_argument("--accept-older", action="store_true", help="see ResumableRun")
    parser.add_argument("--keep-last", type=int, help="prune the run after each publish")
    parser.add_argument(
        "--no-auto-resume", action="store_true", help="ResumableRun(auto_resume=False)"
    )
    args = parser.parse_args(argv)
    train(
        args.root,
        args.out,
        store=args.store,
        epochs=args.epochs,
        print_steps=not args.quiet,
        step_delay=args.step_delay,
        lr=args.lr,
        data_dir=args.data,
        cache_root=args.cache_root,
        marker=args.marker,
        accept_older=args.accept_older,
        keep_last=args.keep_last,
        auto_resume=not args.no_auto_resume,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
