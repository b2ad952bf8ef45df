"""PyTorch Lightning: a preemption callback, resuming, and the adapter (docs/adapters.md,
"Lightning").

    trainer = pl.Trainer(plugins=[SLURMEnvironment(auto_requeue=False)],
                         callbacks=[PreemptionCallback(ckpt_dir, store="s3://bucket/runs/",
                                                       config=cfg),
                                    ModelCheckpoint(ckpt_dir, save_last=True)])
    trainer.fit(model, ckpt_path=resume_checkpoint(ckpt_dir, store="s3://bucket/runs/",
                                                   config=cfg))

- On the preemption signal (``$SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2 when unset) the callback
  saves ``last.ckpt`` (a temporary ``last.ckpt.preempt``, fsync, rename, fsync of the
  directory), packs it into the store when one is configured, then calls the handler installed
  before it (submitit's requeue). Its own failures are logged and recorded, never raised: the
  requeue must run whatever happened to the save.
- Every ``ModelCheckpoint(save_last=...)`` writing to the same directory is pointed at that
  ``last.ckpt`` first; otherwise its version counter would write every later save to
  ``last-v1.ckpt`` while the next job resumes the stale ``last.ckpt``.
- ``resume_checkpoint`` is what ``trainer.fit(ckpt_path=...)`` resumes from: ``last.ckpt``, or
  the store's newest restore point of the run imported through the gate, or None (fresh).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal as signals
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from .._posix import fsync_dir, fsync_file
from ..errors import MissingExtra, RestorePointError, UsageError
from ..format import Manifest, Position, Trainer
from ..ops import Expectations, describe
from ..ops.local_view import DATA_KEY, cache_root_from_env, data_digest
from ..ops.publish import HeadSpec, PackOptions, publish
from ..ops.resume import choose, resume_import
from ..runtime.detect import TORCH_TERMS_SOURCE, torch_terms
from ..runtime.safe_load import check_loadable, safe_load
from ..trust import Trust
from .base import Snapshot, TrainerInfo, preempt_signal, send_signal

try:
    import torch  # noqa: F401 - the extra's presence

    try:
        import lightning.pytorch as pl
        from lightning import __version__ as _LIGHTNING_VERSION
        from lightning.pytorch.callbacks import ModelCheckpoint
    except ImportError:  # pragma: no cover - the standalone package only
        import pytorch_lightning as pl  # type: ignore[no-redef]
        from pytorch_lightning import __version__ as _LIGHTNING_VERSION  # type: ignore[attr-defined]
        from pytorch_lightning.callbacks import ModelCheckpoint  # type: ignore[assignment]
except ImportError as exc:  # pragma: no cover - exercised without lightning
    raise MissingExtra("lightning", "lightning", "the lightning adapter") from exc

__all__ = [
    "LAST",
    "LightningAdapter",
    "PreemptionCallback",
    "preempt_signal",
    "resume_checkpoint",
]

log = logging.getLogger("restorepoint.lightning")

#: The checkpoint a preempted job leaves and a requeued one resumes from.
LAST = "last.ckpt"
_PARTIAL = LAST + ".preempt"


def _trainer_info() -> TrainerInfo:
    lightning = str(_LIGHTNING_VERSION)
    return TrainerInfo("lightning", lightning, {**torch_terms(), "lightning": lightning})


def _local_view(
    config: Mapping[str, Any] | None,
    cache_keys: Mapping[str, str] | None,
    cache_root: str | None,
    terms: Mapping[str, str] | None = None,
) -> Expectations:
    """What a Lightning run here expects of a restore point: the installed Lightning (its
    name and version), the terms detected here and those given, the cache root and cache keys
    it packs with (none unless given), and its config."""
    info = _trainer_info()
    root = cache_root if cache_root is not None else cache_root_from_env()
    values: dict[str, Any] = {
        "trainer": Trainer(info.name, info.version),
        "terms": {**info.terms, **dict(terms or {})},
        "cache_keys": dict(cache_keys or {}),
        "cache_root": root,
    }
    sources = {
        "trainer": "detected: the installed lightning",
        "terms": f"{TORCH_TERMS_SOURCE}, lightning" + (", terms=" if terms else ""),
        "cache_keys": "cache_keys=" if cache_keys else "cache_keys= (none given)",
        "cache_root": "cache_root="
        if cache_root is not None
        else ("RESTOREPOINT_CACHE_ROOT" if root is not None else "cache_root= (none given)"),
    }
    if config is not None:
        values["config"] = dict(config)
        sources["config"] = "config="
    return Expectations(**values, sources=sources)


def _run_id(run: str | None, config: Mapping[str, Any] | None, operational: Iterable[str]) -> str:
    """The run a restore point is packed under, as pack derives it (``cfg-`` and the config
    identity when only a config is given); describe validates both on the way."""
    head = describe(position=0, config=config, operational_keys=operational, run=run)
    if head.run is None:
        raise UsageError("a store needs a run: give run= or config=")
    return head.run


class PreemptionCallback(pl.Callback):
    """Save ``DIRPATH/last.ckpt`` on the preemption signal, then chain to the handler that was
    there before (submitit's requeue).

    The handler is installed when fit sets up (``setup``), before the DataLoader workers are
    forked, so that they inherit it and ignore the signal (submitit's handler, inherited,
    would requeue from a worker). It saves only once training has started
    (``on_train_start``): before the first step there is nothing newer than what was resumed,
    and a save while Lightning restores a checkpoint would replace a good last.ckpt with a
    half-restored state; until then the signal goes straight to the previous handler. The
    callback's teardown restores the previous handler. When fit fails, the callbacks'
    teardown does not run and Lightning's own signal teardown puts back the handlers it found
    (ours among them): our handler then hands every signal to the previous one and puts it
    back.

    A signal that arrives during a training step (between ``on_train_batch_start`` and
    ``on_train_batch_end``) is acted on at the end of that step, where Lightning's own
    mid-epoch checkpoints are taken: a save in the middle of ``optimizer.step()`` would hold
    half-updated weights. With several processes every signal waits for a step's end, where
    the ranks agree, so that all of them save at the same step.

    ``store``, ``run``/``config``, ``operational``, ``keep_last`` and ``pack_options`` (the
    fields of ``PackOptions``: ``level``, ``storage_options``, ``sign``, ...)
    configure the restore point packed after each save. ``events`` records what each signal
    did (``saved``, ``save_failed``, ``packed``, ``pack_failed``)."""

    def __init__(  # noqa: PLR0913 - the callback's documented keyword options
        self,
        dirpath: str | os.PathLike[str],
        *,
        signal: str | int | None = None,
        store: str | None = None,
        run: str | None = None,
        config: Mapping[str, Any] | None = None,
        operational: Sequence[str] = (),
        keep_last: int | None = None,
        cache_keys: Mapping[str, str] | None = None,
        cache_root: str | None = None,
        terms: Mapping[str, str] | None = None,
        **pack_options: Any,
    ) -> None:
        super().__init__()
        self.dirpath = Path(dirpath)
        self.signum = preempt_signal(signal)
        self.store = store
        self.config = config
        self.operational = tuple(operational)
        # The head's identity part is the local view a resume compares with.
        self.view = _local_view(config, cache_keys, cache_root, terms)
        self.keep_last = keep_last
        try:
            self.options = PackOptions(**pack_options)
        except TypeError as exc:
            raise UsageError(f"PreemptionCallback: {exc}") from None
        self.run = _run_id(run, config, self.operational) if store is not None else run
        self.events: list[dict[str, Any]] = []
        self._trainer: pl.Trainer | None = None
        self._handler = self._on_signal  # one bound method, to recognise it when installed
        self._previous: Any = None
        self._installed = False
        self._armed = False
        self._pid = os.getpid()
        self._in_step = False
        self._pending: int | None = None
        self._busy = False

    # -- hooks --------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._trainer = trainer
            self._install()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        self.dirpath.mkdir(parents=True, exist_ok=True)
        if (self.dirpath / LAST).is_file():
            # Resumed (or restarted beside an older run): a ModelCheckpoint whose saved
            # last_model_path was not restored (another directory) would otherwise count
            # versions past this file.
            self._point_model_checkpoints(trainer)
        self._armed = True

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

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._act_on_pending(trainer)
        self._armed = False

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._in_step = self._armed = False
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._armed = False
        self._restore()

    # -- the signal ---------------------------------------------------------------------------

    def _install(self) -> None:
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: no preemption handler installed")
            return
        self._pid = os.getpid()
        self._previous = signals.signal(self.signum, self._handler)
        self._installed = True

    def _restore(self) -> None:
        self._installed = False
        self._pending = None
        if signals.getsignal(self.signum) != self._handler:
            return
        previous = self._previous if self._previous is not None else signals.SIG_DFL
        with contextlib.suppress(ValueError, TypeError):
            signals.signal(self.signum, previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked DataLoader worker inherits the handler, and Slurm signals every process
            # of the step: the main process saves; the worker neither saves nor requeues.
            return
        trainer = self._trainer
        if not self._installed:
            # Put back after fit ended (Lightning's teardown restores what it found): behave
            # as the previous handler, and make it the handler again.
            self._restore()
            self._chain(signum, frame)
            return
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
        if trainer.world_size > 1:
            # Every rank calls this at every step's end, so the collective always matches.
            pending = bool(trainer.strategy.reduce_boolean_decision(pending, all=False))
        if not pending:
            return
        signum, self._pending = self._pending, None
        self.preserve(trainer)
        if signum is not None:
            self._chain(signum, None)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        """The handler that was there before ours (submitit's requeue, which exits): what it
        raises is its business and goes up. SIG_DFL or SIG_IGN: training goes on."""
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    # -- saving -------------------------------------------------------------------------------

    def preserve(self, trainer: pl.Trainer) -> bool:
        """Save ``last.ckpt`` now (and pack it into the store): what the signal does. Never
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
                self._pack(step, epoch)
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

    def _pack(self, step: int, epoch: int) -> None:
        head = HeadSpec.from_view(
            self.view, Position(step, epoch), operational_keys=self.operational, run=self.run
        )
        try:
            result = publish(
                self.dirpath,
                self.store or "",
                head,
                self.options,
                include=[LAST],
                keep_last=self.keep_last,
            )
        except Exception as exc:  # last.ckpt is saved; the requeue must still run
            log.error("packing last.ckpt at step %d failed: %s: %s", step, type(exc).__name__, exc)
            self._record("pack_failed", step=step, error=f"{type(exc).__name__}: {exc}")
            return
        self._record("packed", step=step, url=result.url)
        if result.prune_error is not None:
            self._record("prune_failed", step=step, error=str(result.prune_error))

    def _record(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})


def resume_checkpoint(  # noqa: PLR0913 - public API: the trainer's resume options, keyword-only
    dirpath: str | os.PathLike[str],
    store: str | None = None,
    run: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    operational: Sequence[str] = (),
    storage_options: dict[str, Any] | None = None,
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    terms: Mapping[str, str] | None = None,
    trust: Trust | None = None,
    accept_older: bool = False,
    safe_globals: Sequence[Any] = (),
) -> str | None:
    """What ``trainer.fit(model, ckpt_path=..., weights_only=True)`` resumes from:
    ``DIRPATH/last.ckpt`` when it exists; else, with a store, the newest restore point of the
    run (``run``, or the one pack derives from ``config``), imported into DIRPATH as
    ``last.ckpt`` through the strict gate (trainer, terms, cache keys, cache root and config of
    this machine, as ``PreemptionCallback`` packs them; spec section 16) under the trust policy
    (``trust``, else ``$RESTOREPOINT_TRUST``); else a warning and None, and training starts
    fresh.

    Before the path is returned, the checkpoint is loaded weights-only (tensors and plain data,
    and the classes in ``safe_globals`` that the caller vouches for): one that would run code
    is refused with UnsafeCheckpoint. Lightning 2.6 unpickles in full unless
    fit is given ``weights_only=True``: pass it (docs/adapters.md).

    A preemption before the callback was installed (during data setup, say) leaves no
    last.ckpt: that is the fresh start. A refusal of the gate or a store that cannot be read
    is raised: starting over would throw the run's progress away; a refusal of the newest
    restore point names the older ones that would pass (``accept_older`` takes the newest)."""
    directory = Path(dirpath)
    last = directory / LAST
    if last.is_file():
        check_loadable(last, extra_globals=safe_globals)
        return str(last)
    where = f"no {LAST} in {directory}"
    if store is not None:
        run_id = _run_id(run, config, operational) if (run or config is not None) else None
        if run_id is None:
            raise UsageError("resuming from a store needs run= or config=")
        view = _local_view(config, cache_keys, cache_root, terms)
        entry = choose(
            store,
            run=run_id,
            views=[view],
            accept_older=accept_older,
            trust=trust,
            storage_options=storage_options,
            hints=LIGHTNING_HINTS,
        )
        if entry is None:
            where += f" and no restore point in {store}"
        else:
            _import_last(entry.url, directory, view, trust, storage_options, safe_globals)
            log.info("resuming from %s (step %d), imported as %s", entry.url, entry.step, last)
            return str(last)
    warnings.warn(f"{where}: starting fresh", UserWarning, stacklevel=2)
    return None


#: What a refusal says to give, in this module's words.
LIGHTNING_HINTS = {
    "trainer": "the restore point was not made by Lightning",
    "terms": "give terms=",
    "cache_root": "give cache_root= or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give cache_keys=",
    "config": "give config=",
}


def _import_last(  # noqa: PLR0913, PLR0917 - the pieces of one gated import, passed on from resume_checkpoint
    url: str,
    directory: Path,
    view: Expectations,
    trust: Trust | None,
    storage_options: dict[str, Any] | None,
    safe_globals: Sequence[Any],
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # Imported beside last.ckpt and renamed: the same file system, so the rename is atomic.
    staging = directory / f".restorepoint-import-{secrets.token_hex(6)}"
    try:
        resume_import(
            url,
            staging,
            views=[view],
            trust=trust,
            storage_options=storage_options,
            hints=LIGHTNING_HINTS,
        )
        if not (staging / LAST).is_file():
            raise UsageError(f"the restore point holds no {LAST}", url=url)
        # Checked where it lies, before it takes last.ckpt's name: a checkpoint that would
        # run code never becomes the one a requeued job resumes from.
        check_loadable(staging / LAST, extra_globals=safe_globals)
        os.replace(staging / LAST, directory / LAST)
        fsync_dir(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class LightningAdapter:
    """PyTorch Lightning with restorepoint.adapters.lightning.PreemptionCallback (last.ckpt)."""

    name = "lightning"

    def __init__(self, signal_name: str | None = None) -> None:
        self.snapshot_signal = preempt_signal(signal_name)

    def trainer(self) -> TrainerInfo:
        return _trainer_info()

    def local_view(
        self,
        config: Mapping[str, Any] | None = None,
        data: Path | None = None,
        *,
        cache_root: str | None = None,
        command: Sequence[str] = (),
    ) -> Expectations:
        """The installed Lightning and the terms detected here; the cache root given (or in
        ``$RESTOREPOINT_CACHE_ROOT``); the data digest of ``data`` as the cache key ``data``,
        else none (the callback packs none unless given); the config."""
        keys = {DATA_KEY: data_digest(data)} if data is not None else None
        view = _local_view(config, keys, cache_root)
        if config is not None:
            view = replace(view, sources={**view.sources, "config": "--config"})
        if data is not None:
            view = replace(
                view, sources={**view.sources, "cache_keys": "computed: data digest of --data"}
            )
        return view

    def request_snapshot(self, pid: int) -> None:
        """Send the preemption signal: the callback saves last.ckpt and chains to the handler
        before it (submitit's requeue stops the job; with none, training goes on)."""
        send_signal(pid, self.snapshot_signal)

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """``workdir/last.ckpt`` (or ``workdir/checkpoints/last.ckpt``, Lightning's default
        layout). It is committed once it exists: the callback renames it into place whole.
        Step and epoch are the checkpoint's own ``global_step`` and ``epoch``."""
        for root in (workdir, workdir / "checkpoints"):
            path = root / LAST
            if not path.is_file():
                continue
            try:
                # mmap: the tensors of a multi-GB checkpoint are not read to learn its step.
                state = safe_load(path, mmap=True)
                position = Position(int(state["global_step"]), int(state["epoch"]))
            except (RestorePointError, KeyError, TypeError, ValueError) as exc:
                log.warning("%s is not a readable Lightning checkpoint: %s", path, exc)
                return None
            return Snapshot(root, (LAST,), position)
        return None

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """The trainer's command with ``--ckpt_path RESTORED/last.ckpt`` (LightningCLI's
        ``fit`` option; a script of your own passes it to ``trainer.fit(ckpt_path=...)``)."""
        return [*base, "--ckpt_path", str(restored / LAST)]
