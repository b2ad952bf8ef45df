"""What a snapshot holds, and how it is written: the tracked objects' state dicts and the RNG
states copied to CPU memory (the only pause of training), saved with torch.save to a temporary
file, fsynced and renamed over ``last.pt`` (a kill leaves the old file or the new one)."""

from __future__ import annotations

import copy
import os
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._posix import fsync_dir

__all__ = ["STATE_FORMAT", "rng_state", "save_state", "set_rng", "to_cpu"]

STATE_FORMAT = "restorepoint.torch/1"


def to_cpu(value: Any) -> Any:
    """A deep copy with every tensor copied to CPU memory: what a snapshot pauses for."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(v) for v in value)
    return copy.deepcopy(value)


def rng_state() -> dict[str, Any]:
    """Python's, numpy's (when imported), torch's and CUDA's (when present) RNG states."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(state: Mapping[str, Any], target: Path, scratch: Path) -> None:
    """torch.save to a temporary file in ``scratch`` (on the same file system, outside the
    checkpoints a pack may be reading), fsync, rename over ``target``, fsync of its
    directory."""
    tmp = scratch / f".{target.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(dict(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)
