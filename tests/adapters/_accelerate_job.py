"""A small Accelerate training loop with restorepoint's helper (restorepoint.adapters.accelerate):
what the tests run alone, under ``accelerate launch`` with two CPU processes (gloo), and under
``restorepoint run``. Each step draws its batch from a generator of (step, process) and its
noise from the global RNG, so a resume is bit for bit only when the RNG states come back.

    python _accelerate_job.py --dir DIR --out OUT [--store S] [--run R] [--steps N] [--lr LR]
                              [--publish-every K] [--step-delay S]

Prints ``start N`` once resumed (0 when fresh), ``step N`` after each step, and writes
``OUT-RANK.pt`` (the model, the optimizer state, the RNG state) at the end.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from restorepoint.adapters.accelerate import AccelerateRun
from restorepoint.testing.process import exit_after


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--store")
    parser.add_argument("--run")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--publish-every", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    config = {"lr": args.lr, "model": "mlp-4-8-2", "steps": args.steps}

    with AccelerateRun(
        accelerator, args.dir, store=args.store, run=args.run, config=config, operational=["steps"]
    ) as rp:
        position = rp.resume()
        start = position.step if position is not None else 0
        print(f"start {start}", flush=True)
        rank = accelerator.process_index
        for step in range(start, args.steps):
            batch = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(16, 4, generator=batch) + 0.1 * torch.randn(16, 4)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            print(f"step {step + 1}", flush=True)
            if args.publish_every and (step + 1) % args.publish_every == 0:
                rp.publish(step=step + 1)
            time.sleep(args.step_delay)
            rp.check(step=step + 1)  # a stop: publish, exit 42; SIGUSR1: publish
    state = {
        "model": accelerator.unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
    }
    torch.save(state, f"{args.out}-{accelerator.process_index}.pt")
    # Both ranks at the teardown together. The abort a clean-clone run once saw here (rank 0,
    # SIGABRT after its work) was gloo's run loop during the interpreter's finalization: the
    # process ends through exit_after, which skips it (restorepoint.testing.process).
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    exit_after(main)
