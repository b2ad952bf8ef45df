"""Lightning as the supervisor drives it (``restorepoint run --adapter lightning``): the
trainer and its local view, the snapshot request (the preemption signal), the newest
``last.ckpt`` and the resume command. ``restorepoint.adapters.lightning`` is the public face
(and ``PreemptionCallback``, inside the job, saves and publishes)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import RestorePointError
from ..format import Manifest, Position
from ..ops import Expectations
from ..ops.local_view import DATA_KEY, data_digest
from ..runtime.safe_load import safe_load
from ._lightning_resume import LAST, local_view, trainer_info
from .base import Snapshot, TrainerInfo, preempt_signal, send_signal

__all__ = ["LightningAdapter"]

log = logging.getLogger("restorepoint.lightning")


class LightningAdapter:
    """PyTorch Lightning with restorepoint.adapters.lightning.PreemptionCallback (last.ckpt)."""

    name = "lightning"
    #: The callback publishes into ``$RESTOREPOINT_STORE`` and ``resume_checkpoint`` gates
    #: its own resumes: under ``restorepoint run`` a Lightning job is a trainer that
    #: publishes itself, as a ResumableRun is.
    self_publishing = True

    def __init__(self, signal_name: str | None = None) -> None:
        self.snapshot_signal = preempt_signal(signal_name)

    def trainer(self) -> TrainerInfo:
        return trainer_info()

    def local_view(
        self,
        config: Mapping[str, Any] | None = None,
        data: Path | None = None,
        *,
        cache_root: str | None = None,
        command: Sequence[str] = (),
    ) -> Expectations:
        """The installed Lightning and the terms detected here; the cache root given (or in
        ``$RESTOREPOINT_CACHE_ROOT``); the data digest of ``data`` as the cache key ``data``,
        else none (the callback packs none unless given); the config."""
        keys = {DATA_KEY: data_digest(data)} if data is not None else None
        view = local_view(config, keys, cache_root)
        if config is not None:
            view = replace(view, sources={**view.sources, "config": "--config"})
        if data is not None:
            view = replace(
                view, sources={**view.sources, "cache_keys": "computed: data digest of --data"}
            )
        return view

    def request_snapshot(self, pid: int) -> None:
        """Send the preemption signal: the callback saves last.ckpt and chains to the handler
        before it (submitit's requeue stops the job); with none, it is a stop (exit 42)."""
        send_signal(pid, self.snapshot_signal)

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """``workdir/last.ckpt`` (or ``workdir/checkpoints/last.ckpt``, Lightning's default
        layout). It is committed once it exists: the callback renames it into place whole.
        Step and epoch are the checkpoint's own ``global_step`` and ``epoch``."""
        for root in (workdir, workdir / "checkpoints"):
            path = root / LAST
            if not path.is_file():
                continue
            try:
                # mmap: the tensors of a multi-GB checkpoint are not read to learn its step.
                state = safe_load(path, mmap=True)
                position = Position(int(state["global_step"]), int(state["epoch"]))
            except (RestorePointError, KeyError, TypeError, ValueError) as exc:
                log.warning("%s is not a readable Lightning checkpoint: %s", path, exc)
                return None
            return Snapshot(root, (LAST,), position)
        return None

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """The trainer's command with ``--ckpt_path RESTORED/last.ckpt`` (LightningCLI's
        ``fit`` option; a script of your own passes it to ``trainer.fit(ckpt_path=...)``)."""
        return [*base, "--ckpt_path", str(restored / LAST)]
