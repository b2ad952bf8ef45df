"""The adapter for restorepoint.torch runs (ResumableRun)."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..errors import MissingExtra
from ..format import Manifest, Position
from .base import Snapshot, TrainerInfo, send_signal

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised without torch
    raise MissingExtra("torch", "torch", "the torch adapter") from exc


class TorchAdapter:
    """Plain PyTorch loops on restorepoint.torch.ResumableRun (a run directory)."""

    name = "torch"

    def __init__(self, signal_name: str = "SIGUSR1") -> None:
        self.snapshot_signal = int(getattr(signal, signal_name))

    def trainer(self) -> TrainerInfo:
        terms = {"torch": torch.__version__.split("+")[0]}
        if torch.version.cuda:
            terms["cuda"] = str(torch.version.cuda)
        return TrainerInfo("restorepoint.torch", __version__, terms)

    def request_snapshot(self, pid: int) -> None:
        send_signal(pid, self.snapshot_signal)

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """``workdir`` is a run directory: its checkpoints/ hold the newest committed snapshot
        (last.pt, renamed into place only when complete, and its position)."""
        checkpoints = workdir / "checkpoints"
        try:
            position = json.loads((checkpoints / "position.json").read_text())
        except (OSError, ValueError):
            return None
        files = tuple(sorted(p.name for p in checkpoints.iterdir() if p.is_file()))
        if not any(name.startswith("last") and name.endswith(".pt") for name in files):
            return None
        return Snapshot(
            checkpoints,
            files,
            Position(position["step"], position.get("epoch"), position.get("batch")),
        )

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """A ResumableRun resumes by itself from its run directory: the same command, once the
        restore point is unpacked as that directory's checkpoints/."""
        return list(base)
