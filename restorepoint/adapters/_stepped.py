"""What an in-process trainer (Lightning, the Hugging Face Trainer, Accelerate) tells of the
bytes its training changes at every step: its models' parameters that its optimizers step, and
its optimizers' state (``runtime.state.stepped_bytes``). Its publisher tells its ``Rest`` the
share of the checkpoint's files that the next restore point would reuse (spec 28.4): a full
fine-tune's first restore point then names no chunks (no sha256 of every chunk for references
nothing would make). Only a speed hint: anything unexpected here is None (nothing known), never
a failed save."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..runtime.state import expected_reuse, stepped_bytes

__all__ = ["accelerate_stepped", "lightning_stepped", "reuse_of", "stepped_of"]

log = logging.getLogger("restorepoint.adapters")


def stepped_of(models: Iterable[Any], optimizers: Iterable[Any]) -> int | None:
    """The bytes that ``optimizers`` step in ``models``, and their state; None if not known."""
    try:
        objects = {f"model{i}": m for i, m in enumerate(models)}
        objects.update({f"optimizer{i}": o for i, o in enumerate(optimizers)})
        return stepped_bytes(objects)
    except Exception as exc:  # a hint only: a save never fails for it
        log.debug("what the training steps is not known: %s: %s", type(exc).__name__, exc)
        return None


def lightning_stepped(trainer: Any) -> int | None:
    """A Lightning Trainer's: its LightningModule and its optimizers."""
    module = getattr(trainer, "lightning_module", None)
    return stepped_of([] if module is None else [module], getattr(trainer, "optimizers", ()))


def accelerate_stepped(accelerator: Any) -> int | None:
    """An Accelerator's: the models and optimizers it prepared (``save_state`` saves them)."""
    return stepped_of(getattr(accelerator, "_models", ()), getattr(accelerator, "_optimizers", ()))


def reuse_of(stepped: int | None, directory: Path, files: Iterable[str]) -> float | None:
    """The share of ``files`` (under ``directory``) that the next restore point would reuse
    when ``stepped`` bytes of them change at every step; None if not known."""
    if stepped is None:
        return None
    try:
        total = sum(os.path.getsize(directory / name) for name in files)
    except OSError:
        return None
    return expected_reuse(stepped, total)
