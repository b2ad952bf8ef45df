"""Preemption: cloud reclaim-notice watchers, the supervisor, and manual snapshot requests."""

from __future__ import annotations

from .supervisor import READY_ENV, RESUME_ENV, STORE_ENV, Supervisor
from .telemetry import Telemetry
from .watchers import AwsWatcher, GcpWatcher, Notice, Watcher

__all__ = [
    "READY_ENV",
    "RESUME_ENV",
    "STORE_ENV",
    "AwsWatcher",
    "GcpWatcher",
    "Notice",
    "Supervisor",
    "Telemetry",
    "Watcher",
]
