"""The metric a Lightning run is monitored by, for the heads the PreemptionCallback publishes
(spec 4.3) and for its keep-best retention (19.5): the callback's own ``metric``/``mode``, or
else those of the Trainer's first ModelCheckpoint that monitors something."""

from __future__ import annotations

import math
import os
from typing import Any

from ..format.metrics import METRIC_NAME
from ..ops.store import KeepBest
from ..runtime.contract import KEEP_BEST_ENV

__all__ = ["best_options", "keep_best_for", "monitored"]


def _monitor(trainer: Any) -> tuple[str | None, str | None]:
    for callback in getattr(trainer, "checkpoint_callbacks", ()):
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor:
            mode = getattr(callback, "mode", None)
            return monitor, mode if mode in ("min", "max") else None
    return None, None


def best_options(
    keep_best: int | None, metric: str | None, mode: str | None
) -> tuple[int | None, str | None, str | None]:
    """The callback's keep-best options, checked now as far as they go (the metric may come
    from a ModelCheckpoint at setup); none given: the supervisor's (``KEEP_BEST_ENV``)."""
    if keep_best is None and os.environ.get(KEEP_BEST_ENV):  # under restorepoint run
        rule = KeepBest.from_text(os.environ[KEEP_BEST_ENV])
        return rule.k, rule.metric, rule.mode
    if keep_best is not None and metric is not None:
        KeepBest(keep_best, metric, mode or "min")
    return keep_best, metric, mode


def keep_best_for(
    trainer: Any, keep_best: int | None, metric: str | None, mode: str | None
) -> KeepBest | None:
    """The callback's keep-best rule; a metric or mode it does not give comes from the
    monitoring ModelCheckpoint. UsageError when keep_best has no metric either way."""
    if keep_best is None:
        return None  # ``metric`` alone names what each head records
    if metric is None:
        metric, monitor_mode = _monitor(trainer)
        mode = mode or monitor_mode
    return KeepBest.of(keep_best, metric, mode, "metric=")


def monitored(trainer: Any, metric: str | None) -> dict[str, float]:
    """The monitored metric's value now (``trainer.callback_metrics``), or nothing: before the
    first validation, or when it is not a finite number or its name cannot be recorded (a
    restore point without it is never "best", spec 19.5)."""
    name = metric or _monitor(trainer)[0]
    if name is None or not METRIC_NAME.fullmatch(name):
        return {}
    value = getattr(trainer, "callback_metrics", {}).get(name)
    if value is None:
        return {}
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return {}
    return {name: number} if math.isfinite(number) else {}
