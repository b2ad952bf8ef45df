"""What a ResumableRun is, by its config: the operational keys, the run id, the snapshot
interval (docs/adapters.md, "The run id").

Operational keys are left out of the config identity, so that changing them never moves the run
id nor makes a restore point incompatible. A run's operational keys are, in one place here:

- the keys the user names (``operational=``);
- the key ``snapshot_every`` names, when it names one (the interval is how often to snapshot,
  never what is trained);
- the recovery knobs, ``RECOVERY_KEYS``, unless the user gives ``recovery_keys=()``: how often to
  checkpoint and log, whether to resume, how many resubmits. They change how a run survives,
  never what it computes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import UsageError
from ..format.identity import check_operational_key

__all__ = ["RECOVERY_KEYS", "operational_keys", "run_id_for", "snapshot_interval"]

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")

#: The recovery knobs, operational by default: at the top of the config and in its ``train``
#: section.
RECOVERY_KEYS: tuple[str, ...] = tuple(
    f"{section}{knob}"
    for section in ("", "train.")
    for knob in ("checkpoint_every", "auto_resume", "max_resubmit_attempts", "log_every")
)


def operational_keys(
    operational: Iterable[str], snapshot_every: object, recovery_keys: Iterable[str]
) -> list[str]:
    """The run's operational keys, sorted, each a valid dotted path."""
    keys = {*operational, *recovery_keys}
    if isinstance(snapshot_every, str):
        keys.add(snapshot_every)
    for key in keys:
        try:
            check_operational_key(key)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return sorted(keys)


def run_id_for(identity: str, seed: int, name: str | None = None) -> str:
    """The deterministic run id: a readable name and 16 hex digits of (identity, seed)."""
    digest = hashlib.sha256(f"{identity}:{seed}".encode()).hexdigest()[:16]
    prefix = _NAME_CHARS.sub("-", name or "run").strip("-.")[:40] or "run"
    if not prefix[0].isalnum():
        prefix = "r" + prefix
    return f"{prefix}-{digest}"


def snapshot_interval(config: Mapping[str, Any], every: int | str | None) -> int | None:
    """``snapshot_every``: a number of steps, or the dotted config key that holds one."""
    if isinstance(every, str):
        node: Any = config
        for part in every.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        every = node
    if every is None or every == 0:
        return None
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise UsageError(f"snapshot_every must be a non-negative integer, not {every!r}")
    return every
