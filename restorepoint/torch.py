"""restorepoint.torch: resumable training loops for plain PyTorch (extra ``restorepoint[torch]``).

See restorepoint.adapters.torch_run and docs/adapters.md."""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - the extra's presence, checked once
except ImportError as exc:  # pragma: no cover - exercised without torch
    from .errors import MissingExtra

    raise MissingExtra("torch", "torch", "restorepoint.torch") from exc

from .adapters.torch_run import EXIT_RESUMABLE, EpochSampler, ResumableRun, run_id_for

__all__ = ["EXIT_RESUMABLE", "EpochSampler", "ResumableRun", "run_id_for"]
