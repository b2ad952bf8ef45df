"""One rank of tests/runtime/test_incremental_parts.py, over gloo on the CPU: a frozen-backbone
model of its own (each rank's weights differ, as a sharded state's do) on
ResumableRun(incremental=True) with a store, snapshotting every step (``train``; ``full``: every
layer trained with Adam), or a fresh resume (``resume``); either way it saves the model's state
to OUT and prints the step."""

from __future__ import annotations

import sys

import torch

from restorepoint.testing.process import exit_after
from restorepoint.torch import ResumableRun

CONFIG = {"seed": 0, "optimizer": {"lr": 0.01}}
WIDTH = 512  # each Linear: 1 MiB of float32 weights
POINTS = 4


def frozen_backbone(rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(rank)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(10)))
    net[:9].requires_grad_(False)  # nine frozen layers, one trained: 90%
    return net, torch.optim.SGD(net[9].parameters(), lr=0.01)


def full_fine_tune(rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same layers, every one trained with Adam (phase ``full``)."""
    net, _ = frozen_backbone(rank)
    net.requires_grad_(True)
    return net, torch.optim.Adam(net.parameters(), lr=1e-4)


def main(phase: str, rank: int, world: int, init: str, store: str, root: str, out: str) -> int:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        net, opt = (full_fine_tune if phase == "full" else frozen_backbone)(rank)
        data = torch.Generator().manual_seed(1 + rank)
        with ResumableRun(
            CONFIG, root=root, store=store, snapshot_every=1, final_snapshot=False,
            incremental=True,
        ) as run:  # fmt: skip
            run.track(model=net, optimizer=opt)
            start = run.resume().step
            for _ in range(POINTS if phase in ("train", "full") else 0):
                loss = net(torch.randn(8, WIDTH, generator=data)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                run.commit()
                run.wait()
            if rank == 0:
                assert [u["ok"] for u in run.uploads] == [True] * len(run.uploads), run.uploads
            torch.save(net.state_dict(), out)
            print(f"step {start} {run.step} {run.run_id}", flush=True)
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    phase, rank, world, init, store, root, out = sys.argv[1:8]
    exit_after(lambda: main(phase, int(rank), int(world), init, store, root, out))
