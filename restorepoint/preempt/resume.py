"""The supervisor's resume (docs/preempt.md, "Resume"): the one gated import for the trainer
before it starts, and what telemetry says of it. A refusal is exit 3 with the trainer not
started; a trainer that gates itself may still refuse (exit 3), so its ``resumed`` is recorded
only once it has accepted (never a ``resumed`` before a ``resume_refused``)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..adapters.base import Adapter
from ..errors import IncompatibleRestorePoint, RestorePointError
from ..ops.gate import Expectations
from ..ops.resume import choose, resume_import, write_head_file
from ..ops.resumed import DEFAULT_LEASE_S, ResumeMarker
from ..ops.store import _store
from ..runtime.contract import (
    REFUSED_FILE,
    RESUME_DIR_ENV,
    RESUME_HEAD_ENV,
    RESUME_URL_ENV,
    Ready,
    RunDirectory,
)
from ..trust import Trust, trust_policy
from .telemetry import Telemetry

__all__ = ["ResumeSteps"]

log = logging.getLogger("restorepoint.preempt")


class ResumeSteps:
    """The resume half of ``Supervisor`` (which supplies these fields)."""

    command: Sequence[str]
    store: str
    adapter: Adapter | None
    resume_from: str | None
    auto_resume: bool
    run: str | None
    telemetry: Telemetry
    storage_options: dict[str, Any] | None
    views: Sequence[Expectations]
    defer: frozenset[str]
    gate: bool
    accept_older: bool
    trust: Trust | None
    _ready_dir: Path | None
    _pending_resume: dict[str, Any] | None
    _resume_checked: float
    _marker: ResumeMarker | None
    _marker_renewed: float

    def ready(self) -> list[Ready]:
        raise NotImplementedError

    @property
    def self_publishing(self) -> bool:
        raise NotImplementedError

    def _prepare_resume(self, env: dict[str, str]) -> list[str]:
        """The one gated import for the trainer: the strict gate against this machine's
        views (a refusal is exit 3 before the trainer starts), under the trust policy."""
        command = list(self.command)
        url = self.resume_from
        try:
            if url is None and self.auto_resume:
                if self.run is None:
                    return command  # a ResumableRun finds its own run in the store
                entry = choose(
                    self.store,
                    run=self.run,
                    views=self.views,
                    defer=self.defer,
                    accept_older=self.accept_older,
                    trust=self.trust,
                    storage_options=self.storage_options,
                )
                if entry is None:
                    log.warning("no restore point of run %s in the store: starting fresh", self.run)
                    return command
                url = entry.url
            if url is None:
                return command
            assert self._ready_dir is not None
            dest = self._ready_dir / "resume"
            started = time.perf_counter()
            result = (
                resume_import(
                    url,
                    dest,
                    views=self.views if self.gate else (),
                    defer=self.defer if self.gate else frozenset(),
                    trust=self.trust,
                    storage_options=self.storage_options,
                )
                if self.gate
                else _ungated_import(url, dest, self.trust, self.storage_options)
            )
        except IncompatibleRestorePoint as exc:
            self._record_refusal(exc)
            raise
        resumed = {
            "step": result.manifest.position.step,
            "seconds": time.perf_counter() - started,
            "bytes": result.bytes,
        }
        if self.defer and self.gate:
            # The trainer compares the deferred fields and may still refuse (exit 3):
            # recorded once it has accepted, never before its refusal.
            self._pending_resume = resumed
        else:
            self.telemetry.count("resumes", **resumed)
        self._mark(url)
        head = self._ready_dir / "resume.head.json"
        write_head_file(result.manifest, head)
        env[RESUME_DIR_ENV] = str(dest)
        env[RESUME_HEAD_ENV] = str(head)
        env[RESUME_URL_ENV] = url
        if self.adapter is not None and not self.self_publishing:
            # A trainer that publishes itself finds the import through the environment (a
            # Lightning job's resume_checkpoint, a ResumableRun): its command stays as given.
            command = self.adapter.resume_command(dest, result.manifest, command)
        return command

    def _mark(self, url: str) -> None:
        """A resume from a restore point of the supervisor's own store is marked (spec 19.9)
        while the supervisor (and so the run) lives, the run's newest as well as an older
        branch; one from elsewhere needs no marker."""
        location = _store(self.store, self.storage_options)
        name = url.removeprefix(location.url) if url.startswith(location.url) else ""
        try:
            marker = ResumeMarker(location, name)
            marker.renew()
        except ValueError:
            return  # not a store name of this store
        except RestorePointError as exc:
            log.warning("could not write a resume marker for %s: %s", url, exc)
            return
        self._marker, self._marker_renewed = marker, time.monotonic()

    def _renew_marker(self) -> None:
        """Renewed four times a lease, from the supervisor's loop: the trainer's publishes are
        not the supervisor's to see."""
        if self._marker is None or time.monotonic() - self._marker_renewed < DEFAULT_LEASE_S / 4:
            return
        self._marker_renewed = time.monotonic()
        try:
            self._marker.renew()
        except RestorePointError as exc:
            log.warning("could not renew the resume marker %s: %s", self._marker.url, exc)

    def _release_marker(self) -> None:
        if self._marker is not None:
            self._marker.release()
            self._marker = None

    def _record_refusal(self, exc: RestorePointError) -> None:
        fields = [str(m.get("field", "")) for m in getattr(exc, "mismatches", ())]
        self.telemetry.record(
            "resume_refused", reason=type(exc).__name__, fields=",".join(sorted(set(fields)))
        )

    def _trainer_refused(self) -> None:
        """The trainer ended with exit 3: its own gate refused the restore point handed to it
        (it wrote the refused field names beside its ready file)."""
        assert self._ready_dir is not None
        try:
            doc = json.loads((self._ready_dir / REFUSED_FILE).read_text())
            fields = [str(f) for f in doc.get("fields", [])]
            reason = str(doc.get("class", "IncompatibleRestorePoint"))
        except (OSError, ValueError, AttributeError):
            fields, reason = [], "IncompatibleRestorePoint"
        self.telemetry.record("resume_refused", reason=reason, fields=",".join(sorted(set(fields))))

    def _check_resumed(self) -> None:
        """A trainer that gates itself has accepted the import once its run directory records
        the ``resumed`` event (looked at once a second)."""
        self._renew_marker()
        if self._pending_resume is None or time.monotonic() - self._resume_checked < 1.0:
            return
        self._resume_checked = time.monotonic()
        for r in self.ready():
            if r.run_dir is None:
                continue
            with contextlib.suppress(OSError):
                for event in RunDirectory(r.run_dir).events():
                    if event.get("event") == "resumed":
                        self._record_resumed()
                        return

    def _record_resumed(self) -> None:
        if self._pending_resume is not None:
            fields, self._pending_resume = self._pending_resume, None
            self.telemetry.count("resumes", **fields)


def _ungated_import(
    url: str, dest: Path, trust: Trust | None, storage_options: dict[str, Any] | None
) -> Any:
    """``--no-gate --force``: forensics. Integrity and the trust policy still hold."""
    from ..ops import import_restore_point

    return import_restore_point(
        url, dest, trust=trust_policy(trust), storage_options=storage_options
    )
