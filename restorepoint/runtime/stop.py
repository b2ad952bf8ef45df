"""A ResumableRun's stop path: the one way a stop request ends a run (docs/adapters.md,
"Snapshots and signals").

A stop request (SIGTERM, ``$SUBMITIT_PREEMPT_SIGNAL`` or SIGUSR2, ``request_stop()``), acted on
at an effective-batch boundary by every rank at the same step:

1. the resubmit count goes up (the snapshot carries it, so the limit holds on any machine);
2. the state at the stop is snapshotted, and the snapshot worker, at the process's priority,
   saves and publishes it; the stop waits for it up to ``upload_timeout`` (a periodic publish
   still in flight is abandoned where the store deadline holds the stop's publish but not
   both, runtime/_inflight.py). Training waits until the process exits, so the snapshot is
   the tracked state's own memory where that is a CPU tensor in one run of memory (no copy:
   no pause for it, and no second copy of the state in memory); what is still in hand when
   the run is left is given up (``finish_uploads``), so that nothing reads that memory after;
3. the run's status becomes ``preempted`` (``failed`` past ``max_resubmit_attempts``), and the
   handlers that were installed before ours (submitit's requeue) run;
4. rank 0 says so on stderr, in one line (where the restore point went, or that the store's
   previous one stays the newest; without a store, where the snapshot lies), each process
   leaves its stop marker (``contract.leave_stop_marker``: torchrun turns a worker's 42 into
   its own 1, and the marker lets ``restorepoint run`` and the Slurm template map it back);
5. the process exits 42, the resumable exit (1 past the resubmit limit).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from .._text import printable
from ..storage import set_store_deadline
from .contract import EXIT_RESUMABLE, leave_stop_marker, stop_store_deadline
from .signals import signal_name

if TYPE_CHECKING:
    from .run import ResumableRun

__all__ = ["end_stop", "finish_uploads", "stop", "stop_line", "stop_message"]

log = logging.getLogger("restorepoint.torch")


def stop(run: ResumableRun) -> NoReturn:
    """Snapshot, publish within ``upload_timeout``, record the stop, exit 42."""
    signals = run.flags.take(run.flags.stop_signals)
    why = signal_name(signals[-1]) if signals else "requested"
    limit = run.max_resubmit_attempts
    run.worker.unthrottle()
    run.publisher.unthrottle()
    # Counted before the snapshot: the restore point carries it, so that the limit holds
    # on whichever machine resumes next.
    run._resubmits += 1
    # With a process group a snapshot waits for the publish in flight (every rank publishes
    # its parts in order): the choice to give that one up comes first.
    ranks = run._world > 1
    if not ranks:
        run.snapshot(live=True)
    # One upload_timeout for the whole stop: __exit__ waits only for what is left of it.
    run._upload_deadline = time.monotonic() + run.upload_timeout
    # The store's retries too (storage/_retry.py): no wait past the deadline; under a
    # supervisor, its own deadline where that is sooner (the notice's, less the margin), at
    # which the adaptive codec aims too.
    store_deadline, theirs = stop_store_deadline(run.upload_timeout)
    set_store_deadline(store_deadline)
    store_deadline_s = round(store_deadline - time.monotonic(), 3)
    # A periodic publish still in flight is given up where only the stop's can land in time
    # (runtime/_inflight.py); with a process group, by every rank together.
    run.publisher.supersede(run.step, run._control)
    wait = run.upload_timeout
    if ranks:
        run.snapshot(live=True)
        wait = max(0.0, run._upload_deadline - time.monotonic())
    finished = run.wait(wait)
    over = limit is not None and run._resubmits > limit
    run._event(
        "graceful_shutdown",
        signal=run.flags.last_signal,
        step=run.step,
        upload_finished=finished,
        resubmit_count=run._resubmits,
        store_deadline_s=store_deadline_s,
        deadline_from="supervisor" if theirs else "upload_timeout",
    )
    if over:
        run._write_status("failed", error=f"resubmit limit {limit} reached")
    else:
        run._write_status("preempted")
    code = 1 if over else EXIT_RESUMABLE
    if run.is_main:
        upload = run.publisher.outcome(run.step) if finished else None
        line = stop_line(run, why, finished, upload, f"resubmit limit {limit} reached" * over)
        print(line, file=sys.stderr, flush=True)
    if not over:
        with contextlib.suppress(OSError, ValueError):
            leave_stop_marker({"rank": run._rank, "run": run.run_id, "step": run.step})
    run.flags.chain(signals)
    run._barrier()
    raise SystemExit(code)


def stop_line(
    run: ResumableRun, why: str, finished: bool, upload: dict[str, object] | None, over: str
) -> str:
    """The one line a stop prints: what was asked, at which step, where the state at the stop
    went, and the exit code."""
    unsaved = run.publisher.save_errors.get(run.step) if finished else None
    url = upload.get("url") if upload is not None and upload.get("ok") else None
    if unsaved is not None and url is not None:
        # Published from memory, and the run directory's copy failed after it (a full disk).
        where = (
            f"restore point published to {url} (the snapshot was not saved in "
            f"{run.directory.checkpoints}: {unsaved})"
        )
    elif unsaved is not None:
        checkpoints = run.directory.checkpoints
        kept = (
            f"the previous snapshot in {checkpoints} stays the newest"
            if (checkpoints / run.publisher.rank_file()).exists()
            else f"there is no snapshot in {checkpoints} to resume from"
        )
        where = f"the snapshot was not saved ({unsaved}): {kept}"
    elif run.store is None:
        where = f"snapshot saved in {run.directory.checkpoints} (no store)"
    elif url is not None:
        where = f"restore point published to {url}"
    elif not finished:
        where = (
            f"the restore point did not land within upload_timeout ({run.upload_timeout:g} s): "
            "the store's previous restore point stays the newest"
        )
    else:
        error = str(upload.get("error")) if upload is not None else "no publish recorded"
        where = f"the publish failed ({error}): the store's previous restore point stays the newest"
    return stop_message(why, run.step, where, over)


def stop_message(why: str, step: int, where: str, over: str = "") -> str:
    """The stop line's words, for every trainer that ends a stop itself (the runtime, the
    Accelerate helper, the transformers callback): what was asked, at which step, where the
    state at the stop went, and the exit code (1 with ``over``, the reason the stop is not
    resumable; else 42)."""
    tail = f"; {over}: exiting 1 (not resumable)" if over else "; exiting 42 (resumable)"
    return printable(f"restorepoint: stop ({why}) at step {step}: {where}{tail}")


#: How long leaving a run after a stop whose publish missed ``upload_timeout`` waits for the
#: end of that publish, given up, and of the snapshot file's write (``finish_uploads``).
RELEASE_S = 30.0


def finish_uploads(run: ResumableRun) -> None:
    """At the end of the run: wait for the uploads in hand, within what is left of a stop's
    ``upload_timeout`` (the whole of it otherwise), then end the worker.

    After a stop, what is still in hand is given up: the stop's snapshot is the tracked
    state's own memory (``snapshot(live=True)``), and a caller that catches the exit and
    trains on would change it under a publish that still read it. The publish ends at its
    next chunk, nothing of it committed (an S3 upload aborted), and leaving waits for that
    and for the snapshot file's write, up to RELEASE_S."""
    timeout = run.upload_timeout
    deadline = run._upload_deadline
    stopped = deadline is not None
    if deadline is not None:
        timeout = max(0.0, deadline - time.monotonic())
    if run.wait(timeout):
        run.worker.finish(0)
        return
    if not stopped:
        log.warning("an upload was still running after %.0f s; leaving it", run.upload_timeout)
        run._event("upload_abandoned", step=run.step)
        return
    log.warning(
        "the stop's upload was still running after upload_timeout (%g s): giving it up",
        run.upload_timeout,
    )
    run._event("upload_abandoned", step=run.step)
    run.publisher.give_up(
        f"given up: the stop's upload did not land within upload_timeout ({run.upload_timeout:g} s)"
    )
    if run.wait(RELEASE_S):
        run.worker.finish(0)
        return
    log.warning(
        "the stop's snapshot was still being read %g s after upload_timeout: the tracked "
        "state must not change before this process exits",
        RELEASE_S,
    )


def end_stop(run: ResumableRun) -> None:
    """The store deadline a stop set belongs to that stop: it ends with the run, so that a
    process that goes on (a test suite, a notebook, a sweep of runs) retries its stores in
    full again."""
    if run._upload_deadline is not None:
        set_store_deadline(None)
