"""bench_torch.py --container: the snapshot file (safetensors + canonical JSON) against
torch.save / torch.load of the same state, on the real-weights corpus (all-MiniLM-L6-v2's
state dict and an Adam state of it) and on model + Adam state of ``--state-mb`` (default
about 1 GiB).

Measured per round, in an order shuffled from round to round, each file written to and read
from ``--workdir`` (page cache warm for both, as on a resume right after an import):

- pause: the copy of the live state to CPU memory that a snapshot pauses training for
  (``to_cpu``, the same for both: it is what either writer is then given);
- save: the background write of that copy to a new file: ``save_state`` (the snapshot file,
  fsync, rename) against ``torch.save`` to a file + fsync;
- load: what a resume does, to the state dict in memory: ``load_state`` (parse, check, read
  each tensor into memory of its own) against ``torch.load(weights_only=True)`` and against
  the legacy loader (the scan, then the same torch.load);
- resume: load, then ``load_state_dict`` into the model and the optimizer (every byte read).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _time(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _real_trainer() -> tuple[Any, Any]:
    """all-MiniLM-L6-v2's weights in a module of their own shapes, with Adam's moments."""
    import torch

    from restorepoint.testing.weights import safetensors_state_dict

    weights = safetensors_state_dict()
    model = torch.nn.Module()
    for i, t in enumerate(weights.values()):
        model.register_parameter(f"p{i}", torch.nn.Parameter(t.float(), requires_grad=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return model, optimizer


def _synthetic_trainer(state_mb: float) -> tuple[Any, Any]:
    from bench_torch import build, layers_for

    trainer = build(layers_for(state_mb), 8)
    for _ in range(2):
        trainer.step()
    return trainer.model, trainer.optimizer


def measure(model: Any, optimizer: Any, workdir: Path, repeat: int) -> dict[str, Any]:
    import torch

    from restorepoint.runtime.safe_load import safe_load
    from restorepoint.runtime.state import load_state, save_state, to_cpu

    workdir.mkdir(parents=True, exist_ok=True)
    new, old = workdir / "last.pt", workdir / "torch-save.pt"
    times: dict[str, list[float]] = {k: [] for k in (
        "pause", "save_new", "save_torch", "load_new", "load_torch", "load_legacy",
        "resume_new", "resume_torch")}  # fmt: skip

    def live() -> dict[str, Any]:
        return {"objects": {"model": model.state_dict(), "optimizer": optimizer.state_dict()}}

    def save_torch(state: dict[str, Any]) -> None:
        with open(old, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def resume(state: dict[str, Any]) -> None:
        model.load_state_dict(state["objects"]["model"])
        optimizer.load_state_dict(state["objects"]["optimizer"])

    copy: dict[str, Any] = {}
    for r in range(repeat):
        times["pause"].append(_time(lambda: copy.update(to_cpu(live()))))
        steps: dict[str, Callable[[], Any]] = {
            "save_new": lambda: save_state(copy, new, workdir),
            "save_torch": lambda: save_torch(copy),
        }
        order = list(steps)
        random.Random(r).shuffle(order)
        for name in order:
            # Each save writes a new file: replacing the last round's (freeing its 1 GiB of
            # blocks and pages) is not what is compared, and one writer would pay it by a
            # rename, the other by a truncation.
            (new if name == "save_new" else old).unlink(missing_ok=True)
            times[name].append(_time(steps[name]))
        loads: dict[str, Callable[[], Any]] = {
            "load_new": lambda: load_state(new),
            "load_torch": lambda: torch.load(old, map_location="cpu", weights_only=True),
            "load_legacy": lambda: safe_load(old),
            "resume_new": lambda: resume(load_state(new)),
            "resume_torch": lambda: resume(torch.load(old, map_location="cpu", weights_only=True)),
        }
        order = list(loads)
        random.Random(100 + r).shuffle(order)
        for name in order:
            times[name].append(_time(loads[name]))
    sizes = {"snapshot_file": new.stat().st_size, "torch_save": old.stat().st_size}
    new.unlink()
    old.unlink()
    return {
        "bytes": sizes,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "best_s": {k: min(v) for k, v in times.items()},
    }


def run(state_mb: float, workdir: Path, repeat: int) -> dict[str, Any]:
    """Both corpora; the numbers of each."""
    out: dict[str, Any] = {"load_start": list(os.getloadavg())}
    model, optimizer = _real_trainer()
    out["real"] = measure(model, optimizer, workdir / "container-real", repeat)
    del model, optimizer
    model, optimizer = _synthetic_trainer(state_mb)
    out["synthetic"] = measure(model, optimizer, workdir / "container-synthetic", repeat)
    out["load_end"] = list(os.getloadavg())
    return out


ROWS = (
    ("pause", "pause: state copied to CPU (both)", "pause", None),
    ("save", "save: snapshot file vs torch.save (+fsync)", "save_new", "save_torch"),
    ("load", "load: load_state vs torch.load(weights_only)", "load_new", "load_torch"),
    ("legacy", "load: load_state vs legacy loader (scan+load)", "load_new", "load_legacy"),
    ("resume", "resume: load + load_state_dict", "resume_new", "resume_torch"),
)


def print_table(results: dict[str, Any]) -> None:
    for corpus in ("real", "synthetic"):
        r = results[corpus]
        mib = r["bytes"]["snapshot_file"] / 2**20
        print(f"\n{corpus}: snapshot file {mib:.0f} MiB, torch.save "
              f"{r['bytes']['torch_save'] / 2**20:.0f} MiB (median of rounds, best)")  # fmt: skip
        print(f"  {'':46} {'new (s)':>16} {'torch (s)':>16}")
        for _, label, a, b in ROWS:
            med, best = r["median_s"], r["best_s"]
            left = f"{med[a]:.3f} ({best[a]:.3f})"
            right = f"{med[b]:.3f} ({best[b]:.3f})" if b else ""
            print(f"  {label:46} {left:>16} {right:>16}")
    print(f"\nload average: {results['load_start']} -> {results['load_end']}")
