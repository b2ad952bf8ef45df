"""What a Lightning job resumes from, and the identity every one of its checkpoints carries
(docs/adapters.md, "Lightning"). ``restorepoint.adapters.lightning`` is the public face.

One function decides: ``resume_checkpoint``, the same on a first run and on a requeue (it
never looks at ``SLURM_RESTART_COUNT``). Every candidate passes the gate with Lightning's
local view before Lightning sees it: a supervisor's import (``restorepoint run
--resume-from``), ``DIR/last.ckpt`` (its identity is the record the PreemptionCallback leaves
in every checkpoint), the store's newest restore point of the run.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._posix import fsync_dir
from .._text import printable
from ..errors import IncompatibleRestorePoint, MissingExtra, RestorePointError, UsageError
from ..format import Manifest, Position, Trainer
from ..ops import Expectations
from ..ops.gate import decide, refuse
from ..ops.publish import HeadSpec
from ..ops.resume import choose, read_head_file, resume_import
from ..runtime.contract import EXIT_INCOMPATIBLE, RESUME_DIR_ENV, RESUME_HEAD_ENV
from ..runtime.detect import TORCH_TERMS_SOURCE, torch_terms
from ..runtime.safe_load import check_loadable, safe_load
from ..trust import Trust
from ._expect import run_id, store_from_env, trainer_view
from .base import TrainerInfo

try:
    import torch  # noqa: F401 - the extra's presence

    try:
        from lightning import __version__ as _LIGHTNING_VERSION
    except ImportError:  # pragma: no cover - the standalone package only
        from pytorch_lightning import __version__ as _LIGHTNING_VERSION  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - exercised without lightning
    raise MissingExtra("lightning", "lightning", "the lightning adapter") from exc

log = logging.getLogger("restorepoint.lightning")

#: The checkpoint a stopped job leaves and a requeued one resumes from.
LAST = "last.ckpt"
#: The key of the identity record in the PreemptionCallback's state (every checkpoint
#: Lightning writes holds its callbacks' states).
IDENTITY_KEY = "restorepoint_head"

#: What a refusal says to give, in this module's words.
LIGHTNING_HINTS = {
    "trainer": "the restore point was not made by Lightning",
    "terms": "give terms=",
    "cache_root": "give cache_root= or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give cache_keys=",
    "config": "give config=",
}


def trainer_info() -> TrainerInfo:
    lightning = str(_LIGHTNING_VERSION)
    return TrainerInfo("lightning", lightning, {**torch_terms(), "lightning": lightning})


def local_view(
    config: Mapping[str, Any] | None,
    cache_keys: Mapping[str, str] | None,
    cache_root: str | None,
    terms: Mapping[str, str] | None = None,
) -> Expectations:
    """What a Lightning run here expects of a restore point: the installed Lightning (its
    name and version), the terms detected here and those given, the cache root and cache keys
    it packs with (none unless given), and its config."""
    info = trainer_info()
    return trainer_view(
        Trainer(info.name, info.version),
        info.terms,
        detected="the installed lightning",
        terms_source=f"{TORCH_TERMS_SOURCE}, lightning",
        config=config,
        cache_keys=cache_keys,
        cache_root=cache_root,
        given_terms=terms,
    )


def identity_record(
    view: Expectations, operational: Sequence[str], run: str | None
) -> dict[str, Any]:
    """The head a checkpoint of this callback carries (position 0: the position is the
    checkpoint's own): what a resume gates a local ``last.ckpt`` with."""
    head = HeadSpec.from_view(view, Position(0), operational_keys=operational, run=run)
    return head.manifest.head_dict()


def _recorded_head(state: Any) -> Manifest | None:
    """The identity record in a loaded checkpoint, validated as a reader validates a head;
    None when it carries none (made without the callback, or by an older restorepoint)."""
    callbacks = state.get("callbacks") if isinstance(state, dict) else None
    if not isinstance(callbacks, dict):
        return None
    for value in callbacks.values():
        if isinstance(value, dict) and isinstance(value.get(IDENTITY_KEY), dict):
            return Manifest.from_head_dict(value[IDENTITY_KEY])
    return None


def _step_of(state: Any) -> int:
    try:
        return int(state["global_step"])
    except (KeyError, TypeError, ValueError):
        return -1


def _refused(exc: IncompatibleRestorePoint, exit_on_refusal: bool) -> BaseException:
    """A refused resume: one line on stderr and exit 3 (the stop contract), or the exception
    for a caller that handles it."""
    if not exit_on_refusal:
        return exc
    print(f"restorepoint: error: {printable(str(exc))}", file=sys.stderr, flush=True)
    return SystemExit(EXIT_INCOMPATIBLE)


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
    exit_on_refusal: bool = True,
) -> str | None:
    """What ``trainer.fit(model, ckpt_path=..., weights_only=True)`` resumes from, the same on
    a first run and on a requeue; every candidate is gated with Lightning's local view (the
    installed Lightning, the terms detected here, ``cache_keys``, ``cache_root`` and
    ``config``; spec section 16):

    1. a restore point ``restorepoint run --resume-from`` imported for this job
       (``$RESTOREPOINT_RESUME_DIR``), gated with the head it hands over, renamed to
       ``DIRPATH/last.ckpt``;
    2. ``DIRPATH/last.ckpt``, gated with the identity record the PreemptionCallback leaves in
       every checkpoint (one without a record is resumed with a warning), unless the store
       holds a newer restore point of the run;
    3. with a store (``store``, else ``$RESTOREPOINT_STORE``), the run's newest restore point
       (``run``, or the one pack derives from ``config``), imported as ``DIRPATH/last.ckpt``
       under the trust policy (``trust``, else ``$RESTOREPOINT_TRUST``);
    4. else a warning and None: training starts fresh.

    A refusal is one line on stderr and exit 3 (``SystemExit``), never a silent fresh start;
    ``exit_on_refusal=False`` raises IncompatibleRestorePoint instead. A refusal of the
    store's newest names the older ones that would pass (``accept_older`` takes the newest
    that passes). A store that cannot be read is raised: starting over would throw the run's
    progress away.

    Before a path is returned, the checkpoint is loaded weights-only (tensors and plain data,
    and the classes in ``safe_globals`` that the caller vouches for): one that would run code
    is refused with UnsafeCheckpoint. Lightning 2.6 unpickles in full unless fit is given
    ``weights_only=True``: pass it (docs/adapters.md)."""
    directory = Path(dirpath)
    last = directory / LAST
    view = local_view(config, cache_keys, cache_root, terms)
    store = store_from_env(store, run, config)
    try:
        handed = os.environ.get(RESUME_DIR_ENV)
        if handed and (Path(handed) / LAST).is_file():
            _take_handed(Path(handed), directory, view, safe_globals)
            log.info("resuming from the supervisor's import, moved to %s", last)
            return str(last)
        local_step = _gate_local(last, view, safe_globals)
        if store is not None:
            if not (run or config is not None):
                raise UsageError("resuming from a store needs run= or config=")
            entry = choose(
                store,
                run=run_id(run, config, operational),
                views=[view],
                accept_older=accept_older,
                trust=trust,
                storage_options=storage_options,
                hints=LIGHTNING_HINTS,
            )
            if entry is not None and entry.step > local_step:
                _import_last(entry.url, directory, view, trust, storage_options, safe_globals)
                log.info("resuming from %s (step %d), imported as %s", entry.url, entry.step, last)
                return str(last)
    except IncompatibleRestorePoint as exc:
        raise _refused(exc, exit_on_refusal) from None
    if local_step >= 0:
        return str(last)
    where = f"no {LAST} in {directory}"
    if store is not None:
        where += f" and no restore point in {store}"
    warnings.warn(f"{where}: starting fresh", UserWarning, stacklevel=2)
    return None


def _gate_local(last: Path, view: Expectations, safe_globals: Sequence[Any]) -> int:
    """The step of ``last.ckpt`` once it passed the gate (loaded weights-only: one that would
    run code is refused first), or -1 when there is none."""
    if not last.is_file():
        return -1
    state = safe_load(last, extra_globals=safe_globals, mmap=True)
    try:
        head = _recorded_head(state)
    except RestorePointError as exc:
        raise IncompatibleRestorePoint(
            f"{LAST} carries an unreadable identity record: {exc.message}", url=str(last)
        ) from None
    if head is None:
        log.warning("%s carries no identity record (made without the callback): not gated", last)
    else:
        result = decide(str(last), head, [view], strict=True, hints=LIGHTNING_HINTS)
        if not result.compatible:
            raise refuse(result)
    return _step_of(state)


def _take_handed(
    handed: Path, directory: Path, view: Expectations, safe_globals: Sequence[Any]
) -> None:
    """The supervisor's gated import: it compared what it knows; this job knows the rest (its
    trainer, config, cache keys) and compares everything again with the head handed over."""
    head_file = os.environ.get(RESUME_HEAD_ENV) or str(handed) + ".head.json"
    result = decide(
        str(handed), read_head_file(head_file), [view], strict=True, hints=LIGHTNING_HINTS
    )
    if not result.compatible:
        raise refuse(result)
    check_loadable(handed / LAST, extra_globals=safe_globals)
    directory.mkdir(parents=True, exist_ok=True)
    # A copy beside last.ckpt, renamed: the import may lie on another file system.
    staging = directory / f".restorepoint-import-{secrets.token_hex(6)}"
    try:
        shutil.copyfile(handed / LAST, staging)
        os.replace(staging, directory / LAST)
        fsync_dir(directory)
    finally:
        staging.unlink(missing_ok=True)


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
