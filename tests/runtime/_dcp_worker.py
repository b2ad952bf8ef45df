"""One rank of the DCP test (tests/runtime/test_dcp.py): a sharded state (a DTensor, Shard(0),
over gloo on the CPU) saved with torch.distributed.checkpoint into this node's own directory and
published as this rank's part; or imported from the store into a fresh directory and loaded
back. ``load1`` loads it in one process, on another world size (DCP reshards)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from restorepoint.format import Trainer
from restorepoint.ops import Expectations, HeadSpec
from restorepoint.runtime.sharded import import_dcp, publish_dcp
from restorepoint.testing.process import exit_after

VIEW = Expectations(
    trainer=Trainer("dcp-test", "1"),
    terms={"torch": torch.__version__},
    cache_keys={},
    cache_root=None,
    config={"model": "dcp", "rows": 8},
)


def expected() -> torch.Tensor:
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(7))


def main(phase: str, rank: int, world: int, init: str, store: str, root: Path) -> int:
    node = root / f"node{rank}"
    if phase == "load1":
        dest = import_dcp(sys.argv[7], node / "import", views=[VIEW])
        state = {"w": torch.zeros(8, 4)}
        dcp.load(state, checkpoint_id=str(dest), no_dist=True)
        assert torch.equal(state["w"], expected()), "resharded load differs"
        print("files", " ".join(sorted(os.listdir(dest))))
        print("ok")
        return 0
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        mesh = DeviceMesh("cpu", list(range(world)))
        if phase == "save":
            state = {"w": distribute_tensor(expected(), mesh, [Shard(0)])}
            dcp.save(state, checkpoint_id=str(node / "dcp"))
            head = HeadSpec.from_view(VIEW, 12, run="dcp")
            # With keep_last: each rank reads its own part back, and the prune trusts it.
            print("url", publish_dcp(node / "dcp", store, head, keep_last=1))
        else:
            dest = import_dcp(sys.argv[7], node / "import", views=[VIEW])
            state = {"w": distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])}
            dcp.load(state, checkpoint_id=str(dest))
            assert torch.equal(state["w"].full_tensor(), expected()), "sharded load differs"
            print("files", " ".join(sorted(os.listdir(dest))))
        print("ok")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    a = sys.argv
    exit_after(lambda: main(a[1], int(a[2]), int(a[3]), a[4], a[5], Path(a[6])))
