"""Resumable training for plain PyTorch loops: the preemption contract (docs/adapters.md).

    with ResumableRun(config, store="s3://bucket/runs/",
                      operational=["train.checkpoint_every"],
                      snapshot_every="train.checkpoint_every") as run:
        run.track(model=model, optimizer=optimizer, scheduler=scheduler)
        run.resume()                           # restores state and position, or starts fresh
        for epoch in run.epochs(num_epochs):
            loader = run.dataloader(data, batch_size=B, accumulate=A)
            for micro_batches in run.effective_batches(loader, A):
                ...                                    # forward, backward, optimizer.step()
                run.commit()                           # one effective batch is done

- The run id and directory follow from the config identity (operational keys excluded), the seed
  and an optional name: a resubmitted job finds its own run, never another's.
- Position is counted in effective (optimizer) batches; each epoch's data order is a shuffle
  seeded with ``seed + epoch``, and the committed batches of the epoch being resumed are skipped,
  never replayed.
- Signals only set a flag; the loop acts at the next effective-batch boundary (``commit``): a
  snapshot request (SIGUSR1) snapshots and trains on; a stop request (SIGTERM, and
  ``$SUBMITIT_PREEMPT_SIGNAL`` or SIGUSR2) snapshots and exits with 42, the resumable exit.
- A snapshot pauses training only while the state is copied to memory; the local save, the pack
  and the upload run on a background thread. A failed upload is recorded and training goes on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import queue
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils.data import Sampler

from .._text import printable
from .._version import __version__
from ..errors import IncompatibleRestorePoint, NotFound, RestorePointError, UsageError
from ..format import Position, Trainer, config_identity, diff_configs
from ..ops import Expectations, latest, load_config, pack, prune
from ..ops._config import check_json_data
from ..ops.gate import decide, refuse
from ..ops.local_view import cache_root_from_env
from ..ops.resume import choose, read_head_file, resume_import
from ..runtime.contract import (
    EXIT_RESUMABLE,
    READY_ENV,
    REFUSED_FILE,
    RESUME_DIR_ENV,
    RESUME_HEAD_ENV,
    SIGNING_KEY_ENV,
    STORE_ENV,
)
from ..runtime.detect import TORCH_TERMS_SOURCE, torch_terms
from ..runtime.safe_load import safe_load
from ..trust import Trust, load_signing_key
from .base import preempt_signal, signal_number

__all__ = [
    "EXIT_RESUMABLE",
    "EpochSampler",
    "ResumableRun",
    "run_id_for",
]

log = logging.getLogger("restorepoint.torch")

STATE_FORMAT = "restorepoint.torch/1"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
#: What a refusal says to give, in the runtime's words.
RUNTIME_HINTS = {
    "trainer": "give ResumableRun(trainer=...)",
    "terms": "give ResumableRun(terms=...)",
    "cache_root": "give ResumableRun(cache_root=...) or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give ResumableRun(cache_keys=...)",
    "config": "give ResumableRun(config)",
}


def run_id_for(identity: str, seed: int, name: str | None = None) -> str:
    """The deterministic run id: a readable name and 16 hex digits of (identity, seed)."""
    digest = hashlib.sha256(f"{identity}:{seed}".encode()).hexdigest()[:16]
    prefix = _NAME_CHARS.sub("-", name or "run").strip("-.")[:40] or "run"
    if not prefix[0].isalnum():
        prefix = "r" + prefix
    return f"{prefix}-{digest}"


def _signal_name(signum: int) -> str:
    """SIGTERM, SIGUSR1, ...; real-time signals have no enum member (signal.Signals(40) raises,
    which inside a handler would crash the loop at the moment of preemption)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        rtmin = getattr(signal, "SIGRTMIN", None)
        if rtmin is not None and signum > rtmin:
            return f"SIGRTMIN+{signum - rtmin}"
        return f"SIG{signum}"


def default_stop_signals() -> tuple[int, ...]:
    """SIGTERM, and the signal submitit sends before preemption ($SUBMITIT_PREEMPT_SIGNAL,
    SIGUSR2 when unset)."""
    return (int(signal.SIGTERM), preempt_signal())


def _atomic_write(path: Path, data: bytes) -> None:
    """Write a small file so that a reader (or a crash) sees the old or the new one whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # No litter: a temporary file left in checkpoints/ would be packed with the state.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _to_cpu(value: Any) -> Any:
    """A deep copy with every tensor copied to CPU memory: what a snapshot pauses for."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return copy.deepcopy(value)


def _worker_init(
    signums: tuple[int, ...], user_init: Callable[[int], None] | None, worker_id: int
) -> None:
    """First thing in a DataLoader worker: ignore the run's signals. A scheduler signals the
    whole job, workers included; the main process acts on the signal and shuts the workers
    down itself. Left alone, a worker dies of it: torch's worker SIGTERM handler exits
    unless the parent sent it, and a spawned worker has the default action for SIGUSR1/2.
    Either fails the main process's DataLoader before it reaches the boundary. Workers still
    end on their own: when the epoch's iterator is done, and when the main process dies."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    if user_init is not None:
        user_init(worker_id)


class EpochSampler(Sampler[int]):
    """The indices of one epoch: a permutation seeded with ``seed + epoch`` (or the identity
    order), from ``skip`` on. The same for every run with the same seed, so a resumed epoch
    sees exactly the order the interrupted one saw."""

    def __init__(self, length: int, seed: int, epoch: int, skip: int = 0, shuffle: bool = True):
        self.length = length
        self.seed = seed
        self.epoch = epoch
        self.skip = max(0, min(skip, length))
        self.shuffle = shuffle

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.skip :])

    def __len__(self) -> int:
        return self.length - self.skip


@dataclass
class _Flags:
    snapshot: bool = False
    stop: bool = False
    last_signal: str | None = None
    received: list[int] = field(default_factory=list)


@dataclass
class _Snapshot:
    state: dict[str, Any]
    position: Position
    requested: float


class ResumableRun:
    """A training run that survives preemption. See the module docstring."""

    def __init__(
        self,
        config: Mapping[str, Any] | str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] = "runs",
        name: str | None = None,
        store: str | None = None,
        operational: Sequence[str] = (),
        seed: int | None = None,
        snapshot_every: int | str | None = None,
        snapshot_signal: int | str = signal.SIGUSR1,
        stop_signals: Sequence[int | str] | None = None,
        max_resubmit_attempts: int | None = None,
        keep_last: int | None = None,
        upload_timeout: float = 300.0,
        background_threads: int = 1,
        background_nice: int | None = 19,
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
    ) -> None:
        if not isinstance(config, Mapping):
            config = load_config(os.fspath(config))
        self.config: dict[str, Any] = check_json_data(dict(config))
        self.operational = sorted(set(operational))
        self.identity = config_identity(self.config, self.operational)
        self.seed = int(seed if seed is not None else self.config.get("seed", 0))
        self.run_id = run_id_for(self.identity, self.seed, name)
        self.run_dir = Path(run_dir) if run_dir is not None else Path(root) / self.run_id
        # A supervisor (restorepoint run) passes its store down; an explicit one wins.
        store = store if store is not None else os.environ.get(STORE_ENV) or None
        self.store = store if store is None or store.endswith("/") else store + "/"
        self.snapshot_every = self._resolve_every(snapshot_every)
        self.snapshot_signal = signal_number(snapshot_signal)
        self.stop_signals = tuple(
            signal_number(s) for s in (stop_signals if stop_signals else default_stop_signals())
        )
        self.max_resubmit_attempts = max_resubmit_attempts
        self.keep_last = keep_last
        self.upload_timeout = upload_timeout
        # One encode thread by default: on a small machine the pack must leave the training
        # thread a core (measured on 2 cores: benchmarks/bench_torch.py, docs/performance.md).
        self.background_threads = max(1, background_threads)
        # And at the lowest priority by default: where the cores are short, the kernel then runs
        # the training threads first (measured: the step-time slowdown fell from 33% to none).
        # A stop request gives it this process's priority back where it may (_unthrottle).
        self.background_nice = background_nice
        # The local view: what this run is, for the head of every restore point it packs and
        # for the gate of every restore point it resumes from (spec section 16).
        self.trainer = trainer or ("restorepoint.torch", __version__)
        self._sources = {
            "trainer": "ResumableRun(trainer=...)" if trainer else "restorepoint.torch (default)",
            "terms": TORCH_TERMS_SOURCE + (", ResumableRun(terms=...)" if terms else ""),
            "config": "ResumableRun(config)",
        }
        self.terms = {**torch_terms(), **dict(terms or {})}
        if callable(cache_keys):
            cache_keys = cache_keys(self.config)
            self._sources["cache_keys"] = "ResumableRun(cache_keys=...), computed"
        else:
            self._sources["cache_keys"] = "ResumableRun(cache_keys=...)"
        self.cache_keys = {str(k): str(v) for k, v in dict(cache_keys or {}).items()}
        if cache_root is None:
            cache_root = cache_root_from_env()
            self._sources["cache_root"] = (
                "RESTOREPOINT_CACHE_ROOT" if cache_root else "ResumableRun(cache_root=None)"
            )
        else:
            self._sources["cache_root"] = "ResumableRun(cache_root=...)"
        self.cache_root = cache_root
        self.level = level
        self.auto_resume = auto_resume
        self.accept_older = accept_older
        self.trust = trust
        self.safe_globals = tuple(safe_globals)
        sign = sign if sign is not None else os.environ.get(SIGNING_KEY_ENV) or None
        self._signers = [load_signing_key(sign)] if sign is not None else []
        self.storage_options = storage_options
        self.objects: dict[str, Any] = {}
        self.step = 0
        self.epoch = 0
        self.batch = 0
        self.resumed_from: Position | None = None
        self.last_pause_s: float | None = None
        self.uploads: list[dict[str, Any]] = []
        self._flags = _Flags()
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}
        self._worker: threading.Thread | None = None
        self._pending: queue.Queue[_Snapshot | None] = queue.Queue(maxsize=1)
        # Snapshots handed over and not yet saved and uploaded (a coalesced one counts once).
        self._outstanding = 0
        self._cv = threading.Condition()
        # The main thread and the snapshot worker both append events: stamped and written under
        # one lock, so events.jsonl is in time order.
        self._events_lock = threading.Lock()
        self._start_epoch = 0
        self._start_batch = 0
        self._upload_deadline: float | None = None
        # The error resume() raised, if any: under a supervisor it ends the trainer with its
        # exit code (3 for a gate refusal) instead of a traceback.
        self._refused: RestorePointError | None = None
        self._rank, self._world = self._distributed()

    # -- configuration -----------------------------------------------------------------------

    def _resolve_every(self, every: int | str | None) -> int | None:
        if isinstance(every, str):
            node: Any = self.config
            for part in every.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            every = node
        if every is None or every == 0:
            return None
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise UsageError(f"snapshot_every must be a non-negative integer, not {every!r}")
        return every

    def local_view(self) -> Expectations:
        """What this run expects of a restore point it resumes from: its trainer, the terms
        detected here (and those given), its cache root and cache keys, and its config (by
        identity), each with where it came from."""
        return Expectations(
            trainer=Trainer(*self.trainer),
            terms=dict(self.terms),
            cache_keys=dict(self.cache_keys),
            cache_root=self.cache_root,
            config=self.config,
            sources=dict(self._sources),
        )

    @staticmethod
    def _distributed() -> tuple[int, int]:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def _barrier(self) -> None:
        # Without a process group a barrier is a no-op, so one process runs the same loop.
        if self._world > 1:
            torch.distributed.barrier()

    @property
    def is_main(self) -> bool:
        return self._rank == 0

    @property
    def position(self) -> Position:
        return Position(self.step, self.epoch, self.batch)

    # -- context -----------------------------------------------------------------------------

    def __enter__(self) -> ResumableRun:
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        self._attach_identity()
        status = self._read_status()
        self._resubmits = int(status.get("resubmit_count", 0))
        self._write_status("running")
        self._install_handlers()
        self._worker = threading.Thread(target=self._work, name="rp-snapshots", daemon=True)
        self._worker.start()
        self._throttle(self._worker)
        self._report_up()
        return self

    def _report_up(self) -> None:
        """Handlers are installed: say so, to ``restorepoint snapshot`` (trainer.json in the run
        directory) and to a supervisor ($RESTOREPOINT_READY_DIR/PID.json). A signal sent before
        this would have found the default action, which for SIGUSR1 is to die."""
        doc = {
            "pid": os.getpid(),
            "rank": self._rank,
            "run": self.run_id,
            "run_dir": str(self.run_dir.resolve()),
            "snapshot_signal": self.snapshot_signal,
        }
        data = json.dumps(doc).encode() + b"\n"
        self._reports: list[Path] = []
        if self.is_main:
            _atomic_write(self.run_dir / "trainer.json", data)
            self._reports.append(self.run_dir / "trainer.json")
        ready = os.environ.get(READY_ENV)
        if ready:
            with contextlib.suppress(OSError):
                path = Path(ready) / f"{os.getpid()}.json"
                _atomic_write(path, data)
                self._reports.append(path)

    def _report_refusal(self, exc: RestorePointError) -> None:
        """One line and the mismatches on stderr, as the CLI prints them; the refused fields
        (names only) for the supervisor's telemetry."""
        lines = [f"restorepoint: error: {printable(str(exc))}"]
        lines += [f"restorepoint:   {printable(d)}" for d in getattr(exc, "details", ())]
        print("\n".join(lines), file=sys.stderr, flush=True)
        fields = [m["field"] for m in getattr(exc, "mismatches", ())]
        ready = os.environ.get(READY_ENV)
        if ready and self.is_main:
            doc = {"class": type(exc).__name__, "fields": fields, "pid": os.getpid()}
            with contextlib.suppress(OSError):
                _atomic_write(Path(ready) / REFUSED_FILE, json.dumps(doc).encode() + b"\n")

    def _report_down(self) -> None:
        for path in getattr(self, "_reports", []):
            with contextlib.suppress(OSError):
                path.unlink()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._report_down()
        try:
            self._finish_uploads()
        finally:
            self._restore_handlers()
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

    # -- identity of the run directory ------------------------------------------------------

    def _identity_record(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "config_identity": self.identity,
            "operational_keys": self.operational,
            "run": self.run_id,
            "seed": self.seed,
        }

    def _attach_identity(self) -> None:
        """Refuse a run directory that belongs to another config; adopt an older one (a
        checkpoint but no identity record) whose saved config hashes to the same identity."""
        record = self.run_dir / "config_identity.json"
        if record.exists():
            saved = json.loads(record.read_text())
            if saved.get("config_identity") != self.identity:
                self._refuse(saved.get("config") or {}, saved.get("config_identity"))
            return
        last = self.run_dir / "checkpoints" / "last.pt"
        if last.exists():
            state = safe_load(last, extra_globals=self.safe_globals)
            old = state.get("config") if isinstance(state, dict) else None
            if not isinstance(old, dict) or config_identity(old, self.operational) != self.identity:
                self._refuse(old if isinstance(old, dict) else {}, None)
            self._event("adopted", step=int(state.get("position", {}).get("step", 0)))
        if self.is_main:
            _atomic_write(record, json.dumps(self._identity_record(), indent=2).encode() + b"\n")

    def _refuse(self, other: Mapping[str, Any], other_identity: str | None) -> None:
        diffs = diff_configs(self.config, other, self.operational)
        details = [d.describe() for d in diffs] or [
            f"config_identity: expected {self.identity}, found {other_identity}"
        ]
        raise IncompatibleRestorePoint(
            f"refusing to attach: {self.run_dir} holds a run of another config "
            f"({len(details)} difference(s))",
            url=str(self.run_dir),
            mismatches=[{"field": f"config.{d.path}"} for d in diffs],
            details=details,
        )

    # -- status and events -------------------------------------------------------------------

    def _read_status(self) -> dict[str, Any]:
        path = self.run_dir / "run_status.json"
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    _status = "running"

    def _write_status(self, status: str, **extra: Any) -> None:
        self._status = status
        if not self.is_main:
            return
        doc = {
            "last_signal": self._flags.last_signal,
            "max_resubmit_attempts": self.max_resubmit_attempts,
            "resubmit_count": self._resubmits,
            "run": self.run_id,
            "status": status,
            "step": self.step,
            "updated": _now(),
            **extra,
        }
        _atomic_write(self.run_dir / "run_status.json", json.dumps(doc, indent=2).encode() + b"\n")

    def _event(self, kind: str, **fields: Any) -> None:
        if not self.is_main:
            return
        # One write of one line, then fsync: a crash leaves whole lines (at most one torn last
        # line, which readers skip).
        path = self.run_dir / "events.jsonl"
        with self._events_lock:
            line = json.dumps({"event": kind, "time": _now(), **fields}, sort_keys=True) + "\n"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    @property
    def tracker_run_id(self) -> str | None:
        """A tracker's run id (W&B, MLflow) kept beside the run, best effort."""
        try:
            return (self.run_dir / "tracker_run_id").read_text().strip() or None
        except OSError:
            return None

    @tracker_run_id.setter
    def tracker_run_id(self, value: str) -> None:
        with contextlib.suppress(OSError):
            _atomic_write(self.run_dir / "tracker_run_id", value.encode() + b"\n")

    # -- signals -----------------------------------------------------------------------------

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: no signal handlers installed")
            return
        for signum in {self.snapshot_signal, *self.stop_signals}:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _restore_handlers(self) -> None:
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # No work here: a flag for the loop. A forked DataLoader worker inherits this handler
        # and must do nothing at all (the main process snapshots).
        if os.getpid() != self._pid:
            return
        if signum in self.stop_signals:
            self._flags.stop = True
        else:
            self._flags.snapshot = True
        self._flags.last_signal = _signal_name(signum)
        self._flags.received.append(signum)

    def _chain(self, signals: Iterable[int]) -> None:
        """Run the handlers that were installed before ours, after we acted on the signal
        (submitit's requeue handler, say)."""
        for signum in signals:
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, None)

    def request_snapshot(self) -> None:
        """Ask for a snapshot at the next effective-batch boundary (what SIGUSR1 does)."""
        self._flags.snapshot = True

    def request_stop(self) -> None:
        """Ask to snapshot and exit 42 at the next boundary (what SIGTERM does)."""
        self._flags.stop = True

    # -- tracking and resuming ---------------------------------------------------------------

    def track(self, **objects: Any) -> None:
        """Objects whose state goes into every snapshot: anything with state_dict() and
        load_state_dict() (model, optimizer, scheduler, AMP grad scaler, ...)."""
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise UsageError(f"{name} has no state_dict/load_state_dict")
            self.objects[name] = obj

    def _rank_file(self) -> str:
        return "last.pt" if self._world == 1 else f"last.rank{self._rank}.pt"

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
        if not self.auto_resume:
            return self.position
        try:
            path, source = self._newest_snapshot()
            if path is None:
                if self.is_main:
                    log.info("no checkpoint of run %s: starting fresh", self.run_id)
                return self.position
            state = safe_load(path, extra_globals=self.safe_globals)
        except RestorePointError as exc:
            self._refused = exc
            # Outside a supervisor the error reaches the user as a traceback: its mismatches,
            # one a line, come with it (Python 3.11 prints an exception's notes).
            for detail in getattr(exc, "details", ()):
                if hasattr(exc, "add_note"):
                    exc.add_note(f"  {printable(detail)}")
            raise
        if (
            not isinstance(state, dict)
            or state.get("format") != STATE_FORMAT
            or state.get("identity") != self.identity
        ):
            raise IncompatibleRestorePoint(
                f"refusing to resume from {path}: it is not a snapshot of this run",
                url=str(path),
            )
        for name, obj in self.objects.items():
            if name not in state["objects"]:
                raise UsageError(f"the snapshot holds no state for {name!r}")
            obj.load_state_dict(state["objects"][name])
        self._set_rng(state["rng"])
        pos = state["position"]
        self.step, self.epoch, self.batch = pos["step"], pos["epoch"], pos["batch"]
        self._start_epoch, self._start_batch = self.epoch, self.batch
        self.resumed_from = self.position
        self._event("resumed", step=self.step, epoch=self.epoch, batch=self.batch, source=source)
        if self.is_main:
            print(
                f"restorepoint: resumed from checkpoint: global step {self.step}, start epoch "
                f"{self.epoch}, resume batch index {self.batch}, data order: shuffle seeded "
                f"with seed + epoch ({self.seed} + {self.epoch})",
                file=sys.stderr,
            )
        return self.position

    def _gate_handed(self, handed: Path) -> None:
        """A supervisor's import, gated here: the supervisor compared what it knows; this run
        knows the rest (its trainer, config, cache keys) and compares everything again."""
        head_file = os.environ.get(RESUME_HEAD_ENV) or str(handed) + ".head.json"
        head = read_head_file(head_file)
        result = decide(str(handed), head, [self.local_view()], strict=True, hints=RUNTIME_HINTS)
        if not result.compatible:
            raise refuse(result)

    def _newest_snapshot(self) -> tuple[Path | None, str]:
        handed = os.environ.get(RESUME_DIR_ENV)
        if handed and (Path(handed) / self._rank_file()).exists():
            # A supervisor imported a restore point for us (restorepoint run --resume-from).
            self._gate_handed(Path(handed))
            return Path(handed) / self._rank_file(), "supervisor import"
        local = self.run_dir / "checkpoints" / self._rank_file()
        local_step = -1
        if local.exists():
            try:
                sidecar = json.loads((local.parent / "position.json").read_text())
                local_step = int(sidecar["step"])
            except (OSError, ValueError, KeyError, TypeError):
                state = safe_load(local, extra_globals=self.safe_globals)
                local_step = int(state["position"]["step"]) if isinstance(state, dict) else -1
        if self.store is not None:
            try:
                newest = latest(self.store, run=self.run_id, storage_options=self.storage_options)
            except NotFound:
                newest = None
            entry = None
            if newest is not None and newest.step > local_step:
                entry = choose(
                    self.store,
                    run=self.run_id,
                    views=[self.local_view()],
                    accept_older=self.accept_older,
                    trust=self.trust,
                    storage_options=self.storage_options,
                    hints=RUNTIME_HINTS,
                )
            if entry is not None and entry.step > local_step:
                # Named after the restore point itself: another object of the same step (a
                # step packed again) is another import, gated on its own.
                dest = self.run_dir / "imports" / entry.name.rsplit("/", 1)[-1].removesuffix(".rp")
                if not dest.exists():
                    try:
                        resume_import(
                            entry.url,
                            dest,
                            views=[self.local_view()],
                            trust=self.trust,
                            storage_options=self.storage_options,
                            hints=RUNTIME_HINTS,
                        )
                    except RestorePointError:
                        # Ranks sharing the run directory import at once; the import is
                        # renamed into place whole, so one that is there is the winner's.
                        if not dest.exists():
                            raise
                return dest / self._rank_file(), "store"
        return (local, "run directory") if local_step >= 0 else (None, "")

    @staticmethod
    def _rng_state() -> dict[str, Any]:
        state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            state["numpy"] = numpy.random.get_state()
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def _set_rng(state: Mapping[str, Any]) -> None:
        random.setstate(state["python"])
        torch.set_rng_state(state["torch"])
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy" in state:
            numpy.random.set_state(state["numpy"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    # -- the loop ----------------------------------------------------------------------------

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs still to train, from the resumed one on."""
        for epoch in range(self._start_epoch, total):
            if epoch != self.epoch:
                self.epoch, self.batch = epoch, 0
            yield epoch
            self._start_batch = 0
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
        workers, they ignore the run's signals (see ``_worker_init``)."""
        if kwargs.get("num_workers"):
            kwargs["worker_init_fn"] = functools.partial(
                _worker_init,
                (self.snapshot_signal, *self.stop_signals),
                kwargs.get("worker_init_fn"),
            )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler(len(dataset), batch_size, accumulate, shuffle),
            generator=self.generator(),
            **kwargs,
        )

    @staticmethod
    def effective_batches(loader: Iterable[Any], accumulate: int = 1) -> Iterator[list[Any]]:
        """Group micro-batches into effective batches of ``accumulate`` (the last may be
        shorter)."""
        group: list[Any] = []
        for item in loader:
            group.append(item)
            if len(group) == accumulate:
                yield group
                group = []
        if group:
            yield group

    def commit(self) -> None:
        """One effective batch is done: count it, snapshot when due, and act on signals (a
        stop request snapshots, waits for the upload within ``upload_timeout``, and exits 42)."""
        self.step += 1
        self.batch += 1
        flags = self._agree()
        due = self.snapshot_every is not None and self.step % self.snapshot_every == 0
        if flags["stop"]:
            self._stop()
        if flags["snapshot"] or due:
            received: list[int] = []
            if flags["snapshot"]:
                # Taken before the copy: a request that arrives during this snapshot gets one of
                # its own at the next boundary, and each signal is chained exactly once.
                self._flags.snapshot = False
                received = self._take_received({self.snapshot_signal})
            self.snapshot()
            self._chain(received)

    def _take_received(self, wanted: set[int]) -> list[int]:
        """Remove and return the signals in ``wanted`` received so far. pop() one at a time:
        the handler may append between any two bytecodes, and no signal may be lost."""
        taken: list[int] = []
        received = self._flags.received
        i = 0
        while i < len(received):
            if received[i] in wanted:
                taken.append(received.pop(i))
            else:
                i += 1
        return taken

    def _agree(self) -> dict[str, bool]:
        """Every rank acts on a signal at the same step: the flags are or-ed across ranks."""
        flags = {"snapshot": self._flags.snapshot, "stop": self._flags.stop}
        if self._world > 1:
            t = torch.tensor([int(flags["snapshot"]), int(flags["stop"])], dtype=torch.int64)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flags = {"snapshot": bool(t[0]), "stop": bool(t[1])}
        return flags

    def snapshot(self, wait: bool = False) -> float:
        """Copy the state to memory (the only pause), hand it to the background thread, and
        return the pause in seconds. With ``wait``, also wait for it to be saved and uploaded."""
        started = time.perf_counter()
        state = {
            "config": self.config,
            "format": STATE_FORMAT,
            "identity": self.identity,
            "objects": {name: _to_cpu(obj.state_dict()) for name, obj in self.objects.items()},
            "operational_keys": self.operational,
            "position": self.position.to_dict(),
            "rank": self._rank,
            "rng": _to_cpu(self._rng_state()),
            "run": self.run_id,
            "world_size": self._world,
        }
        snap = _Snapshot(state, self.position, time.time())
        if self._world > 1:
            # Collectives stay on the main thread: every rank saves its own file, then rank 0
            # publishes one restore point holding them all. No rank replaces its file while
            # rank 0 still packs the previous snapshot: that pack would publish another step's
            # state under this step's name, or files of two steps in one restore point.
            if self.is_main:
                self.wait()
            self._barrier()
            self._save(snap)
            self._barrier()
            if self.is_main:
                self._submit(snap)
        else:
            self._submit(snap)
        # With a process group the pause includes the save; alone, only the copy.
        pause = time.perf_counter() - started
        self.last_pause_s = pause
        if wait:
            self.wait()
        self._event("snapshot", step=self.step, pause_s=round(pause, 6))
        return pause

    def _submit(self, snap: _Snapshot) -> None:
        with self._cv:
            # Coalesce: a snapshot still waiting is replaced by the newer one.
            try:
                self._pending.get_nowait()
            except queue.Empty:
                self._outstanding += 1
            self._pending.put(snap)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the snapshots handed over are saved and uploaded; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._outstanding == 0, timeout)

    def _throttle(self, worker: threading.Thread) -> None:
        """Lower the background thread (started, not yet given work) by background_nice; on
        Linux a nice value is per thread, and the pack threads it starts inherit it."""
        if not self.background_nice or worker.native_id is None:
            return
        with contextlib.suppress(OSError, AttributeError):
            base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            os.setpriority(os.PRIO_PROCESS, worker.native_id, min(19, base + self.background_nice))

    def _unthrottle(self) -> None:
        """On a stop request: training waits for the publish, so the background thread gets
        this process's priority back, where the process may raise it (root, or RLIMIT_NICE);
        the pack threads it starts next inherit it. Where it may not, the publish keeps its low
        priority, but with training stopped it competes only with other processes."""
        worker = self._worker
        if not self.background_nice or worker is None or worker.native_id is None:
            return
        with contextlib.suppress(OSError, AttributeError):
            base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            os.setpriority(os.PRIO_PROCESS, worker.native_id, base)

    def _stop(self) -> None:
        signals = self._take_received(set(self.stop_signals))
        limit = self.max_resubmit_attempts
        self._unthrottle()
        self.snapshot()
        # One upload_timeout for the whole stop: __exit__ waits only for what is left of it.
        self._upload_deadline = time.monotonic() + self.upload_timeout
        finished = self.wait(self.upload_timeout)
        self._resubmits += 1
        over = limit is not None and self._resubmits > limit
        self._event(
            "graceful_shutdown",
            signal=self._flags.last_signal,
            step=self.step,
            upload_finished=finished,
            resubmit_count=self._resubmits,
        )
        if over:
            self._write_status("failed", error=f"resubmit limit {limit} reached")
        else:
            self._write_status("preempted")
        self._chain(signals)
        self._barrier()
        raise SystemExit(1 if over else EXIT_RESUMABLE)

    # -- background: save, pack, upload --------------------------------------------------------

    def _work(self) -> None:
        while True:
            snap = self._pending.get()
            if snap is None:
                return
            try:
                if self._world == 1:
                    self._save(snap)
                if self.store is not None and self.is_main:
                    self._upload(snap)
            except Exception as exc:  # a failed snapshot must never stop training
                log.warning("snapshot at step %d failed: %s", snap.position.step, exc)
                self._event("snapshot_failed", step=snap.position.step, error=str(exc))
            finally:
                with self._cv:
                    self._outstanding -= 1
                    self._cv.notify_all()

    def _save(self, snap: _Snapshot) -> None:
        """torch.save to a temporary file, fsync, rename over last.pt: a kill at any moment
        leaves the previous last.pt or the new one, never a torn one."""
        target = self.run_dir / "checkpoints" / self._rank_file()
        tmp = self.run_dir / f".{target.name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(snap.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        if self.is_main:
            # A small sidecar, so choosing where to resume from needs no load of the state.
            _atomic_write(
                target.parent / "position.json", json.dumps(snap.state["position"]).encode() + b"\n"
            )

    def _upload(self, snap: _Snapshot) -> None:
        started = time.perf_counter()
        try:
            result = pack(
                self.run_dir / "checkpoints",
                self.store or "",
                position=snap.position,
                trainer=self.trainer,
                terms=self.terms,
                config=self.config,
                operational_keys=self.operational,
                cache_keys=self.cache_keys,
                cache_root=self.cache_root,
                level=self.level,
                run=self.run_id,
                storage_options=self.storage_options,
                threads=self.background_threads,
                sign=self._signers,
            )
            if self.keep_last:
                prune(
                    self.store or "",
                    keep_last=self.keep_last,
                    run=self.run_id,
                    storage_options=self.storage_options,
                )
        except RestorePointError as exc:
            self.uploads.append({"ok": False, "step": snap.position.step, "error": str(exc)})
            self._event(
                "upload_failed",
                step=snap.position.step,
                error_class=type(exc).__name__,
                error=exc.message,
            )
            return
        seconds = time.perf_counter() - started
        self.uploads.append(
            {"ok": True, "step": snap.position.step, "url": result.url, "seconds": seconds}
        )
        self._event(
            "uploaded", step=snap.position.step, seconds=round(seconds, 6), bytes=result.size
        )

    def _finish_uploads(self) -> None:
        if self._worker is None:
            return
        timeout = self.upload_timeout
        if self._upload_deadline is not None:
            timeout = max(0.0, self._upload_deadline - time.monotonic())
        if not self.wait(timeout):
            log.warning("an upload was still running after %.0f s; leaving it", self.upload_timeout)
            self._event("upload_abandoned", step=self.step)
            return
        self._pending.put(None)
        self._worker.join(timeout=5)
        self._worker = None
