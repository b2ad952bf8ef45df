"""Snapshot steps in the trainer's own units: the trainer scales step values like its
evaluation steps (each value times its steps scaler in single precision, rounded half away from
zero), so a snapshot every N real training steps is passed as round(k*N / scaler)."""

from __future__ import annotations

import math
import struct
from typing import Any

from ...errors import UsageError
from .profile import Profile

__all__ = ["MAX_SNAPSHOT_STEPS", "check_every", "lround", "scaled"]


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def lround(x: float) -> int:
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def scaled(value: int, scaler: float) -> int:
    """The trainer's scaling of one step value (single-precision product, lround)."""
    if scaler <= 0 or scaler == 1:
        return value
    return lround(_f32(_f32(float(value)) * _f32(scaler)))


#: The snapshot steps travel as one argument, and Linux takes at most 128 KiB in one argument
#: (MAX_ARG_STRLEN): 10 000 values of up to 12 characters stay under it.
MAX_SNAPSHOT_STEPS = 10_000


def check_every(value: Any, profile: Profile) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(
            f"{profile.name}: {profile.checkpoint_every_key} must be an integer (0: off)"
        )
    if value < 0:
        raise UsageError(f"{profile.name}: {profile.checkpoint_every_key} must not be negative")
    if 0 < value < profile.min_every:
        raise UsageError(
            f"{profile.name}: {profile.checkpoint_every_key} = {value} is below the minimum of "
            f"{profile.min_every} steps (0 turns snapshots off)"
        )
    return value
