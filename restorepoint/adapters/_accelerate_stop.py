"""The Accelerate helper's stop: the stop's publish, once the worker's publish in hand is done
or given up (``AccelerateRun.stop``, adapters/accelerate.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import RestorePointError
from ..format import Position
from ..ops.verify import verify

if TYPE_CHECKING:
    from .accelerate import AccelerateRun

__all__ = ["final_publish"]

log = logging.getLogger("restorepoint.accelerate")


def final_publish(
    run: AccelerateRun, position: Position, metrics: Mapping[str, float] | None, deadline: float
) -> str:
    """The stop's publish, on this thread, once the worker's is done: where it went."""
    if run.worker is not None:
        run.worker.unthrottle()
    # One process: a publish in flight is given up where only the stop's can land in time
    # (runtime/_inflight.py); its files are then saved over as soon as it has stopped.
    figures = run._flights.supersede(position.step, run.options.deadline_margin)
    if figures is not None:
        log.info("the publish of the state at step %d is abandoned for the stop's: %s",
                 figures["step"], figures)  # fmt: skip
    # Every process waits for its own worker: they agree on whether all were done.
    done = run._gather(run.wait(max(0.0, deadline - time.monotonic())))
    if not all(done):
        return (
            f"the publish in hand did not land within upload_timeout "
            f"({run.upload_timeout:g} s): the state at the stop was not saved over it, "
            "and the store's previous restore point stays the newest"
        )
    try:
        files = run._save(position)
        if run.store is None:
            return f"state saved in {run.directory} (no store)"
        job = run._job(files, position, metrics)
        url = run._publish_job(job, raise_errors=True)
    except RestorePointError as exc:
        return f"the publish failed ({exc}): the store's previous restore point stays the newest"
    except OSError as exc:
        return f"the state was not saved ({exc}): the store's previous restore point stays"
    assert url is not None
    return _read_back(run, url)


def _read_back(run: AccelerateRun, url: str) -> str:
    """The main process reads the stop's restore point back, end to end, before the stop
    counts it as published (spec 16.7); where it went, in the stop line's words."""
    if not run.is_main:
        return f"restore point published to {url}"
    try:
        verify(url, storage_options=run.options.storage_options)
    except RestorePointError as exc:
        return f"restore point published to {url}, but reading it back failed ({exc})"
    return f"restore point published to {url} and verified"
