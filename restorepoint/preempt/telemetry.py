"""Telemetry of the supervisor: counts and timings, one JSON object a line (docs/preempt.md,
"Telemetry"). Only listed fields, of numbers, booleans and short enumerations, are written, so
no URL, path or credential can leak into it."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Telemetry"]

_SAFE_FIELDS = {
    "event", "time", "kind", "source", "step", "seconds", "bytes", "count", "exit_code",
    "seconds_left", "notice_to_published_s", "published", "in_time", "snapshots", "uploads",
    "resumes", "notices", "upload_failures", "reason", "fields", "checkpoints",
    "resume_bytes", "resume_seconds",
}  # fmt: skip


class Telemetry:
    """Counts and timings, one JSON object a line. Only whitelisted fields of numbers, booleans
    and short enumerations are written, so no URL, path or credential can leak into it."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self.counts = {"notices": 0, "resumes": 0, "snapshots": 0, "uploads": 0,
                       "upload_failures": 0, "checkpoints": 0}  # fmt: skip
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> None:
        doc: dict[str, Any] = {"event": event, "time": round(time.time(), 3)}
        for key, raw in fields.items():
            if key not in _SAFE_FIELDS:
                raise ValueError(f"telemetry field {key!r} is not on the list")
            value: Any = round(raw, 4) if isinstance(raw, float) else raw
            if not isinstance(value, (int, float, bool)) and value is not None:
                value = str(value)
                if "/" in value or "\\" in value or ":" in value:
                    raise ValueError(f"telemetry value for {key!r} looks like a path or URL")
            doc[key] = value
        if self.path is None:
            return
        line = json.dumps(doc, sort_keys=True) + "\n"
        # The supervisor's thread and the external loop's publisher both record.
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)

    def count(self, name: str, **fields: Any) -> None:
        """Count one more ``name`` (notices, resumes, snapshots, uploads, upload_failures,
        checkpoints) and record it as an event of the singular name (``resumed`` for a
        resume)."""
        with self._lock:
            self.counts[name] += 1
        self.record(name.rstrip("s") if name != "resumes" else "resumed", **fields)
