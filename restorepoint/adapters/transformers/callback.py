"""The Trainer callback: every ``checkpoint-N`` the Trainer saves becomes a restore point, and
a stop ends in a published checkpoint and exit 42 (docs/adapters.md, "Hugging Face Trainer").

- **on_save**: the ``checkpoint-N`` the Trainer just wrote is linked into a staging directory
  (so that ``save_total_limit`` may rotate it away meanwhile) and handed to the runtime's
  snapshot worker, which publishes it through the one publish path (``ops.publish``, with
  keep-last / keep-best) and reads it back, while training goes on. Once it is done, the
  training thread writes the checkpoint's record (``_checkpoint``): what makes it complete
  for ``resume_checkpoint``.
- **A stop** (SIGTERM, SIGINT, ``$SUBMITIT_PREEMPT_SIGNAL`` or SIGUSR2) is a flag (the
  runtime's ``SignalFlags``); at the next step's end the callback sets ``should_save`` and
  ``should_training_stop``; the Trainer saves ``checkpoint-N``, the callback publishes it and
  waits for it (``upload_timeout``, the store's retries bounded by the same deadline), prints
  the runtime's stop line and ends the process with 42 (``Stopped``). The handlers that were
  there before (submitit's) are chained after. SIGUSR1 is a snapshot request: a save and a
  publish, and training goes on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._text import printable
from ...errors import MissingExtra, UsageError
from ...format import Position
from ...format.metrics import METRIC_NAME
from ...ops import entry_name, verify
from ...ops.publish import HeadSpec, PackOptions, Rest, publish
from ...ops.store import KeepBest
from ...runtime._inflight import Flights
from ...runtime.contract import (
    EXIT_RESUMABLE,
    SIGNING_KEY_ENV,
    incremental_from_env,
    leave_stop_marker,
    report_ready,
    stop_store_deadline,
)
from ...runtime.signals import SignalFlags, default_stop_signals, signal_name
from ...runtime.stop import stop_message
from ...runtime.worker import SnapshotWorker
from ...storage import set_store_deadline
from ...trust import load_signing_key
from .._lightning_metrics import best_options
from .._stepped import reuse_of, stepped_of
from ._checkpoint import UNPUBLISHED, file_index, write_record
from ._view import (
    cache_keys_of,
    local_view,
    operational_keys,
    run_id,
    store_from_env,
    trainer_config,
)

try:
    import torch
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - exercised without transformers
    raise MissingExtra("transformers", "transformers", "the transformers adapter") from exc

__all__ = ["RestorePointCallback", "Stopped"]

log = logging.getLogger("restorepoint.transformers")

#: The snapshot request of the stop contract (docs/preempt.md): save, publish, train on.
SNAPSHOT_SIGNAL = int(signal.SIGUSR1)


class Stopped(SystemExit):
    """The end of a stop: the checkpoint saved and published (or why not, in the stop line);
    it leaves ``trainer.train`` and ends the process with 42."""

    def __init__(self) -> None:
        super().__init__(EXIT_RESUMABLE)


@dataclass(frozen=True)
class _Job:
    step: int
    staging: Path
    checkpoint: Path
    head: HeadSpec
    #: The bytes its training changes at each step (``_stepped``); None: not known.
    stepped: int | None = None
    #: A stop's checkpoint: training waits for its publish, which takes every core.
    stop: bool = False


@dataclass(frozen=True)
class _Done:
    job: _Job
    index: dict[str, list[Any]] | None
    url: str | None
    error: str | None
    #: Abandoned for a stop's newer checkpoint (runtime/_inflight.py): no failure.
    superseded: bool = False
    #: The time it took, published and read back (None: not published).
    seconds: float | None = None


def _stage(checkpoint: Path, staging: Path) -> None:
    """``checkpoint``'s published files, hard-linked into ``staging`` (copied where links
    cannot be made): the Trainer's rotation may delete ``checkpoint`` during the publish."""
    for root, _dirs, files in os.walk(checkpoint):
        for name in files:
            source = Path(root) / name
            rel = source.relative_to(checkpoint)
            if rel.as_posix() in UNPUBLISHED:
                continue
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)


_STAGING = "restorepoint-publish-"


def _sweep(output_dir: Path, below: int | None = None) -> None:
    """Remove the staging directories of publishes that will never run: the worker replaces a
    job still waiting with a newer one (coalescing), and the replaced job's staging directory
    is then nobody's. Called by the worker before each job (those of lower steps: the worker
    runs one job at a time, so no other is in progress), and at the end (all of them)."""
    try:
        entries = list(output_dir.iterdir())
    except OSError:
        return
    for path in entries:
        name = path.name
        if not name.startswith("." + _STAGING):
            continue
        step_text = name[len(_STAGING) + 1 :].split("-", 1)[0]
        if below is None or (step_text.isdigit() and int(step_text) < below):
            shutil.rmtree(path, ignore_errors=True)


def _distributed() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


class RestorePointCallback(TrainerCallback):
    """Publish every checkpoint the Trainer saves; end a stop with a published checkpoint and
    exit 42.

    ``store`` (else ``$RESTOREPOINT_STORE``): where restore points go (None: none are
    published; checkpoints still get their record, and a stop still exits 42). ``run``: the
    run id (default: ``cfg-`` and the config identity). ``keep_last``, ``keep_best`` with
    ``metric`` (default: ``eval_`` + ``args.metric_for_best_model``) and ``mode``: the
    store's retention after each publish (``save_total_limit`` is the Trainer's, on the
    local disk only). ``dataset`` (a ``datasets.Dataset``: its fingerprint; or a digest
    string) and ``cache_keys``: the cache keys. ``operational``: the config keys left out of
    the identity (default ``OPERATIONAL_KEYS``). ``stop=False``: a stop signal is left to
    whoever handled it before. ``upload_timeout``: how long a stop waits for its publish.
    ``wait_each`` (default: with ``keep_best``): each save waits for its publish, so that
    every checkpoint is published (otherwise one saved while the previous one is still being
    published replaces it in the queue, and only the newest is published). ``handoff``: a
    file that each publish writes the handoff of its restore point to (``pack --handoff``).
    Other keywords are ``PackOptions`` fields (``storage_options``, ``level``, ``sign``...).
    ``events`` records what happened (``packed``, ``pack_failed``, ``stopped``)."""

    def __init__(  # noqa: PLR0913 - the callback's documented keyword options
        self,
        store: str | None = None,
        *,
        run: str | None = None,
        keep_last: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: str | None = None,
        dataset: Any = None,
        cache_keys: Mapping[str, str] | None = None,
        cache_root: str | None = None,
        terms: Mapping[str, str] | None = None,
        operational: Sequence[str] | None = None,
        stop: bool = True,
        upload_timeout: float = 300.0,
        wait_each: bool | None = None,
        handoff: str | os.PathLike[str] | None = None,
        **pack_options: Any,
    ) -> None:
        self.store = store_from_env(store)
        self.run = run
        self.keep_last = keep_last
        self._best = best_options(keep_best, metric, mode)
        self.keep_best: KeepBest | None = None
        self.metric = self._best[1]
        self.cache_keys = cache_keys_of(dataset, cache_keys)
        self.cache_root = cache_root
        self.terms = dict(terms or {})
        self.operational = operational_keys(operational)
        self.stop = stop
        self.upload_timeout = float(upload_timeout)
        # A checkpoint saved while the previous one is still being published replaces it in
        # the worker's queue (the runtime's coalescing): keep-best could then never see the
        # best. With keep_best, each save waits for its own publish unless told otherwise.
        self.wait_each = keep_best is not None if wait_each is None else bool(wait_each)
        self.handoff = handoff
        # As the runtime packs: one encode thread (leave the training thread a core), signed
        # with the supervisor's key (``restorepoint run --sign``) unless given one.
        pack_options.setdefault("threads", 1)
        key = os.environ.get(SIGNING_KEY_ENV)
        if "sign" not in pack_options and key:
            pack_options["sign"] = (load_signing_key(key),)
        # Incremental into a store by default; the supervisor's --full/--incremental if unsaid.
        pack_options["incremental"] = incremental_from_env(pack_options.get("incremental"))
        try:
            self.options = PackOptions(**pack_options)
        except TypeError as exc:
            raise UsageError(f"RestorePointCallback: {exc}") from None
        self._rest = Rest()  # its publishes rest after one that would reuse too little (28.4)
        self.events: list[dict[str, Any]] = []
        self._spec: HeadSpec | None = None
        self._flags: SignalFlags | None = None
        self._worker: SnapshotWorker[_Job] | None = None
        self._done: queue.Queue[_Done] = queue.Queue()
        self._outcomes: dict[int, _Done] = {}
        self._stopping: list[int] | None = None
        #: The periodic publish in flight, which a stop's checkpoint may supersede; the times
        #: the publishes took, published and read back (what a stop estimates from).
        self._flights = Flights()
        self._ready: Path | None = None
        self._output_dir = Path(".")

    # -- the Trainer's events --------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        self._output_dir = Path(str(args.output_dir))
        config = trainer_config(args, model)
        view = local_view(config, self.cache_keys, self.cache_root, self.terms)
        run = run_id(self.run, config, self.operational)
        self._spec = HeadSpec.from_view(
            view, Position(0), operational_keys=self.operational, run=run
        )
        self.run = run
        k, metric, mode = self._best
        if k is not None and metric is None and args.metric_for_best_model:
            name = str(args.metric_for_best_model)
            metric = name if name.startswith("eval_") else f"eval_{name}"
            if mode is None and args.greater_is_better is not None:
                mode = "max" if args.greater_is_better else "min"
        self.keep_best = KeepBest.of(k, metric, mode, "metric=")
        self.metric = metric
        self._worker = SnapshotWorker(self._publish)
        self._worker.start()
        self._install()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._collect()
        flags = self._flags
        if flags is None:
            return control
        stop, snapshot = flags.stop, flags.snapshot
        if _distributed():
            # Every rank calls this at every step's end, so the collective always matches:
            # all ranks save (and stop) at the same step.
            both = torch.tensor([int(stop), int(snapshot)], device=args.device)
            torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX)
            stop, snapshot = bool(both[0]), bool(both[1])
        if stop and self._stopping is None:
            self._stopping = flags.take(flags.stop_signals)
            control.should_save = True
            control.should_training_stop = True
            if args.save_strategy == "best":
                # An evaluation that finds no better metric would cancel this save.
                control.should_evaluate = False
        elif snapshot:
            flags.snapshot = False
            flags.take([flags.snapshot_signal])
            control.should_save = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = int(state.global_step)
        checkpoint = Path(str(args.output_dir)) / f"checkpoint-{step}"
        if _distributed():
            # Every rank has written its part (rng_state_N.pth) before rank 0 publishes.
            torch.distributed.barrier()
        if state.is_world_process_zero and self._worker is not None and self._spec is not None:
            if checkpoint.is_dir():
                model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
                stepped = stepped_of(
                    [] if model is None else [model], [] if optimizer is None else [optimizer]
                )
                self._submit(state, checkpoint, stepped)
                if self.wait_each and self._stopping is None:
                    self.wait(self.upload_timeout)
            else:
                log.warning("no %s after the save: nothing published", checkpoint)
        if self._stopping is not None:
            self._end_stop(state, saved=checkpoint.is_dir())

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._stopping is not None:
            # The stop's step was not saved (save_strategy "best" and no better metric, or a
            # strategy that saves nothing): end it all the same.
            self._end_stop(state, saved=False)
        self.close()

    # -- publishing ------------------------------------------------------------------------

    def _metrics(self, state: TrainerState) -> dict[str, float]:
        """The newest value of the metric in the Trainer's log (keep-best), when it is a
        finite number with a name a head can record."""
        name = self.metric
        if name is None or not METRIC_NAME.fullmatch(name):
            return {}
        for entry in reversed(state.log_history):
            value = entry.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                return {name: float(value)}
        return {}

    def _submit(self, state: TrainerState, checkpoint: Path, stepped: int | None = None) -> None:
        assert self._spec is not None
        assert self._worker is not None
        step = int(state.global_step)
        epoch = int(state.epoch or 0)
        staging = checkpoint.parent / f".{_STAGING}{step}-{secrets.token_hex(4)}"
        try:
            staging.mkdir()
            _stage(checkpoint, staging)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            log.error("could not stage %s for its publish: %s", checkpoint, exc)
            self._record("pack_failed", step=step, error=str(exc))
            return
        head = self._spec.at(Position(step, epoch), self._metrics(state))
        stop = self._stopping is not None
        self._worker.submit(_Job(step, staging, checkpoint, head, stepped, stop))

    def _publish(self, job: _Job) -> None:
        """The worker's job (never raises): publish and read back, or hash the files here
        without a store (or when the publish failed: the checkpoint is complete on disk)."""
        url: str | None = None
        error: str | None = None
        index: dict[str, list[Any]] | None = None
        _sweep(job.staging.parent, below=job.step)
        # A stop's own publish is never given up; a periodic one may be, for a stop's.
        flight = None if job.stop else self._flights.begin(job.step)
        started = time.monotonic()
        superseded = False
        took: float | None = None
        try:
            if self.store is not None:
                try:
                    # A full fine-tune's first restore point names no chunks (spec 28.4).
                    files = [
                        str(p.relative_to(job.staging))
                        for p in job.staging.rglob("*")
                        if p.is_file()
                    ]
                    self._rest.expect(reuse_of(job.stepped, job.staging, files))
                    result = publish(
                        job.staging,
                        self.store,
                        job.head,
                        self.options.waited_for() if job.stop else self.options,
                        keep_last=self.keep_last,
                        keep_best=self.keep_best,
                        handoff=self.handoff,
                        rest=self._rest,
                        progress=flight.abandon if flight is not None else None,
                    )
                    # Read back end to end before it counts; the prune after the publish
                    # verifies the run's newest in full, and then it is not read twice.
                    report = result.pruned
                    name = entry_name(result.manifest)
                    if report is None or not any(p.verified == name for p in report.runs):
                        verify(result.url, storage_options=self.options.storage_options)
                    url = result.url
                    took = time.monotonic() - started
                    self._flights.landed(took)
                    index = file_index(job.staging, result.manifest)
                    if result.prune_error is not None:
                        self._record("prune_failed", step=job.step, error=str(result.prune_error))
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    superseded = flight is not None and flight.superseded
                    # Abandoned for the stop's checkpoint, which said so: no failure.
                    (log.info if superseded else log.error)(
                        "publishing checkpoint-%d failed: %s; the store's previous restore "
                        "point stays the newest",
                        job.step,
                        error,
                    )
            if index is None:
                index = file_index(job.staging)
        except Exception as exc:
            error = error or f"{type(exc).__name__}: {exc}"
            log.error("checkpoint-%d could not be read: %s", job.step, error)
        finally:
            shutil.rmtree(job.staging, ignore_errors=True)
            self._flights.end()
            self._done.put(_Done(job, index, url, error, superseded, took))

    def _collect(self) -> None:
        """On the training thread (never during the Trainer's rotation): each publish done
        gives its checkpoint its record, if the checkpoint is still there."""
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return
            job = done.job
            self._outcomes[job.step] = done
            if done.url is not None:
                self._record("packed", step=job.step, url=done.url, seconds=done.seconds)
            elif done.superseded:
                pass  # ``pack_superseded`` said so when the stop gave it up
            elif self.store is not None:
                self._record("pack_failed", step=job.step, error=done.error)
            if done.index is None or not job.checkpoint.is_dir():
                continue
            try:
                write_record(job.checkpoint, job.head.manifest.head_dict(), done.index, done.url)
            except OSError as exc:
                log.warning("could not write the record of %s: %s", job.checkpoint, exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the publishes in hand (False on timeout), then record them."""
        finished = self._worker.wait(timeout) if self._worker is not None else True
        self._collect()
        return finished

    def close(self) -> None:
        """Wait for the publishes in hand (``upload_timeout``), put the signal handlers back
        and end the worker: ``on_train_end`` does it; call it after a ``train()`` that
        raised."""
        if self._worker is not None:
            if not self.wait(self.upload_timeout):
                log.warning(
                    "a publish was still running after %.0f s; leaving it", self.upload_timeout
                )
            else:
                _sweep(self._output_dir)
            self._worker.finish(0)
            self._worker = None
        self._restore()

    # -- the stop --------------------------------------------------------------------------

    def _install(self) -> None:
        if self._flags is not None:
            return
        stops = default_stop_signals() if self.stop else ()
        self._flags = SignalFlags(SNAPSHOT_SIGNAL, stops)
        self._flags.install()
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(OSError):
                self._ready = report_ready(
                    {"pid": os.getpid(), "run": self.run, "run_dir": str(self._output_dir)}
                )

    def _restore(self) -> None:
        if self._ready is not None:
            with contextlib.suppress(OSError):
                self._ready.unlink()
            self._ready = None
        if self._flags is not None:
            self._flags.restore()
            self._flags = None

    def _end_stop(self, state: TrainerState, *, saved: bool) -> None:
        signals, self._stopping = self._stopping or [], None
        why = signal_name(signals[-1]) if signals else "requested"
        step = int(state.global_step)
        finished = True
        deadline_from = None
        if self._worker is not None:
            self._worker.unthrottle()
            # The store's retries end with the wait: no retry past the stop's deadline (under
            # a supervisor, its own where sooner). The deadline is this stop's only: it is put
            # back before anything else happens.
            deadline, theirs = stop_store_deadline(self.upload_timeout)
            deadline_from = "supervisor" if theirs else "upload_timeout"
            set_store_deadline(deadline)
            try:
                # A periodic publish still in flight is given up where only the stop's can
                # land in time (runtime/_inflight.py).
                figures = self._flights.supersede(step, self.options.deadline_margin)
                if figures is not None:
                    self._record("pack_superseded", **figures)
                finished = self.wait(self.upload_timeout)
            finally:
                set_store_deadline(None)
        outcome = self._outcomes.get(step)
        if not saved:
            where = (
                f"no checkpoint-{step} was saved: the newest restore point stays the one to "
                "resume from"
            )
        elif self.store is None:
            where = f"checkpoint-{step} saved in {self._output_dir} (no store)"
        elif outcome is not None and outcome.url is not None:
            where = f"checkpoint-{step} published to {outcome.url} and verified"
        elif not finished:
            where = (
                f"checkpoint-{step} saved; its restore point did not land within "
                f"upload_timeout ({self.upload_timeout:g} s): the store's previous restore "
                "point stays the newest"
            )
        else:
            error = outcome.error if outcome is not None else "no publish recorded"
            where = (
                f"checkpoint-{step} saved; the publish failed ({error}): the store's previous "
                "restore point stays the newest"
            )
        published = outcome is not None and outcome.url is not None
        self._record(
            "stopped", signal=why, step=step, saved=saved, published=published,
            deadline_from=deadline_from,
        )  # fmt: skip
        if state.is_world_process_zero:
            print(stop_message(why, step, where), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            leave_stop_marker({"run": self.run, "step": step})
        flags = self._flags
        try:
            if flags is not None:
                flags.chain(signals)  # submitit's requeue, say, after the stop was taken
        finally:
            self.close()
        raise Stopped

    def _record(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
        if event in ("pack_failed", "prune_failed"):
            log.warning("%s", printable(f"{event} at step {fields.get('step')}: {fields}"))
