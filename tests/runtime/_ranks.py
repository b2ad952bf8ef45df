"""Rank processes of tests/runtime/_trainer_variants.py's DDP trainer, over gloo with a file://
rendezvous (no port to choose): every rank of one job run to its end."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import _trainer_variants as tv

SCRIPT = Path(tv.__file__)


@dataclass
class Rank:
    code: int
    out: list[str]
    err: str


def launch(
    workdir: Path,
    tag: str,
    *args: str,
    world: int = 2,
    env: dict[str, str] | None = None,
    per_rank_root: bool = False,
) -> list[Rank]:
    """Run every rank of one job; ``--out`` of rank r is workdir/TAG-r.pt. ``per_rank_root``:
    each rank its own node directory under ``--root`` (nothing shared but the store)."""
    base = dict(env if env is not None else os.environ)
    base.pop("SUBMITIT_PREEMPT_SIGNAL", None)
    if Path("/sys/class/net/lo").exists():
        # gloo picks an interface by the host name otherwise, which need not resolve.
        base["GLOO_SOCKET_IFNAME"] = "lo"
    init = f"file://{workdir / f'rendezvous-{tag}'}"
    procs = []
    for r in range(world):
        cmd = [sys.executable, str(SCRIPT), "ddp", "--rank", str(r), "--world", str(world),
               "--out", str(workdir / f"{tag}-{r}.pt"), *args]  # fmt: skip
        if per_rank_root:
            cmd.append("--root-per-rank")
        if world > 1:
            cmd += ["--init", init]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base
            )
        )
    ranks = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            ranks.append(Rank(p.returncode, out.splitlines(), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return ranks


def final(workdir: Path, tag: str, rank: int) -> dict[str, Any]:
    return torch.load(workdir / f"{tag}-{rank}.pt", weights_only=False)  # type: ignore[no-any-return]
