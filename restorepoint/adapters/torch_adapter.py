"""The adapter for restorepoint.torch runs (ResumableRun)."""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import MissingExtra
from ..format import Manifest, Position, Trainer
from ..ops.gate import Expectations
from ..ops.local_view import DATA_KEY, cache_root_from_env, data_digest
from .base import Snapshot, TrainerInfo, send_signal

try:
    import torch  # noqa: F401 - the extra's presence
except ImportError as exc:  # pragma: no cover - exercised without torch
    raise MissingExtra("torch", "torch", "the torch adapter") from exc


class TorchAdapter:
    """Plain PyTorch loops on restorepoint.torch.ResumableRun (a run directory)."""

    name = "torch"

    def __init__(self, signal_name: str = "SIGUSR1") -> None:
        self.snapshot_signal = int(getattr(signal, signal_name))

    def trainer(self) -> TrainerInfo:
        from ..runtime.detect import torch_terms

        return TrainerInfo("restorepoint.torch", __version__, torch_terms())

    def local_view(
        self,
        config: Mapping[str, Any] | None = None,
        data: Path | None = None,
        *,
        cache_root: str | None = None,
        command: Sequence[str] = (),
    ) -> Expectations:
        """The runtime's default trainer (a run that names its own is given ``--trainer``),
        the torch and CUDA terms detected here, the cache root given or in
        ``$RESTOREPOINT_CACHE_ROOT``, the data digest of ``data`` as the cache key ``data``,
        and the config. A ResumableRun compares its own local view again when it resumes."""
        from ..runtime.detect import TORCH_TERMS_SOURCE

        info = self.trainer()
        values: dict[str, Any] = {
            "trainer": Trainer(info.name, info.version),
            "terms": dict(info.terms),
        }
        sources = {"trainer": "detected: restorepoint.torch (default)", "terms": TORCH_TERMS_SOURCE}
        root = cache_root if cache_root is not None else cache_root_from_env()
        if root is not None:
            values["cache_root"] = root
            sources["cache_root"] = (
                "--cache-root" if cache_root is not None else "RESTOREPOINT_CACHE_ROOT"
            )
        if data is not None:
            values["cache_keys"] = {DATA_KEY: data_digest(data)}
            sources["cache_keys"] = "computed: data digest of --data"
        if config is not None:
            values["config"] = dict(config)
            sources["config"] = "--config"
        return Expectations(**values, sources=sources)

    def request_snapshot(self, pid: int) -> None:
        send_signal(pid, self.snapshot_signal)

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """``workdir`` is a run directory: its checkpoints/ hold the newest committed snapshot
        (last.pt, renamed into place only when complete, and its position)."""
        from ..runtime.contract import CHECKPOINTS, POSITION_FILE

        checkpoints = workdir / CHECKPOINTS
        try:
            position = json.loads((checkpoints / POSITION_FILE).read_text())
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
