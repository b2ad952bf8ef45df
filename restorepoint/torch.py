"""restorepoint.torch: resumable training loops for plain PyTorch (extra ``restorepoint[torch]``).

The public face of the runtime (restorepoint.runtime); see docs/adapters.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    import torch as _torch  # noqa: F401 - the extra's presence, checked once
except ImportError as exc:  # pragma: no cover - exercised without torch
    from .errors import MissingExtra

    raise MissingExtra("torch", "torch", "restorepoint.torch") from exc

from .runtime.contract import EXIT_RESUMABLE
from .runtime.data import EpochSampler
from .runtime.run import ResumableRun, run_id_for

__all__ = ["EXIT_RESUMABLE", "EpochSampler", "ResumableRun", "load_snapshot", "run_id_for"]


def load_snapshot(path: str | os.PathLike[str]) -> Any:
    """The state a runtime snapshot holds (``last.pt``, or a rank's ``last.rankN.pt`` with the
    shared state it names merged in), without the runtime: a dict with ``objects`` (each
    tracked object's state dict), ``rng``, ``position``, ``config`` and the run's identity.

    A snapshot file is parsed as JSON and safetensors (spec section 26); no unpickler runs.
    A snapshot of an older release (torch.save) goes through the weights-only loader, which
    refuses (UnsafeCheckpoint) anything but tensors and plain data."""
    from .runtime.state import load_state

    return load_state(Path(path))
