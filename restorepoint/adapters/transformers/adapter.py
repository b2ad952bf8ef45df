"""The adapter ``transformers`` (``restorepoint local-view``/``check``/``import --check-keys``/
``run --adapter transformers``): the local view of a Trainer run on this machine, without
importing transformers itself (the versions come from the installed packages' metadata)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...format import Manifest, Position
from ...ops import Expectations
from ...ops.local_view import DATA_KEY, data_digest
from .._record import Incomplete
from ..base import Snapshot, TrainerInfo, preempt_signal, send_signal
from ._checkpoint import RECORD, complete, published_files
from ._view import OPERATIONAL_KEYS, local_view, trainer_info

__all__ = ["TransformersAdapter"]


class TransformersAdapter:
    """Hugging Face transformers.Trainer with its RestorePointCallback (checkpoint-N)."""

    name = "transformers"
    #: The callback publishes into ``$RESTOREPOINT_STORE`` and ``resume_checkpoint`` gates its
    #: own resumes: under ``restorepoint run`` a Trainer job publishes itself.
    self_publishing = True
    #: The config keys a pack here leaves out of the identity (the callback's default).
    operational_keys = OPERATIONAL_KEYS

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
        """The installed transformers and the terms detected here (torch, CUDA, transformers,
        accelerate); the cache root given (or in ``$RESTOREPOINT_CACHE_ROOT``); the data
        digest of ``data`` as the cache key ``data``, else none (give a dataset's fingerprint
        with ``--key dataset=FINGERPRINT``); the config: the JSON of ``trainer_config(args,
        model)`` (``{"args": ..., "model": ...}``)."""
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
        """Send the preemption signal (SIGUSR2 unless ``$SUBMITIT_PREEMPT_SIGNAL``): a stop;
        the callback saves and publishes the checkpoint at the next step's end, exit 42."""
        send_signal(pid, self.snapshot_signal)

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """The newest complete ``checkpoint-N`` of ``workdir`` (its record matches its
        files); a half-written one is never returned."""
        from ._checkpoint import checkpoints

        for step, path in checkpoints(workdir):
            try:
                found = complete(path)
            except Incomplete:
                continue
            files = (*published_files(path), RECORD)
            return Snapshot(path, files, Position(step, found.head.position.epoch))
        return None

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """The trainer's command with ``--resume_from_checkpoint RESTORED`` (the
        TrainingArguments option ``HfArgumentParser`` reads)."""
        return [*base, "--resume_from_checkpoint", str(restored)]
