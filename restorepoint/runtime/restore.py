"""A ResumableRun's resume: which snapshot it resumes from, loaded and restored into the
tracked objects, the RNGs and the position (``ResumableRun.resume``, docs/adapters.md).

The candidates are a restore point a supervisor imported for the run, the store's newest
restore point of the run and the run directory's own snapshot (``resume_from`` finds the first
two and gates them); with a process group, every rank resumes from the same step. A failed
resume leaves nothing half landed and keeps the refusal for ``__exit__`` (under a supervisor it
ends the trainer with its exit code)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._text import printable
from ..errors import IncompatibleRestorePoint, RestorePointError, UsageError
from ..format import Position
from .contract import POSITION_FILE
from .resume_from import Landing, display, gate_handed, handed, store_snapshot
from .state import STATE_FORMAT, held_or_files, load_state, read_state, set_rng

if TYPE_CHECKING:
    from .run import ResumableRun

__all__ = ["resume"]

log = logging.getLogger("restorepoint.torch")


def resume(run: ResumableRun) -> Position:
    """Restore the newest matching snapshot, or start fresh; the position training resumes at
    (``ResumableRun.resume`` says what is gated and refused)."""
    if not run.auto_resume and handed(run._rank_file()) is None:
        # auto_resume governs finding the newest; an import handed over (restorepoint run
        # --resume-from) is applied whatever it says.
        return run.position
    landing = None
    try:
        path, source, landing = _newest_snapshot(run)
        if path is None:
            if run.is_main:
                log.info("no checkpoint of run %s: starting fresh", run.run_id)
            return run.position
        # A store import is loaded from the verified bytes it holds, not read back.
        state = (
            load_state(path, extra_globals=run.safe_globals)
            if landing is None
            else held_or_files(path, landing.held, landing.land, run.safe_globals)
        )
    except BaseException as exc:
        _failed_resume(run, exc, landing)
        raise
    try:
        _restore(run, path, source, state)
    except BaseException:
        _failed_resume(run, None, landing)
        raise
    if landing is not None:
        # The copy for a later resume here lands while training goes on (joined at exit).
        run._landing = landing
        landing.start()
    return run.position


def _failed_resume(run: ResumableRun, exc: BaseException | None, landing: Landing | None) -> None:
    if landing is not None:
        landing.discard()
    if isinstance(exc, RestorePointError):
        run._refused = exc
        # Outside a supervisor the error reaches the user as a traceback: its mismatches,
        # one a line, come with it (Python 3.11 prints an exception's notes).
        for detail in getattr(exc, "details", ()):
            if hasattr(exc, "add_note"):
                exc.add_note(f"  {printable(detail)}")


def _restore(run: ResumableRun, path: Path, source: str, state: Any) -> None:
    """Every tracked object, the RNGs and the position from a loaded snapshot."""
    shown = display(path, run._rank_file())
    if (
        not isinstance(state, dict)
        or state.get("format") != STATE_FORMAT
        or state.get("identity") != run.identity
    ):
        raise IncompatibleRestorePoint(
            f"refusing to resume from {shown}: it is not a snapshot of this run",
            url=shown,
        )
    for name, obj in run.objects.items():
        if name not in state["objects"]:
            raise UsageError(f"the snapshot holds no state for {name!r}")
        obj.load_state_dict(state["objects"][name])
    set_rng(state["rng"])
    pos = state["position"]
    run.step, run.epoch, run.batch = pos["step"], pos["epoch"], pos["batch"]
    run._start_epoch = run.epoch
    run._snapshot_step = run.step
    run.resumed_from = run.position
    # The resubmit count travels with the snapshot: max_resubmit_attempts holds across
    # machines (a fresh run directory elsewhere starts from the restore point's count).
    carried = state.get("resubmit_count", 0)
    if isinstance(carried, int) and carried > run._resubmits:
        run._resubmits = carried
        run._write_status("running")
    run._event("resumed", step=run.step, epoch=run.epoch, batch=run.batch, source=source)
    if run.is_main:
        print(
            f"restorepoint: resumed from checkpoint: global step {run.step}, start epoch "
            f"{run.epoch}, resume batch index {run.batch}, data order: shuffle seeded "
            f"with seed + epoch ({run.seed} + {run.epoch})",
            file=sys.stderr,
        )


def _newest_snapshot(run: ResumableRun) -> tuple[Path | None, str, Landing | None]:
    imported = handed(run._rank_file())
    if imported is not None:
        # A supervisor imported a restore point for us (restorepoint run --resume-from).
        gate_handed(imported, run._view, run._rank_file())
        return imported / run._rank_file(), "supervisor import", None
    local = run.directory.checkpoints / run._rank_file()
    local_step = _local_step(run, local)
    steps: list[Any] = [local_step]
    if run._world > 1:
        # Every rank resumes from the same step: a rank killed while it saved (or a node
        # that lost its disk) leaves the run directories at other steps, and then only the
        # store has a snapshot of every rank.
        steps = [None] * run._world
        torch.distributed.all_gather_object(steps, local_step, group=run._control)
        if len(set(steps)) > 1:
            log.warning("the ranks' run directories hold steps %s: not resuming from them", steps)
            local_step = -1
    found = store_snapshot(run, local_step)
    if found is not None:
        return found
    if local_step < 0 and max(steps) >= 0:
        raise IncompatibleRestorePoint(
            f"refusing to resume: the ranks' run directories hold snapshots of steps {steps}, "
            "and the store has no restore point to resume every rank from",
            url=str(run.run_dir),
        )
    return (local, "run directory", None) if local_step >= 0 else (None, "", None)


def _local_step(run: ResumableRun, local: Path) -> int:
    """The step of this rank's snapshot in the run directory, or -1: none, or one whose
    shared state is gone."""
    if not local.exists():
        return -1
    if run._world == 1:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return int(json.loads((local.parent / POSITION_FILE).read_text())["step"])
    # With a process group the rank's own file is small: its shared state lies apart.
    state = read_state(local, extra_globals=run.safe_globals)
    if not isinstance(state, dict):
        return -1
    ref = state.get("shared")
    if isinstance(ref, dict) and not (local.parent / str(ref.get("file"))).is_file():
        return -1
    return int(state["position"]["step"])
