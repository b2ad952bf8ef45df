"""Resumable training for plain PyTorch loops: the preemption contract (docs/adapters.md).

    with ResumableRun(config, store="s3://bucket/runs/",
                      snapshot_every="train.checkpoint_every") as run:
        run.track(model=model, optimizer=optimizer, scheduler=scheduler)
        run.resume()                           # restores state and position, or starts fresh
        for epoch in run.epochs(num_epochs):
            loader = run.dataloader(data, batch_size=B, accumulate=A)
            for micro_batches in run.effective_batches(loader, A):
                ...                                    # forward, backward, optimizer.step()
                run.commit()                           # one effective batch is done

``ResumableRun`` composes the runtime's parts: the run directory and its contract
(``contract``), what the run writes there about itself (``records``: identity record, status,
events, ready reports), what the run is (``identity``: operational keys, run id), the signal
flags (``signals``), the snapshot worker (``worker``), the save and publish of each snapshot
(``publish``), the stop path (``stop``), the resume (``restore``) and where to resume from
(``resume_from``), the data order (``data``) and the snapshot's state (``state``). It resumes
through the one way in (``ops.resume``: the strict gate against its local view) and publishes
through the one way out (``ops.publish``).

- The run id and directory follow from the config identity (operational keys excluded), the seed
  and an optional name: a resubmitted job finds its own run, never another's.
- Position is counted in effective (optimizer) batches; each epoch's data order is a shuffle
  seeded with ``seed + epoch``, and the committed batches of the epoch being resumed are skipped,
  never replayed.
- Signals only set a flag; the loop acts at the next effective-batch boundary (``commit``): a
  snapshot request (SIGUSR1) snapshots and trains on; a stop request (SIGTERM, SIGINT, and
  ``$SUBMITIT_PREEMPT_SIGNAL`` or SIGUSR2) snapshots, publishes and exits with 42, the
  resumable exit, saying so in one line (``stop``: the stop path's one owner).
- A run whose status is ``completed`` is not trained again; the state at completion is
  published (``final_snapshot``, on with a store).
- A snapshot pauses training only while the state is copied to memory; the local save runs on
  a background thread, and the pack and the upload in a process of its own where the platform
  allows (``background``, on that thread otherwise). A failed upload is recorded and training
  goes on.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._posix import signal_number
from .._version import __version__
from ..errors import IntegrityError, RestorePointError, UsageError
from ..format import Position, Trainer, config_identity
from ..format.metrics import check_metrics
from ..ops import Expectations, check_json_data, load_config
from ..ops.local_view import cache_root_from_env
from ..ops.publish import HeadSpec, PackOptions
from ..ops.store import KeepBest
from ..trust import Trust, load_signing_key
from .capture import Buffers, Copies
from .contract import (
    EXIT_RESUMABLE,
    KEEP_BEST_ENV,
    READY_ENV,
    SIGNING_KEY_ENV,
    STORE_ENV,
    RunDirectory,
    incremental_from_env,
    max_resubmits_from_env,
    report_refusal,
)
from .data import EpochSampler, effective_batches
from .detect import TORCH_TERMS_SOURCE, torch_terms
from .identity import RECOVERY_KEYS, operational_keys, run_id_for, snapshot_interval
from .publish import Publisher, rank_file
from .records import (
    append_event,
    attach_identity,
    exit_if_completed,
    report_down,
    report_up,
    write_status,
)
from .restore import resume
from .resume_from import RUNTIME_HINTS, Landing
from .signals import SignalFlags, default_stop_signals, ignore_in_worker
from .state import STATE_FORMAT, rng_state, stepped_bytes, to_cpu
from .stop import end_stop, finish_uploads, stop
from .worker import DEFAULT_NICE, Snapshot, SnapshotWorker

__all__ = ["RUNTIME_HINTS", "ResumableRun", "run_id_for"]

log = logging.getLogger("restorepoint.torch")


#: Where a snapshot is published (``background=``): in a process of its own
#: (ops/publish_process.py; Linux, one process with a store) or on the snapshot worker's
#: thread; ``auto`` (the default) takes the process where it can run, the thread otherwise.
BACKGROUNDS = ("auto", "process", "thread")


def _background(value: str) -> str:
    if value not in BACKGROUNDS:
        raise UsageError(f"background must be one of {', '.join(BACKGROUNDS)}, not {value!r}")
    return value


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ResumableRun:
    """A training run that survives preemption. See the module docstring."""

    # The public constructor: keyword-only options, each documented in docs/adapters.md. They
    # are grouped into the values the parts take (the local view, PackOptions, the worker)
    # here, once.
    def __init__(  # noqa: PLR0913, PLR0915 - public API: ResumableRun's documented keyword options (docs/adapters.md)
        self,
        config: Mapping[str, Any] | str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] = "runs",
        name: str | None = None,
        store: str | None = None,
        operational: Sequence[str] = (),
        recovery_keys: Sequence[str] = RECOVERY_KEYS,
        seed: int | None = None,
        snapshot_every: int | str | None = None,
        snapshot_signal: int | str = signal.SIGUSR1,
        stop_signals: Sequence[int | str] | None = None,
        max_resubmit_attempts: int | None = None,
        keep_last: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: str | None = None,
        final_snapshot: bool | None = None,
        upload_timeout: float = 300.0,
        background_threads: int = 1,
        background_nice: int | None = DEFAULT_NICE,
        background: str = "auto",
        trainer: tuple[str, str] | None = None,
        terms: Mapping[str, str] | None = None,
        cache_keys: Mapping[str, str]
        | Callable[[Mapping[str, Any]], Mapping[str, str]]
        | None = None,
        cache_root: str | None = None,
        level: int | None = 1,
        auto_resume: bool = True,
        accept_older: bool = False,
        storage_options: dict[str, Any] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        trust: Trust | None = None,
        sign: str | os.PathLike[str] | None = None,
        safe_globals: Sequence[Callable[..., Any]] = (),
        incremental: bool | None = None,
    ) -> None:
        if not isinstance(config, Mapping):
            config = load_config(os.fspath(config))
        self.config: dict[str, Any] = check_json_data(dict(config))
        self.operational = operational_keys(operational, snapshot_every, recovery_keys)
        self.identity = config_identity(self.config, self.operational)
        self.seed = int(seed if seed is not None else self.config.get("seed", 0))
        self.run_id = run_id_for(self.identity, self.seed, name)
        self.run_dir = Path(run_dir) if run_dir is not None else Path(root) / self.run_id
        self.directory = RunDirectory(self.run_dir)
        # A supervisor (restorepoint run) passes its store down; an explicit one wins.
        store = store if store is not None else os.environ.get(STORE_ENV) or None
        self.store = store if store is None or store.endswith("/") else store + "/"
        self.snapshot_every = snapshot_interval(self.config, snapshot_every)
        self.flags = SignalFlags(
            signal_number(snapshot_signal),
            (signal_number(s) for s in (stop_signals or default_stop_signals())),
        )
        self.max_resubmit_attempts = (
            max_resubmit_attempts if max_resubmit_attempts is not None else max_resubmits_from_env()
        )
        self.keep_last = keep_last
        #: Retention by metric at each publish (spec 19.5), beside keep_last.
        self.keep_best = KeepBest.of(keep_best, metric, mode, "metric=")
        if self.keep_best is None and os.environ.get(KEEP_BEST_ENV):
            self.keep_best = KeepBest.from_text(os.environ[KEEP_BEST_ENV])
        # What commit(metrics=...) gave since the last snapshot: the next snapshot records it.
        self._metrics: dict[str, float] = {}
        #: Snapshot (and publish) the state at completion: on by default with a store.
        self.final_snapshot = self.store is not None if final_snapshot is None else final_snapshot
        self.upload_timeout = upload_timeout
        self.auto_resume = auto_resume
        self.accept_older = accept_older
        self.trust = trust
        self.safe_globals = tuple(safe_globals)
        self._rank, self._world = _distributed()
        self._view = self._local_view(trainer, terms, cache_keys, cache_root)
        sign = sign if sign is not None else os.environ.get(SIGNING_KEY_ENV) or None
        # The supervisor's --incremental/--full when none is given here.
        chosen = incremental_from_env(incremental)
        # One encode thread by default: on a small machine the pack must leave the training
        # thread a core (measured on 2 cores: benchmarks/bench_torch.py, docs/performance.md).
        self.options = PackOptions(
            level=level,
            threads=max(1, background_threads),
            sign=(load_signing_key(sign),) if sign is not None else (),
            storage_options=storage_options,
            # Under a stop or a reclaim notice (the store deadline), each chunk's codec mode is
            # chosen to land before the deadline (spec 13, W4b); every chunk probed otherwise.
            adaptive="deadline",
            # Only what changed is uploaded (spec 28), by default where it can be (pack
            # decides); with several ranks, each rank's part references its own part of the
            # run's previous restore point (28.7).
            incremental=chosen,
        )
        self.objects: dict[str, Any] = {}
        self.step = 0
        self.epoch = 0
        self.batch = 0
        self.resumed_from: Position | None = None
        # The copy of a store import on its way into the run directory (resume_from.Landing).
        self._landing: Landing | None = None
        self.last_pause_s: float | None = None
        self._start_epoch = 0
        # The step of the newest snapshot taken or resumed from (None: none yet).
        self._snapshot_step: int | None = None
        self._status = "running"
        self._disk_full_said = False
        self._resubmits = 0
        self._reports: list[Path] = []
        self._upload_deadline: float | None = None
        # The error resume() raised, if any: under a supervisor it ends the trainer with its
        # exit code (3 for a gate refusal) instead of a traceback.
        self._refused: RestorePointError | None = None
        # Each rank publishes its own part of a snapshot (spec section 25), on its worker
        # thread; the parts are gathered on a group of their own (gloo, whatever the training
        # backend), so that the training thread's collectives never meet the worker's.
        self._group: Any = None
        # The training thread's own agreements (the flags at each boundary, a run already
        # completed, the resume's step, the stop's barrier) go on a second gloo group: the
        # default group may carry no CPU tensor (an NCCL job's has no CPU backend), and the
        # worker's group is the worker thread's. Its timeout covers a rank that waits at the
        # stop's barrier for the others' publishes.
        self._control: Any = None
        if self._world > 1:
            self._group = torch.distributed.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=max(upload_timeout, 60.0))
            )
            self._control = torch.distributed.new_group(
                backend="gloo",
                timeout=max(
                    torch.distributed.default_pg_timeout,
                    datetime.timedelta(seconds=upload_timeout + 60.0),
                ),
            )
        self.publisher = Publisher(
            self.directory,
            self.store,
            self.options,
            keep_last=keep_last,
            rank=self._rank,
            world=self._world,
            group=self._group,
            head=self._head,
            event=self._event,
            keep_best=self.keep_best,
            background=_background(background),
        )
        #: Each publish's outcome, newest last (rank 0 with a process group).
        self.uploads = self.publisher.uploads
        # The previous snapshot's copy, reused by the next one (its pages already faulted in:
        # the pause is a copy, not an allocation).
        self._buffers = Buffers()
        self.worker: SnapshotWorker[Snapshot] = SnapshotWorker(
            self.publisher.save_and_publish,
            nice=background_nice,
            done=lambda snap: None if snap.live else self._buffers.give(snap.state),
            prepare=self.publisher.prepare,
        )

    # -- what this run is -----------------------------------------------------------------------

    def _local_view(
        self,
        trainer: tuple[str, str] | None,
        terms: Mapping[str, str] | None,
        cache_keys: Mapping[str, str] | Callable[[Mapping[str, Any]], Mapping[str, str]] | None,
        cache_root: str | None,
    ) -> Expectations:
        """What this run is: the head of every restore point it packs, and the gate of every
        one it resumes from (spec section 16.4)."""
        sources = {
            "trainer": "ResumableRun(trainer=...)" if trainer else "restorepoint.torch (default)",
            "terms": TORCH_TERMS_SOURCE + (", ResumableRun(terms=...)" if terms else ""),
            "config": "ResumableRun(config)",
            "cache_keys": "ResumableRun(cache_keys=...)",
            "cache_root": "ResumableRun(cache_root=...)",
            "world_size": "torch.distributed" if self._world > 1 else "one process",
        }
        if callable(cache_keys):
            cache_keys = cache_keys(self.config)
            sources["cache_keys"] += ", computed"
        if cache_root is None:
            cache_root = cache_root_from_env()
            sources["cache_root"] = (
                "RESTOREPOINT_CACHE_ROOT" if cache_root else "ResumableRun(cache_root=None)"
            )
        return Expectations(
            trainer=Trainer(*(trainer or ("restorepoint.torch", __version__))),
            terms={**torch_terms(), **dict(terms or {})},
            cache_keys={str(k): str(v) for k, v in dict(cache_keys or {}).items()},
            cache_root=cache_root,
            config=self.config,
            world_size=self._world,
            sources=sources,
        )

    def local_view(self) -> Expectations:
        """What this run expects of a restore point it resumes from: its trainer, the terms
        detected here (and those given), its cache root and cache keys, and its config (by
        identity), each with where it came from."""
        return self._view

    @property
    def trainer(self) -> tuple[str, str]:
        trainer = self._view.trainer
        assert isinstance(trainer, Trainer)
        return trainer.name, trainer.version

    @property
    def terms(self) -> dict[str, str]:
        assert isinstance(self._view.terms, Mapping)
        return dict(self._view.terms)

    def _head(self, position: Position, metrics: Mapping[str, float]) -> HeadSpec:
        return HeadSpec.from_view(
            self._view, position, operational_keys=self.operational, run=self.run_id,
            metrics=metrics,
        )  # fmt: skip

    @property
    def snapshot_signal(self) -> int:
        return self.flags.snapshot_signal

    @property
    def stop_signals(self) -> tuple[int, ...]:
        return self.flags.stop_signals

    @property
    def is_main(self) -> bool:
        return self._rank == 0

    @property
    def position(self) -> Position:
        return Position(self.step, self.epoch, self.batch)

    def _barrier(self) -> None:
        # Without a process group a barrier is a no-op, so one process runs the same loop.
        if self._world > 1:
            torch.distributed.barrier(group=self._control)

    # -- context -----------------------------------------------------------------------------

    def __enter__(self) -> ResumableRun:
        self.directory.create()
        try:
            attach_identity(self)
        except RestorePointError as exc:
            # A run directory of another config: one line and exit 3, under a supervisor or
            # alone; nothing of the directory is touched.
            self._report_refusal(exc)
            raise SystemExit(exc.exit_code) from exc
        previous = self.directory.status()
        exit_if_completed(self, previous)
        carried = previous.get("resubmit_count", 0)
        self._resubmits = carried if isinstance(carried, int) and carried >= 0 else 0
        self._write_status("running")
        self.flags.install()
        self.worker.start()
        report_up(self)
        return self

    def _report_refusal(self, exc: RestorePointError) -> None:
        report_refusal(exc, main=self.is_main)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._landing is not None:
            self._landing.join()
            self._landing = None
        if exc_type is None and self.final_snapshot and self.step not in (0, self._snapshot_step):
            # The state at completion, published: a rerun elsewhere finds the run done, not
            # its last periodic snapshot to train on from.
            self.snapshot()
        report_down(self)
        try:
            self._finish_uploads()
        finally:
            self.publisher.close()
            self._buffers.close()
            end_stop(self)
            self.flags.restore()
            if self.publisher.marker is not None:
                self.publisher.marker.release()
        if exc is not None and exc is self._refused and os.environ.get(READY_ENV):
            self._write_status("failed", error=f"{type(exc).__name__}: {exc}")
            self._report_refusal(self._refused)
            raise SystemExit(self._refused.exit_code) from None
        if exc_type is None:
            self._write_status("completed")
        elif isinstance(exc, SystemExit) and exc.code == EXIT_RESUMABLE:
            pass  # status "preempted" was written before the exit
        elif isinstance(exc, SystemExit) and exc.code == 1 and self._status == "failed":
            pass
        else:
            self._write_status("failed", error=f"{exc_type.__name__}: {exc}")

    # -- status and events -------------------------------------------------------------------

    def _write_status(self, status: str, **extra: Any) -> None:
        write_status(self, status, **extra)

    def _event(self, kind: str, **fields: Any) -> None:
        append_event(self, kind, **fields)

    @property
    def tracker_run_id(self) -> str | None:
        """A tracker's run id (W&B, MLflow) kept beside the run, best effort."""
        return self.directory.tracker_run_id

    @tracker_run_id.setter
    def tracker_run_id(self, value: str) -> None:
        with contextlib.suppress(OSError):
            self.directory.set_tracker_run_id(value)

    # -- requests ----------------------------------------------------------------------------

    def request_snapshot(self) -> None:
        """Ask for a snapshot at the next effective-batch boundary (what SIGUSR1 does)."""
        self.flags.snapshot = True

    def request_stop(self) -> None:
        """Ask to snapshot and exit 42 at the next boundary (what SIGTERM does)."""
        self.flags.stop = True

    # -- tracking and resuming ---------------------------------------------------------------

    def track(self, **objects: Any) -> None:
        """Objects whose state goes into every snapshot: anything with state_dict() and
        load_state_dict() (model, optimizer, scheduler, AMP grad scaler, ...)."""
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise UsageError(f"{name} has no state_dict/load_state_dict")
            self.objects[name] = obj

    def _rank_file(self) -> str:
        return rank_file(self._rank, self._world)

    def resume(self) -> Position:
        """Restore the newest matching snapshot (the run directory's, or the store's newest
        restore point of this run, whichever is further on), or start fresh. Returns the
        position training resumes at.

        Every restore point resumed from passes the strict gate against this run's local view
        first (``local_view``: trainer, terms, cache root, cache keys, config), under the trust
        policy (``trust=``, else ``$RESTOREPOINT_TRUST``); a refusal raises
        IncompatibleRestorePoint, never a silent fresh start, and the newest restore point of
        the run being refused is not silently replaced by an older one (``accept_older``).
        Every checkpoint file is loaded weights-only: one that would run code is refused
        (UnsafeCheckpoint) before anything of it is built. Under ``restorepoint run`` a
        refusal ends the trainer with its exit code (3, or 1), which is not requeued."""
        position = resume(self)
        self.worker.begin()  # the publish process starts now, not beside the resume's work
        return position

    # -- the loop ----------------------------------------------------------------------------

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs still to train, from the resumed one on."""
        for epoch in range(self._start_epoch, total):
            if epoch != self.epoch:
                self.epoch, self.batch = epoch, 0
            yield epoch
        self.epoch, self.batch = total, 0

    def sampler(
        self, length: int, batch_size: int, accumulate: int = 1, shuffle: bool = True
    ) -> EpochSampler:
        """The current epoch's sampler: the order of ``seed + epoch``, without the samples of
        the effective batches already committed in this epoch."""
        skip = self.batch * batch_size * accumulate
        return EpochSampler(length, self.seed, self.epoch, skip=skip, shuffle=shuffle)

    def generator(self) -> torch.Generator:
        """A generator for the current epoch (seeded with ``seed + epoch``). Give it to the
        DataLoader: otherwise the loader draws its workers' base seed from the global RNG when
        its iterator starts, and a resumed epoch, which starts its iterator later in the RNG's
        stream, would see other dropout masks and augmentations from then on."""
        return torch.Generator().manual_seed(self.seed + self.epoch)

    def dataloader(
        self,
        dataset: Any,
        batch_size: int,
        accumulate: int = 1,
        shuffle: bool = True,
        **kwargs: Any,
    ) -> torch.utils.data.DataLoader[Any]:
        """A DataLoader for the current epoch: ``sampler`` (the epoch's order, committed
        batches skipped) and ``generator`` (the epoch's, so the global RNG is not touched).
        Other keyword arguments (num_workers, collate_fn, ...) go to the DataLoader; with
        workers, they ignore the run's signals (``signals.ignore_in_worker``)."""
        if kwargs.get("num_workers"):
            kwargs["worker_init_fn"] = functools.partial(
                ignore_in_worker, self.flags.signals, kwargs.get("worker_init_fn")
            )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler(len(dataset), batch_size, accumulate, shuffle),
            generator=self.generator(),
            **kwargs,
        )

    effective_batches = staticmethod(effective_batches)

    def commit(self, metrics: Mapping[str, float] | None = None) -> None:
        """One effective batch is done: count it, snapshot when due, and act on signals (a
        stop request snapshots, waits for the upload within ``upload_timeout``, and exits 42).
        ``metrics`` (name to finite number, e.g. a validation loss) are recorded in the head of
        the next snapshot, for ``keep_best`` (spec 4.3, 19.5); a snapshot takes them once."""
        if metrics:
            try:
                self._metrics = {**self._metrics, **check_metrics(metrics)}
                check_metrics(self._metrics)
            except IntegrityError as exc:
                raise UsageError(f"bad metrics ({exc})") from None
        self.worker.begin()
        self.step += 1
        self.batch += 1
        snapshot, stop = self._agree()
        due = self.snapshot_every is not None and self.step % self.snapshot_every == 0
        if stop:
            self._stop()
        if snapshot or due:
            received: list[int] = []
            if snapshot:
                # Taken before the copy: a request that arrives during this snapshot gets one of
                # its own at the next boundary, and each signal is chained exactly once.
                self.flags.snapshot = False
                received = self.flags.take({self.flags.snapshot_signal})
            self.snapshot()
            self.flags.chain(received)

    def _agree(self) -> tuple[bool, bool]:
        """Every rank acts on a signal at the same step: the flags are or-ed across ranks."""
        snapshot, stop = self.flags.snapshot, self.flags.stop
        if self._world > 1:
            t = torch.tensor([int(snapshot), int(stop)], dtype=torch.int64)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self._control)
            snapshot, stop = bool(t[0]), bool(t[1])
        return snapshot, stop

    def snapshot(self, wait: bool = False, *, live: bool = False) -> float:
        """Copy the state to memory (the only pause), hand it to the background thread, and
        return the pause in seconds. With ``wait``, also wait for it to be saved and uploaded.
        ``live`` (the stop's: training waits for the publish, then the process exits): the
        CPU tensors are published from their own memory, not copied."""
        started = time.perf_counter()
        # Every tensor's copy is made together, once the whole state is known to be storable:
        # on a few threads, since training waits for all of it.
        copies = Copies(live=live)
        state = {
            "config": self.config,
            "format": STATE_FORMAT,
            "identity": self.identity,
            "objects": {
                name: to_cpu(obj.state_dict(), f"objects[{name!r}]", self._buffers, copies)
                for name, obj in self.objects.items()
            },
            "operational_keys": self.operational,
            "position": self.position.to_dict(),
            "rank": self._rank,
            "resubmit_count": self._resubmits,
            "rng": to_cpu(rng_state(), buffers=self._buffers, copies=copies),
            "run": self.run_id,
            "world_size": self._world,
        }
        copies.run()
        snap = Snapshot(state, self.position, self._metrics, stepped_bytes(self.objects), live=live)
        self._metrics = {}
        if self._world > 1:
            # Every rank's worker saves and publishes its part of each snapshot in the same
            # order, agreeing with the others on its worker's own group (spec 25): none is
            # handed a snapshot while its last is in hand, so none is coalesced away.
            self.wait()
        self.worker.submit(snap)
        # The pause is the copy (with a process group, and the wait for the last snapshot).
        pause = time.perf_counter() - started
        self.last_pause_s = pause
        self._snapshot_step = self.step
        if wait:
            self.wait()
        self._event("snapshot", step=self.step, pause_s=round(pause, 6))
        return pause

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the snapshots handed over are saved and uploaded; False on timeout."""
        return self.worker.wait(timeout)

    def _stop(self) -> None:
        stop(self)

    def _finish_uploads(self) -> None:
        finish_uploads(self)
