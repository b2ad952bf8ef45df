"""restorepoint.torch: resumable training loops for plain PyTorch (extra ``restorepoint[torch]``).

The public face of the runtime (restorepoint.runtime); see docs/adapters.md."""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - the extra's presence, checked once
except ImportError as exc:  # pragma: no cover - exercised without torch
    from .errors import MissingExtra

    raise MissingExtra("torch", "torch", "restorepoint.torch") from exc

from .runtime.contract import EXIT_RESUMABLE
from .runtime.data import EpochSampler
from .runtime.run import ResumableRun, run_id_for

__all__ = ["EXIT_RESUMABLE", "EpochSampler", "ResumableRun", "run_id_for"]
