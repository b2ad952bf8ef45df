"""What a ResumableRun writes about itself in its run directory, and when (the files are the
run-directory contract's, ``contract``): its identity record (a directory of another config is
refused, an older one of the same config adopted), the reports that its handlers are up
(trainer.json, a supervisor's ready file), its status and its events. A run already completed
is not trained again. A full disk leaves a status or event line out, never stops training."""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .._text import plural, printable
from ..errors import IncompatibleRestorePoint
from ..format import config_identity, diff_configs
from .contract import now, ready_document, report_ready
from .state import read_state

if TYPE_CHECKING:
    from .run import ResumableRun

__all__ = [
    "append_event",
    "attach_identity",
    "exit_if_completed",
    "report_down",
    "report_up",
    "write_status",
]

log = logging.getLogger("restorepoint.torch")


def exit_if_completed(run: ResumableRun, previous: Mapping[str, Any]) -> None:
    """A run whose status is ``completed`` is not trained again: every rank exits 0 at
    once (rank 0 says so in one line), before anything is written or resumed."""
    done = previous.get("status") == "completed"
    if run._world > 1:
        flag = torch.tensor([int(done)], dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=run._control)
        done = bool(flag[0])
    if not done:
        return
    if run.is_main:
        step = previous.get("step")
        print(
            printable(
                f"restorepoint: run {run.run_id} already completed"
                + (f" at step {step}" if isinstance(step, int) else "")
                + f" ({run.run_dir}): nothing to train; exiting 0"
            ),
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(0)


def report_up(run: ResumableRun) -> None:
    """Handlers are installed: say so, to ``restorepoint snapshot`` (trainer.json in the run
    directory) and to a supervisor ($RESTOREPOINT_READY_DIR/PID.json). A signal sent before
    this would have found the default action, which for SIGUSR1 is to die."""
    doc = ready_document(
        run.run_id, run.run_dir, rank=run._rank, snapshot_signal=run.flags.snapshot_signal
    )
    if run.is_main:
        run._reports.append(run.directory.write_trainer_report(doc))
    with contextlib.suppress(OSError):
        ready = report_ready(doc)
        if ready is not None:
            run._reports.append(ready)


def report_down(run: ResumableRun) -> None:
    for path in run._reports:
        with contextlib.suppress(OSError):
            path.unlink()
    run._reports.clear()


# -- identity of the run directory ------------------------------------------------------


def attach_identity(run: ResumableRun) -> None:
    """Refuse a run directory that belongs to another config; adopt an older one (a
    checkpoint but no identity record) whose saved config hashes to the same identity."""
    saved = run.directory.identity_record()
    if saved is not None:
        if saved.get("config_identity") != run.identity:
            _refuse(run, saved.get("config") or {}, saved.get("config_identity"))
        return
    last = run.directory.checkpoints / "last.pt"
    if last.exists():
        state = read_state(last, extra_globals=run.safe_globals)
        old = state.get("config") if isinstance(state, dict) else None
        if not isinstance(old, dict) or config_identity(old, run.operational) != run.identity:
            _refuse(run, old if isinstance(old, dict) else {}, None)
        run._event("adopted", step=int(state.get("position", {}).get("step", 0)))
    if run.is_main:
        run.directory.write_identity_record(
            {
                "config": run.config,
                "config_identity": run.identity,
                "operational_keys": run.operational,
                "run": run.run_id,
                "seed": run.seed,
            }
        )


def _refuse(run: ResumableRun, other: Mapping[str, Any], other_identity: str | None) -> None:
    diffs = diff_configs(run.config, other, run.operational)
    details = [d.describe() for d in diffs] or [
        f"config_identity: expected {run.identity}, found {other_identity}"
    ]
    raise IncompatibleRestorePoint(
        "refusing to attach: this run directory holds a run of another config "
        f"({plural(len(details), 'difference')})",
        url=str(run.run_dir),
        mismatches=[{"field": f"config.{d.path}"} for d in diffs],
        details=details,
    )


# -- status and events -------------------------------------------------------------------


def write_status(run: ResumableRun, status: str, **extra: Any) -> None:
    run._status = status
    if not run.is_main:
        return
    with _disk_full_tolerated(run, "run_status.json"):
        run.directory.write_status(
            {
                "last_signal": run.flags.last_signal,
                "max_resubmit_attempts": run.max_resubmit_attempts,
                "resubmit_count": run._resubmits,
                "run": run.run_id,
                "status": status,
                "step": run.step,
                "updated": now(),
                **extra,
            }
        )


def append_event(run: ResumableRun, kind: str, **fields: Any) -> None:
    if run.is_main:
        with _disk_full_tolerated(run, "events.jsonl"):
            run.directory.append_event(kind, **fields)


@contextlib.contextmanager
def _disk_full_tolerated(run: ResumableRun, what: str) -> Iterator[None]:
    """A full disk must not stop training (docs/reliability.md, "Full disks"): a status
    or event line that cannot be written is left out, said once in the log."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if not run._disk_full_said:
            run._disk_full_said = True
            log.warning("restorepoint: %s: %s not written: %s", run.run_dir, what, exc.strerror)
