"""The processes of one Accelerate run, together (``AccelerateRun``'s base): which one this is,
and the collectives its publish and resume make, so that no process waits alone in one when
another failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import (
    IncompatibleRestorePoint,
    IntegrityError,
    RestorePointError,
    StorageError,
    UsageError,
)

__all__ = ["Processes"]


class Processes:
    """What ``AccelerateRun`` knows of its processes, from its ``accelerator``."""

    accelerator: Any

    @property
    def rank(self) -> int:
        return int(self.accelerator.process_index)

    @property
    def world(self) -> int:
        return int(self.accelerator.num_processes)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def _gather(self, value: Any) -> list[Any]:
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, value)
        return out

    def _broadcast(self, value: Any) -> Any:
        if self.world == 1:
            return value
        box = [value if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _together(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on every process; when it failed on any, raise on every one (this
        process's own error, or the first other's), so that no process waits alone in a
        collective."""
        error: Exception | None = None
        result = None
        try:
            result = work()
        except Exception as exc:  # whatever it is, the other processes must hear of it
            error = exc
        code = error.exit_code if isinstance(error, RestorePointError) else 1
        said = None if error is None else (code, f"rank {self.rank}: {error}")
        failed = [s for s in self._gather(said) if s is not None]
        if error is not None:
            raise error
        if failed:
            code, message = failed[0]
            cls = {1: IntegrityError, 2: UsageError, 3: IncompatibleRestorePoint}
            raise cls.get(code, StorageError)(message)
        return result
