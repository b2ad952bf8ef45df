"""Accelerate: ``accelerator.save_state`` directories as restore points (docs/adapters.md,
"Accelerate").

    with AccelerateRun(accelerator, "state", store="s3://bucket/runs/", config=cfg) as rp:
        start = rp.resume()                        # the newest complete state, or None
        for step in range(start.step if start else 0, total):
            ...                                    # forward, backward, optimizer.step()
            if (step + 1) % 100 == 0:
                rp.publish(step=step + 1)          # save_state, then one restore point
            rp.check(step=step + 1)                # a stop: publish, exit 42; SIGUSR1: publish

``publish_state`` and ``resume_state`` are the same two calls without the context (and its
stop handler).

- **Publish**: ``accelerator.save_state(DIR)`` on every process, then the state record
  (``restorepoint-state.json``: the head with the position, and each file's size and sha256)
  once every process saved, then the files through the one publish path: ``ops.publish`` for
  one process; under ``accelerate launch`` with N processes one multi-part restore point
  (``runtime.sharded.publish_ranks``): each process's ``random_states_R.pkl`` is its part,
  the rest (weights, optimizer, scheduler, custom checkpoints) the shared part, one commit.
- **Resume**: the newest complete state directory (``DIR`` or one directly under it: its
  record there, gated, and its files matching the record), unless the store holds a newer
  restore point of the run, which is imported through the gated import (each process the
  shared part and its own). Every pickle Accelerate loads with torch.load (``*.bin``,
  ``*.pkl``, ``*.pt``, ``*.pth``: optimizer, scheduler, RNG states, custom checkpoints) passes
  the allowlist scan and a weights-only load (``check_loadable``) before
  ``accelerator.load_state``, and ``load_state`` itself runs with every torch.load forced to
  weights-only (``weights_only_loads``): Accelerate loads registered objects' custom
  checkpoints with ``weights_only=False``, and no load here may run code. A refusal is one
  line and exit 3 (1 for an unsafe pickle), never a silent fresh start.
- **Inside ``with``**: publishes run on the runtime's snapshot worker while training goes on.
- **Stop**: the runtime's signal flags (SIGTERM, SIGINT, ``$SUBMITIT_PREEMPT_SIGNAL`` or
  SIGUSR2; SIGUSR1 a snapshot request); ``check()`` (or ``should_stop()``) agrees across
  processes at a step boundary, ``stop()`` publishes (within ``upload_timeout``; with one
  process, a periodic publish in flight that only the stop's can beat to the deadline is
  abandoned first, runtime/_inflight.py), prints the
  runtime's stop line, leaves the stop marker (``accelerate launch`` turns a worker's 42
  into 1; ``restorepoint run`` maps it back) and exits 42.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .._posix import signal_number
from .._text import printable
from ..errors import (
    MissingExtra,
    RestorePointError,
    UsageError,
)
from ..format import Manifest, Position
from ..ops import Expectations, describe
from ..ops.publish import HeadSpec, PackOptions, Rest, publish
from ..ops.store import KeepBest
from ..runtime._inflight import Flights, InFlight
from ..runtime.contract import (
    EXIT_RESUMABLE,
    KEEP_BEST_ENV,
    RESUME_URL_ENV,
    incremental_from_env,
    leave_stop_marker,
    ready_document,
    report_ready,
    stop_store_deadline,
)
from ..runtime.safe_load import weights_only_loads
from ..runtime.signals import SignalFlags, default_stop_signals, signal_name
from ..runtime.stop import stop_message
from ..runtime.worker import DEFAULT_NICE, SnapshotWorker
from ..storage import store_deadline
from ..trust import Trust

try:
    import torch
    from accelerate import __version__ as _ACCELERATE_VERSION  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised without accelerate
    raise MissingExtra("accelerate", "transformers", "the accelerate adapter") from exc

from ._accelerate_processes import Processes
from ._accelerate_resume import (
    check_pickles,
    choose_state,
    import_share,
    record_position,
    refused,
    take_handed,
    write_imported,
)
from ._accelerate_state import (
    ACCELERATE_HINTS,
    STATE_RECORD,
    StateRecord,
    rank_of,
    state_files,
    view_for,
)
from ._accelerate_stop import final_publish
from ._expect import store_from_env
from ._stepped import accelerate_stepped, reuse_of

__all__ = [
    "ACCELERATE_HINTS",
    "STATE_RECORD",
    "AccelerateRun",
    "local_view",
    "publish_state",
    "resume_state",
]

log = logging.getLogger("restorepoint.accelerate")


@dataclass(frozen=True)
class _Job:
    """A saved state to publish: its files, its head, its step."""

    files: list[str]
    head: HeadSpec
    step: int
    #: The bytes its training changes at each step (``_stepped``); None: not known.
    stepped: int | None = None


def local_view(
    config: Mapping[str, Any] | None = None,
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    terms: Mapping[str, str] | None = None,
) -> Expectations:
    """What an Accelerate run here expects of a restore point: the installed Accelerate (the
    trainer ``accelerate=VERSION``), the terms detected here (torch, CUDA where present,
    accelerate) and ``terms``, the cache root and keys given, and the config."""
    return view_for(str(_ACCELERATE_VERSION), config, cache_keys, cache_root, terms)


class AccelerateRun(Processes):
    """Restore points of one Accelerate run: ``publish`` (save_state, then publish),
    ``resume`` (the newest complete state, local or from the store, gated and scanned, then
    load_state), and, as a context manager, the stop contract (``should_stop``, ``stop``).

    ``store`` (else ``$RESTOREPOINT_STORE``, what ``restorepoint run`` hands down, when
    ``run`` or ``config`` names the run), ``run``/``config`` (the run's name is ``cfg-`` and
    the config identity when only a config is given), ``operational`` (config keys left out of
    the identity), ``keep_last``, ``keep_best`` with ``metric`` and ``mode``, ``cache_keys``,
    ``cache_root``, ``terms``, ``trust`` and ``accept_older`` (the gated import's),
    ``safe_globals`` (classes a pickle may name, that the caller vouches for),
    ``exit_on_refusal`` (a resume's error is one line and its exit code: 3 for a refusal),
    ``stop_signals``, ``upload_timeout`` (the stop's publish) and ``pack_options`` (the fields
    of ``PackOptions``: ``level``, ``storage_options``, ``sign``, ...)."""

    def __init__(  # noqa: PLR0913 - public API: the documented keyword options
        self,
        accelerator: Any,
        directory: str | os.PathLike[str],
        *,
        store: str | None = None,
        config: Mapping[str, Any] | None = None,
        run: str | None = None,
        operational: Sequence[str] = (),
        keep_last: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: str | None = None,
        cache_keys: Mapping[str, str] | None = None,
        cache_root: str | None = None,
        terms: Mapping[str, str] | None = None,
        trust: Trust | None = None,
        accept_older: bool = False,
        safe_globals: Sequence[Callable[..., Any]] = (),
        exit_on_refusal: bool = True,
        stop_signals: Sequence[int | str] | None = None,
        upload_timeout: float = 300.0,
        background_nice: int | None = DEFAULT_NICE,
        **pack_options: Any,
    ) -> None:
        self.accelerator = accelerator
        self.directory = Path(directory)
        self.config = dict(config) if config is not None else None
        self.operational = tuple(operational)
        self.view = local_view(self.config, cache_keys, cache_root, terms)
        store = store_from_env(store, run, config)
        self.store = store if store is None or store.endswith("/") else store + "/"
        # describe validates the config (JSON data) and the run name, once, here.
        self.run = describe(
            position=0, config=self.config, operational_keys=self.operational, run=run
        ).run
        if self.store is not None and self.run is None:
            raise UsageError("a store needs a run: give run= or config=")
        self.keep_last = keep_last
        self.keep_best = KeepBest.of(keep_best, metric, mode, "metric=")
        if self.keep_best is None and os.environ.get(KEEP_BEST_ENV):
            # restorepoint run --keep-best: the supervisor's retention, when none is given.
            self.keep_best = KeepBest.from_text(os.environ[KEEP_BEST_ENV])
        # Incremental into a store by default; the supervisor's --full/--incremental if unsaid.
        pack_options["incremental"] = incremental_from_env(pack_options.get("incremental"))
        try:
            self.options = PackOptions(**pack_options)
        except TypeError as exc:
            raise UsageError(f"AccelerateRun: {exc}") from None
        self._rest = Rest()  # its publishes rest after one that would reuse too little (28.4)
        self.trust = trust
        self.accept_older = accept_older
        self.safe_globals = tuple(safe_globals)
        self.exit_on_refusal = exit_on_refusal
        self.upload_timeout = upload_timeout
        stops = [signal_number(s) for s in (stop_signals or default_stop_signals())]
        self.flags = SignalFlags(int(signal.SIGUSR1), stops)
        self._ready: Path | None = None
        #: What each publish did: ``{"step", "ok", "url" and "seconds", or "error"}``, newest
        #: last (``"superseded"``: abandoned for a stop's state, runtime/_inflight.py).
        self.uploads: list[dict[str, Any]] = []
        #: The worker's publish in flight (one process), which a stop may supersede; the
        #: times the publishes took, which a stop estimates from.
        self._flights = Flights()
        self._url = ""
        self._imported: Manifest | None = None
        self._nice = background_nice
        #: Inside ``with``: the runtime's snapshot worker, which publishes while training
        #: goes on, and (several processes) the gloo group its collectives go over, so that
        #: they never meet the training thread's.
        self.worker: SnapshotWorker[_Job] | None = None
        self._group: Any = None

    # -- publishing ------------------------------------------------------------------------------

    def head(self, position: Position, metrics: Mapping[str, float] | None = None) -> HeadSpec:
        return HeadSpec.from_view(
            self.view, position, operational_keys=self.operational, run=self.run,
            metrics=metrics,
        )  # fmt: skip

    def _job(
        self, files: list[str], position: Position, metrics: Mapping[str, float] | None
    ) -> _Job:
        """The publish of ``files`` at ``position``, with what the training steps, read here
        on the training thread (the optimizers' state is not read while a step changes it)."""
        stepped = accelerate_stepped(self.accelerator)
        return _Job(files, self.head(position, metrics), position.step, stepped)

    def publish(
        self, *, step: int, epoch: int = 0, metrics: Mapping[str, float] | None = None
    ) -> str | None:
        """``accelerator.save_state(DIR)``, the state record, then (with a store) one restore
        point of it at ``step``/``epoch``: collective, every process calls it. Outside
        ``with``: published now; returns its URL (None without a store) and raises on every
        process when it could not be published (the store's previous restore point stays the
        newest). Inside ``with``: handed to the snapshot worker, which publishes while
        training goes on (``wait``; each outcome in ``uploads``, a failure logged and training
        goes on); returns None. Either way the publish before is awaited first: its files
        are not saved over while they are read."""
        self.wait()
        files = self._save(Position(step, epoch))
        if self.store is None:
            return None
        job = self._job(files, Position(step, epoch), metrics)
        if self.worker is not None:
            self.worker.submit(job)
            return None
        return self._publish_job(job, raise_errors=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the publishes handed to the worker are done; False on timeout."""
        return self.worker.wait(timeout) if self.worker is not None else True

    def _save(self, position: Position) -> list[str]:
        """save_state on every process; the files (named by the main process). Without a
        store the record follows at once (its files hashed here); with one it follows the
        publish, from what the published index says of them (``_publish_job``): the files
        are hashed once, by the publish, and off the training thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.is_main:
            # A save killed midway leaves a directory without a record: not complete.
            (self.directory / STATE_RECORD).unlink(missing_ok=True)
        self.accelerator.save_state(str(self.directory))
        self._barrier()
        files = self._together(lambda: state_files(self.directory) if self.is_main else None)
        files = list(self._broadcast(files))
        if self.store is None:
            self._together(lambda: self._write_record(position, files) if self.is_main else None)
        return files

    def _work(self, job: _Job) -> None:
        self._publish_job(job)

    def _publish_job(self, job: _Job, *, raise_errors: bool = False) -> str | None:
        """Publish one saved state (the worker's job: a failure is recorded, never raised),
        then the record of the directory: complete whether or not the publish landed."""
        index: dict[str, tuple[int, str]] = {}
        # The worker's publish, with one process: a stop may give it up for its own state.
        flight = self._flights.begin(job.step) if not raise_errors and self.world == 1 else None
        started = time.monotonic()
        try:
            url = self._publish(job.files, job.head, index, job.stepped, flight)
        except Exception as exc:
            upload: dict[str, Any] = {"step": job.step, "ok": False, "error": str(exc)}
            superseded = flight is not None and flight.superseded
            if superseded:
                upload["superseded"] = True
            self.uploads.append(upload)
            self._record_saved(job, None)
            if raise_errors:
                raise
            # Abandoned for the stop's state, which said so: no failure.
            (log.info if superseded else log.warning)(
                "publishing the state at step %d failed: %s", job.step, exc
            )
            return None
        finally:
            self._flights.end()
        took = time.monotonic() - started
        self._flights.landed(took)
        self._record_saved(job, index)
        self.uploads.append({"step": job.step, "ok": True, "url": url, "seconds": took})
        return url

    def _record_saved(self, job: _Job, index: dict[str, tuple[int, str]] | None) -> None:
        if not self.is_main:
            return
        try:
            self._write_record(job.head.manifest.position, job.files, index)
        except OSError as exc:
            log.warning("the state record at step %d was not written: %s", job.step, exc)

    def _write_record(
        self,
        position: Position,
        files: list[str] | None = None,
        index: dict[str, tuple[int, str]] | None = None,
    ) -> list[str]:
        return StateRecord.write(
            self.directory, self.head(position).manifest, self.world, files, index
        )

    def _publish(
        self,
        files: list[str],
        head: HeadSpec,
        index: dict[str, tuple[int, str]],
        stepped: int | None = None,
        flight: InFlight | None = None,
    ) -> str:
        """Publish ``files``; ``index`` is filled with what the restore point's index says of
        each (its size and sha256). ``stepped``: the bytes its training changes at each step,
        for the rest (spec 28.4: a full fine-tune's first restore point names no chunks).
        ``flight``: one process's publish, which a stop may abandon."""
        store = self.store or ""
        if self.world == 1:
            self._rest.expect(reuse_of(stepped, self.directory, files))
            result = publish(
                self.directory,
                store,
                head,
                self.options,
                include=files,
                keep_last=self.keep_last,
                keep_best=self.keep_best,
                rest=self._rest,
                progress=flight.abandon if flight is not None else None,
            )
            if result.prune_error is not None:
                log.warning("the prune after %s failed: %s", result.url, result.prune_error)
            if result.manifest.payload is not None:
                index.update({e.path: (e.size, e.sha256) for e in result.manifest.payload})
            return result.url
        from ..runtime.sharded import publish_ranks

        own = [f for f in files if rank_of(f) == self.rank]
        if not own:
            raise UsageError(f"process {self.rank} saved no random_states_{self.rank}.pkl")
        return publish_ranks(
            self.directory,
            store,
            head,
            own=own,
            shared=[f for f in files if rank_of(f) is None],
            options=self.options,
            keep_last=self.keep_last,
            keep_best=self.keep_best,
            group=self._group,
            files_out=index,
            rest=self._rest,
        )

    # -- resuming --------------------------------------------------------------------------------

    def resume(self) -> Position | None:
        """Restore the newest state of the run: the newest complete local state directory, or
        the store's newest restore point when it is further on (imported into DIR through the
        gated import); every pickle scanned, then ``accelerator.load_state``. Returns the
        position resumed at, or None (nothing to resume: training starts fresh). Collective."""
        try:
            chosen = self._together(lambda: choose_state(self) if self.is_main else None)
            kind, where = self._broadcast(chosen) or (None, "")
            if kind is None:
                if self.is_main:
                    log.warning("no state in %s%s: starting fresh", self.directory, self._also())
                return None
            if kind == "store":
                self._together(lambda: import_share(self, where))
                self._barrier()
                self._together(lambda: write_imported(self) if self.is_main else None)
                where = str(self.directory)
            elif kind == "handed":
                self._together(lambda: take_handed(self, Path(where)) if self.is_main else None)
                where = str(self.directory)
            path = Path(where)
            self._together(lambda: check_pickles(self, path))
            position: Position = self._together(lambda: record_position(path))
        except RestorePointError as exc:
            if not self.exit_on_refusal:
                raise
            raise refused(self, exc) from None
        with weights_only_loads(self.safe_globals):
            self.accelerator.load_state(str(path))
        if self.is_main:
            source = str(path) if kind == "local" else f"{self._url}, imported into {path}"
            if kind == "handed":
                source = f"{os.environ.get(RESUME_URL_ENV) or 'an import'}, handed over by "
                source += f"restorepoint run, copied into {path}"
            print(
                f"restorepoint: resumed from {printable(source)}: step {position.step}, "
                f"epoch {position.epoch}",
                file=sys.stderr,
                flush=True,
            )
        return position

    def _also(self) -> str:
        return f" and no restore point in {self.store}" if self.store is not None else ""

    # -- the stop contract -----------------------------------------------------------------------

    def __enter__(self) -> AccelerateRun:
        if self.store is not None:
            if self.world > 1:
                # Collective: every process enters the context together.
                self._group = torch.distributed.new_group(
                    backend="gloo",
                    timeout=datetime.timedelta(seconds=max(self.upload_timeout, 60.0)),
                )
            self.worker = SnapshotWorker(self._work, nice=self._nice)
            self.worker.start()
        self.flags.install()
        self._report_up()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ready is not None:
            with contextlib.suppress(OSError):
                self._ready.unlink()
            self._ready = None
        try:
            if self.worker is not None and not self.worker.finish(self.upload_timeout):
                log.warning(
                    "a publish was still running after %.0f s; leaving it", self.upload_timeout
                )
        finally:
            self.worker = None
            self.flags.restore()

    def _report_up(self) -> None:
        """Under ``restorepoint run``: the handlers are installed, so the supervisor may signal
        this process (a stop: SIGTERM; a snapshot notice: SIGUSR1), and it waits for the run's
        new restore point (docs/preempt.md, "The ready-file protocol")."""
        doc = ready_document(
            self.run, self.directory, rank=self.rank, snapshot_signal=self.flags.snapshot_signal
        )
        with contextlib.suppress(OSError):
            self._ready = report_ready(doc)

    def check(
        self, *, step: int, epoch: int = 0, metrics: Mapping[str, float] | None = None
    ) -> None:
        """The step boundary, in one call on every process (a collective with several): a
        stop (SIGTERM, ...) on any process is ``stop``; a snapshot request (SIGUSR1: a
        supervisor's snapshot notice, ``restorepoint snapshot``) on any is a ``publish``, and
        training goes on."""
        snapshot, stop = self._agree()
        if stop:
            self.stop(step=step, epoch=epoch, metrics=metrics)
        if snapshot:
            # Taken before the publish: a request during it gets one of its own next time.
            self.flags.snapshot = False
            received = self.flags.take({self.flags.snapshot_signal})
            self.publish(step=step, epoch=epoch, metrics=metrics)
            self.flags.chain(received)

    def _agree(self) -> tuple[bool, bool]:
        """The flags or-ed across the processes: every one acts at the same step."""
        snapshot, stop = self.flags.snapshot, self.flags.stop
        if self.world > 1:
            device = self.accelerator.device
            flags = torch.tensor([int(snapshot), int(stop)], dtype=torch.int64, device=device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            snapshot, stop = bool(flags[0]), bool(flags[1])
        return snapshot, stop

    def should_stop(self) -> bool:
        """Whether a stop was asked for (a stop signal, or ``request_stop``) on any process:
        call it at a step boundary, on every process (with several, it is a collective).
        (``check`` also takes snapshot requests.)"""
        return self._agree()[1]

    def request_stop(self) -> None:
        """Ask for a stop, as a stop signal does."""
        self.flags.stop = True

    def stop(
        self, *, step: int, epoch: int = 0, metrics: Mapping[str, float] | None = None
    ) -> NoReturn:
        """The stop contract's ending: publish the state at ``step`` (within
        ``upload_timeout``), the stop line (once), this process's stop marker, the handlers
        that were there before, exit 42. When the publish fails, the store's previous restore
        point stays the newest; the exit is 42 all the same."""
        taken = self.flags.take(self.flags.stop_signals)
        why = signal_name(taken[-1]) if taken else "requested"
        # One upload_timeout for the whole stop; the store's retries end with it too (and the
        # deadline with the stop: the previous one is put back).
        deadline = time.monotonic() + self.upload_timeout
        # Under a supervisor, its own deadline where sooner, at which the codec aims too.
        with store_deadline(stop_store_deadline(self.upload_timeout)[0]):
            where = final_publish(self, Position(step, epoch), metrics, deadline)
        if self.is_main:
            print(stop_message(why, step, where), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            leave_stop_marker({"rank": self.rank, "run": self.run, "step": step})
        self.flags.chain(taken)
        # Every process ends together: a launcher that sees one exit first stops the others,
        # and the main process may still be reading the restore point back.
        self._barrier()
        raise SystemExit(EXIT_RESUMABLE)


def publish_state(
    accelerator: Any,
    directory: str | os.PathLike[str],
    *,
    step: int,
    epoch: int = 0,
    metrics: Mapping[str, float] | None = None,
    **options: Any,
) -> str | None:
    """``accelerator.save_state(directory)`` and one restore point of it at ``step``: every
    process calls it. ``options`` are ``AccelerateRun``'s (``store``, ``config``, ``run``,
    ``keep_last``, ...). Returns the restore point's URL, or None without a store."""
    return AccelerateRun(accelerator, directory, **options).publish(
        step=step, epoch=epoch, metrics=metrics
    )


def resume_state(
    accelerator: Any, directory: str | os.PathLike[str], **options: Any
) -> Position | None:
    """Restore the newest state of the run into ``accelerator`` (``AccelerateRun.resume``):
    every process calls it. Returns the position resumed at, or None (start fresh)."""
    return AccelerateRun(accelerator, directory, **options).resume()
