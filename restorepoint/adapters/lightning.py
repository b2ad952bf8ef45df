"""PyTorch Lightning: a stop callback, resuming, and the adapter (docs/adapters.md,
"Lightning").

    trainer = pl.Trainer(plugins=[SLURMEnvironment(auto_requeue=False)],
                         callbacks=[PreemptionCallback(ckpt_dir, store="s3://bucket/runs/",
                                                       config=cfg),
                                    ModelCheckpoint(ckpt_dir, save_last=True)])
    trainer.fit(model, ckpt_path=resume_checkpoint(ckpt_dir, store="s3://bucket/runs/",
                                                   config=cfg), weights_only=True)

- A **stop** (SIGTERM, SIGINT, or the preemption signal: ``$SUBMITIT_PREEMPT_SIGNAL``,
  SIGUSR2 when unset) that no earlier handler owns is acted on at the next step boundary:
  ``last.ckpt`` is saved (a temporary ``last.ckpt.preempt``, fsync, rename, fsync of the
  directory), published into the store and verified when one is configured, the Trainer
  stopped, and the process ends with exit 42 (``stop=False``: the old behaviour, a save and
  training goes on). A signal an earlier handler owns (submitit's requeue) is a save and
  then a call to that handler, which ends the job its own way.
- SIGUSR1 (with no earlier handler) is a snapshot request: a save and a publish, and
  training goes on.
- Every ``ModelCheckpoint(save_last=...)`` writing to the same directory is pointed at that
  ``last.ckpt`` first; otherwise its version counter would write every later save to
  ``last-v1.ckpt`` while the next job resumes the stale ``last.ckpt``.
- Every checkpoint Lightning writes carries the callback's identity record: a local
  ``last.ckpt`` is gated with it as a store import is (``resume_checkpoint``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal as signals
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .._posix import fsync_dir, fsync_file
from .._text import printable
from ..errors import MissingExtra, UsageError
from ..format import Position
from ..ops import entry_name, verify
from ..ops.publish import HeadSpec, PackOptions, Rest, publish
from ..ops.store import KeepBest
from ..runtime.contract import EXIT_RESUMABLE, incremental_from_env, report_ready
from ..runtime.signals import signal_name
from ._expect import run_id, store_from_env
from ._lightning_adapter import LightningAdapter
from ._lightning_metrics import best_options, keep_best_for, monitored
from ._lightning_resume import (
    IDENTITY_KEY,
    LAST,
    LIGHTNING_HINTS,
    identity_record,
    local_view,
    resume_checkpoint,
    trainer_info,
)
from ._stepped import lightning_stepped, reuse_of
from .base import preempt_signal

try:
    import torch  # noqa: F401 - the extra's presence

    try:
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
    except ImportError:  # pragma: no cover - the standalone package only
        import pytorch_lightning as pl  # type: ignore[no-redef]
        from pytorch_lightning.callbacks import ModelCheckpoint  # type: ignore[assignment]
except ImportError as exc:  # pragma: no cover - exercised without lightning
    raise MissingExtra("lightning", "lightning", "the lightning adapter") from exc

__all__ = [
    "LAST",
    "LIGHTNING_HINTS",
    "LightningAdapter",
    "PreemptionCallback",
    "Stopped",
    "preempt_signal",
    "resume_checkpoint",
]

log = logging.getLogger("restorepoint.lightning")

_PARTIAL = LAST + ".preempt"
#: The snapshot request of the stop contract (docs/preempt.md): save, publish, train on.
SNAPSHOT_SIGNAL = int(signals.SIGUSR1)
_STOP_SIGNALS = (int(signals.SIGTERM), int(signals.SIGINT))

# Kept under their old names: tests and users imported them from here.
_trainer_info = trainer_info
_local_view = local_view
_run_id = run_id


class Stopped(SystemExit):
    """The end of a stop: ``last.ckpt`` saved (and published), the Trainer stopped. It leaves
    ``trainer.fit`` as Lightning's own SIGTERM exit does, and ends the process with 42."""

    def __init__(self) -> None:
        super().__init__(EXIT_RESUMABLE)


def _owned(handler: Any) -> bool:
    """Whether an earlier handler owns a signal (submitit's, a user's): a Python callable
    other than Python's own SIGINT handler (which would only raise KeyboardInterrupt)."""
    return callable(handler) and handler is not signals.default_int_handler


class PreemptionCallback(pl.Callback):
    """On a stop (SIGTERM, SIGINT, the preemption signal) that no earlier handler owns: save
    ``DIRPATH/last.ckpt`` at the next step boundary, publish and verify it, stop the Trainer
    and end the process with exit 42 (``Stopped``). On a signal an earlier handler owns
    (submitit's requeue): save, then call that handler. On SIGUSR1 with no earlier handler: a
    snapshot (save, publish), and training goes on.

    The handlers are installed when fit sets up (``setup``), before the DataLoader workers
    are forked, so that they inherit them and ignore the signals (submitit's handler,
    inherited, would requeue from a worker). Saves start once training has started
    (``on_train_start``): before the first step there is nothing newer than what was
    resumed, and a save while Lightning restores a checkpoint would replace a good last.ckpt
    with a half-restored state. Until then a chained signal goes straight to the previous
    handler, and a stop ends the process (42) as soon as training starts, without a save.
    The callback's teardown restores the previous handlers. When fit fails, the callbacks'
    teardown does not run and Lightning's own signal teardown puts back the handlers it found
    (ours among them): our handler then hands every signal to the previous one and puts it
    back.

    A chained or snapshot signal that arrives during a training step (between
    ``on_train_batch_start`` and ``on_train_batch_end``) is acted on at the end of that step,
    where Lightning's own mid-epoch checkpoints are taken: a save in the middle of
    ``optimizer.step()`` would hold half-updated weights. A stop always waits for a boundary
    (a training step's end, a validation batch's end, an epoch's end, the end of training):
    the handler only sets a flag. With several processes every signal waits for a training
    step's end, where the ranks agree, so that all of them save at the same step.

    ``store`` (else ``$RESTOREPOINT_STORE`` when ``run`` or ``config`` names the run),
    ``run``/``config``, ``operational``, ``keep_last``, ``keep_best`` with ``metric`` and
    ``mode`` (by default the monitoring ModelCheckpoint's: each published head records the
    monitored value, spec 4.3) and ``pack_options`` (the fields of
    ``PackOptions``: ``level``, ``storage_options``, ``sign``, ...) configure the restore
    point published after each save. ``events`` records what each signal did (``saved``,
    ``save_failed``, ``packed``, ``pack_failed``, ``stopped``)."""

    def __init__(  # noqa: PLR0913 - the callback's documented keyword options
        self,
        dirpath: str | os.PathLike[str],
        *,
        signal: str | int | None = None,
        stop: bool = True,
        store: str | None = None,
        run: str | None = None,
        config: Mapping[str, Any] | None = None,
        operational: Sequence[str] = (),
        keep_last: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: str | None = None,
        cache_keys: Mapping[str, str] | None = None,
        cache_root: str | None = None,
        terms: Mapping[str, str] | None = None,
        **pack_options: Any,
    ) -> None:
        super().__init__()
        self.dirpath = Path(dirpath)
        self.signum = preempt_signal(signal)
        self.stop = stop
        self.store = store_from_env(store, run, config)
        self.config = config
        self.operational = tuple(operational)
        # The head's identity part is the local view a resume compares with.
        self.view = local_view(config, cache_keys, cache_root, terms)
        self.keep_last = keep_last
        # Retention by metric: the metric (and mode) default to the monitoring
        # ModelCheckpoint's, known at setup; given here, they are checked here.
        self._best = best_options(keep_best, metric, mode)
        self.metric = self._best[1]
        self.keep_best: KeepBest | None = None
        # Incremental into a store by default; the supervisor's --full/--incremental if unsaid.
        pack_options["incremental"] = incremental_from_env(pack_options.get("incremental"))
        try:
            self.options = PackOptions(**pack_options)
        except TypeError as exc:
            raise UsageError(f"PreemptionCallback: {exc}") from None
        self._rest = Rest()  # its publishes rest after one that would reuse too little (28.4)
        self.run = run_id(run, config, self.operational) if self.store is not None else run
        # Made here, so that a config that cannot be recorded fails now, not in every save.
        self._identity = identity_record(self.view, self.operational, self.run)
        self.events: list[dict[str, Any]] = []
        self._trainer: pl.Trainer | None = None
        self._handler = self._on_signal  # one bound method, to recognise it when installed
        self._previous: dict[int, Any] = {}
        self._stops: set[int] = set()
        self._installed = False
        self._armed = False
        self._pid = os.getpid()
        self._in_step = False
        self._pending: int | None = None
        self._stop_signum: int | None = None
        self._busy = False
        self._published: str | None = None
        self._ready: Path | None = None

    # -- hooks --------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._trainer = trainer
            self.keep_best = keep_best_for(trainer, *self._best)
            self._install(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        if self._stop_signum is not None:
            # Stopped before training started: nothing newer than what was resumed exists.
            self._end(trainer, save=False)
        self.dirpath.mkdir(parents=True, exist_ok=True)
        if (self.dirpath / LAST).is_file():
            # Resumed (or restarted beside an older run): a ModelCheckpoint whose saved
            # last_model_path was not restored (another directory) would otherwise count
            # versions past this file.
            self._point_model_checkpoints(trainer)
        self._armed = True
        self._report_ready()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._in_step = True

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._in_step = False
        self._act_on_pending(trainer)

    def on_validation_batch_end(  # noqa: PLR0913, PLR0917 - Lightning's hook signature
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        # Lightning ends validation on SIGTERM right after this hook: a stop is taken first.
        if trainer.world_size == 1 and self._stop_signum is not None and self._armed:
            self._end(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size == 1 and self._stop_signum is not None and self._armed:
            self._end(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._act_on_pending(trainer)
        self._armed = False

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if (
            self._stop_signum is not None
            and self._armed
            and isinstance(exception, SystemExit)
            and not isinstance(exception, Stopped)
        ):
            # Lightning's own SIGTERM exit, at a boundary it reached before any of ours: the
            # step is done, so the state is whole. The same ending, then: saved, exit 42.
            self._finish_stop(trainer)
            exception.code = EXIT_RESUMABLE
        self._in_step = self._armed = False
        self._report_down()
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._armed = False
        self._report_down()
        self._restore()

    def state_dict(self) -> dict[str, Any]:
        """The identity record every checkpoint carries (plain data: a weights-only load
        reads it): what ``resume_checkpoint`` gates a local ``last.ckpt`` with."""
        return {IDENTITY_KEY: self._identity}

    # -- the signals --------------------------------------------------------------------------

    def _wanted(self, trainer: pl.Trainer) -> list[int]:
        wanted = [self.signum]
        if not self.stop:
            return wanted
        wanted += [s for s in _STOP_SIGNALS if s != self.signum]
        # Lightning's own SLURM requeue (SLURMEnvironment(auto_requeue=True)) registers on
        # SIGUSR1 only when nothing has: taken by us, it would never run.
        environment = trainer._accelerator_connector.cluster_environment
        lightning_requeue = bool(getattr(environment, "auto_requeue", False)) and (
            getattr(environment, "requeue_signal", None) == SNAPSHOT_SIGNAL
        )
        if (
            self.signum != SNAPSHOT_SIGNAL
            and not lightning_requeue
            and not _owned(signals.getsignal(SNAPSHOT_SIGNAL))
        ):
            wanted.append(SNAPSHOT_SIGNAL)
        return wanted

    def _install(self, trainer: pl.Trainer) -> None:
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: no stop handler installed")
            return
        self._pid = os.getpid()
        self._stops = set()
        for signum in self._wanted(trainer):
            previous = signals.signal(signum, self._handler)
            self._previous[signum] = previous
            if self.stop and signum != SNAPSHOT_SIGNAL and not _owned(previous):
                self._stops.add(signum)
        self._installed = True

    def _restore(self) -> None:
        self._installed = False
        self._pending = None
        for signum, previous in list(self._previous.items()):
            if signals.getsignal(signum) != self._handler:
                continue
            with contextlib.suppress(ValueError, TypeError):
                signals.signal(signum, previous if previous is not None else signals.SIG_DFL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked DataLoader worker inherits the handler, and Slurm signals every process
            # of the step: the main process saves; the worker neither saves nor requeues.
            return
        if not self._installed:
            # Put back after fit ended (Lightning's teardown restores what it found): behave
            # as the previous handler, and make it the handler again. Python's SIGINT handler
            # raises KeyboardInterrupt; SIG_DFL's action is taken by sending the signal again.
            self._restore()
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            elif previous in (signals.SIG_DFL, None):
                os.kill(os.getpid(), signum)
            return
        if signum in self._stops:
            # Only a flag: the stop is acted on at the next boundary, where the state is whole.
            if self._stop_signum is None:
                self._stop_signum = signum
            return
        trainer = self._trainer
        if not self._armed or trainer is None:
            self._chain(signum, frame)
            return
        if self._busy:
            return  # a repeated signal during the save: the first one chains
        if self._in_step or trainer.world_size > 1:
            self._pending = signum
            return
        self.preserve(trainer)
        self._chain(signum, frame)

    def _act_on_pending(self, trainer: pl.Trainer) -> None:
        pending = self._pending is not None
        stop = self._stop_signum is not None
        if trainer.world_size > 1:
            # Every rank calls this at every step's end, so the collectives always match.
            pending = bool(trainer.strategy.reduce_boolean_decision(pending, all=False))
            stop = bool(trainer.strategy.reduce_boolean_decision(stop, all=False))
        if stop and self._armed:
            self._end(trainer)
        if not pending:
            return
        signum, self._pending = self._pending, None
        self.preserve(trainer)
        if signum is not None:
            self._chain(signum, None)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        """The handler that was there before ours (submitit's requeue, which exits): what it
        raises is its business and goes up. SIG_DFL or SIG_IGN: training goes on."""
        previous = self._previous.get(signum)
        if callable(previous) and previous is not signals.default_int_handler:
            previous(signum, frame)

    def _end(self, trainer: pl.Trainer, *, save: bool = True) -> None:
        """The stop contract's ending: the state at the stop saved, published and verified
        (when a store is configured), the Trainer stopped, exit 42. When the publish fails,
        the store's previous restore point stays the newest; the exit is 42 all the same."""
        self._finish_stop(trainer, save=save)
        raise Stopped

    def _finish_stop(self, trainer: pl.Trainer, *, save: bool = True) -> None:
        signum = self._stop_signum if self._stop_signum is not None else self.signum
        self._stop_signum = None
        step = int(trainer.global_step)
        saved = published = False
        if save:
            self._published = None
            saved = self.preserve(trainer)
            published = self._published is not None
        self._record("stopped", signal=signal_name(signum), step=step, saved=saved)
        if trainer.is_global_zero:
            if not save:
                what = "before training started: nothing newer than what was resumed"
            elif not saved:
                what = f"the save of {LAST} failed (see above)"
            elif self.store is None:
                what = f"{LAST} saved (no store configured)"
            elif published:
                url = printable(self._published or "")
                what = f"{LAST} saved, published and verified: {url}"
            else:
                what = (
                    f"{LAST} saved; the publish failed: the store's previous restore point "
                    "stays the newest"
                )
            print(
                f"restorepoint: stop ({signal_name(signum)}) at step {step}: {what}; exit "
                f"{EXIT_RESUMABLE}",
                file=sys.stderr,
                flush=True,
            )
        self._armed = False

    def _report_ready(self) -> None:
        """Under ``restorepoint run``: report this process up, so that the supervisor's
        notices reach it. Only when it takes SIGUSR1 (a snapshot request): one that does not
        would die of the request."""
        if SNAPSHOT_SIGNAL not in self._previous:
            return
        doc = {"pid": os.getpid(), "run": self.run, "run_dir": str(self.dirpath)}
        with contextlib.suppress(OSError):
            self._ready = report_ready(doc)

    def _report_down(self) -> None:
        if self._ready is not None:
            with contextlib.suppress(OSError):
                self._ready.unlink()
            self._ready = None

    # -- saving -------------------------------------------------------------------------------

    def preserve(self, trainer: pl.Trainer) -> bool:
        """Save ``last.ckpt`` now (and publish it into the store): what a signal does. Never
        raises; returns whether the save succeeded."""
        self._busy = True
        try:
            step, epoch = int(trainer.global_step), int(trainer.current_epoch)
            try:
                self._point_model_checkpoints(trainer)
                self._save(trainer)
            except Exception as exc:  # the requeue must run whatever happened here
                log.error(
                    "preemption save at step %d failed: %s: %s", step, type(exc).__name__, exc
                )
                self._record("save_failed", step=step, error=f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(OSError):
                    (self.dirpath / _PARTIAL).unlink()
                return False
            self._record("saved", step=step, epoch=epoch, path=str(self.dirpath / LAST))
            if self.store is not None and trainer.is_global_zero:
                self._pack(step, epoch, monitored(trainer, self.metric), lightning_stepped(trainer))
            return True
        finally:
            self._busy = False

    def _point_model_checkpoints(self, trainer: pl.Trainer) -> None:
        """Make every ModelCheckpoint(save_last=...) of this directory treat ``last.ckpt`` as
        its own. Its version counter skips a file only when it is its ``last_model_path``,
        and that path is part of its saved state, so it is set before the save."""
        here = os.path.realpath(self.dirpath)
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.save_last:
                continue
            if callback.dirpath is None or os.path.realpath(callback.dirpath) != here:
                continue
            # The exact string the callback will compute, or the comparison fails.
            path = callback.format_checkpoint_name({}, filename=callback.CHECKPOINT_NAME_LAST)
            if os.path.basename(path) == LAST:
                callback.last_model_path = path

    def _save(self, trainer: pl.Trainer) -> None:
        """A kill during the save (the grace period ends in SIGKILL) leaves the previous
        last.ckpt or the new one, never a truncated one."""
        partial, final = self.dirpath / _PARTIAL, self.dirpath / LAST
        trainer.save_checkpoint(partial)  # on every rank: some strategies save collectively
        if trainer.is_global_zero:
            fsync_file(partial)
            os.replace(partial, final)
            fsync_dir(self.dirpath)

    def _pack(
        self,
        step: int,
        epoch: int,
        metrics: Mapping[str, float] | None = None,
        stepped: int | None = None,
    ) -> None:
        head = HeadSpec.from_view(
            self.view, Position(step, epoch), operational_keys=self.operational, run=self.run,
            metrics=metrics,
        )  # fmt: skip
        try:
            # What the training steps of last.ckpt: a full fine-tune's first restore point
            # names no chunks (spec 28.4).
            self._rest.expect(reuse_of(stepped, self.dirpath, [LAST]))
            result = publish(
                self.dirpath,
                self.store or "",
                head,
                self.options,
                include=[LAST],
                keep_last=self.keep_last,
                keep_best=self.keep_best,
                rest=self._rest,
            )
            # Read back end to end before it counts as published; the prune after the publish
            # verifies the run's newest in full, and then it is not read a second time.
            report = result.pruned
            name = entry_name(result.manifest)
            if report is None or not any(plan.verified == name for plan in report.runs):
                verify(result.url, storage_options=self.options.storage_options)
        except Exception as exc:  # last.ckpt is saved; the requeue must still run
            log.error(
                "publishing last.ckpt at step %d failed: %s: %s; the store's previous restore "
                "point stays the newest",
                step,
                type(exc).__name__,
                exc,
            )
            self._record("pack_failed", step=step, error=f"{type(exc).__name__}: {exc}")
            return
        self._published = result.url
        self._record("packed", step=step, url=result.url)
        if result.prune_error is not None:
            self._record("prune_failed", step=step, error=str(result.prune_error))

    def _record(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
