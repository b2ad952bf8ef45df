"""What ``trainer.train(resume_from_checkpoint=...)`` resumes from (docs/adapters.md, "Hugging
Face Trainer"): the same call on a first run, a requeue and a fresh machine.

Every candidate passes the gate with this run's local view (the installed transformers, the
terms detected here, the cache keys, the config: TrainingArguments and the model's config
without their operational keys) before the Trainer sees it; its pickles pass the weights-only
scan. A changed learning rate, model or dataset is a refusal naming each field (exit 3),
never a silent resume and never a silent fresh start.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._posix import fsync_dir
from ..._text import printable
from ...errors import IncompatibleRestorePoint, RestorePointError, UnsafeCheckpoint, UsageError
from ...ops import Expectations
from ...ops.gate import decide, refuse
from ...ops.resume import choose, read_head_file, resume_import
from ...runtime.contract import (
    EXIT_INCOMPATIBLE,
    RESUME_DIR_ENV,
    RESUME_HEAD_ENV,
    RESUME_URL_ENV,
    report_refusal,
)
from ...trust import Trust
from ._checkpoint import (
    UNPUBLISHED,
    Complete,
    check_pickles,
    file_index,
    iter_complete,
    write_record,
)
from ._view import (
    TRANSFORMERS_HINTS,
    cache_keys_of,
    local_view,
    operational_keys,
    run_id,
    store_from_env,
    trainer_config,
)

__all__ = ["resume_checkpoint"]

log = logging.getLogger("restorepoint.transformers")

#: The Trainer's own record of where it stands: a directory without it is no checkpoint.
TRAINER_STATE = "trainer_state.json"


def _report(exc: RestorePointError) -> None:
    report_refusal(exc)


def resume_checkpoint(  # noqa: PLR0913 - public API: the trainer's resume options, keyword-only
    output_dir: str | os.PathLike[str],
    store: str | None = None,
    *,
    args: Any,
    model: Any = None,
    dataset: Any = None,
    cache_keys: Mapping[str, str] | None = None,
    run: str | None = None,
    operational: Sequence[str] | None = None,
    cache_root: str | None = None,
    terms: Mapping[str, str] | None = None,
    storage_options: dict[str, Any] | None = None,
    trust: Trust | None = None,
    accept_older: bool = False,
    safe_globals: Sequence[Any] = (),
    exit_on_refusal: bool = True,
) -> str | None:
    """The checkpoint directory to pass to ``trainer.train(resume_from_checkpoint=...)``, or
    None (a fresh start, with a warning). ``args``, ``model``, ``dataset``, ``cache_keys``,
    ``run``, ``operational``, ``cache_root`` and ``terms`` as given to the callback:

    1. a restore point ``restorepoint run`` imported for this job (``$RESTOREPOINT_RESUME_DIR``),
       gated with the head it hands over, moved to ``OUTPUT_DIR/checkpoint-N``;
    2. the newest **complete** ``OUTPUT_DIR/checkpoint-N`` (its record sound and every file
       matching the published index; a half-written one is skipped with a warning), gated,
       unless the store holds a newer restore point of the run;
    3. with a store (``store``, else ``$RESTOREPOINT_STORE``), the run's newest restore point,
       imported through the gated import (``trust``, else ``$RESTOREPOINT_TRUST``) as
       ``OUTPUT_DIR/checkpoint-N``.

    A refusal is one line on stderr (the mismatches below it) and exit 3 (``SystemExit``);
    ``exit_on_refusal=False`` raises IncompatibleRestorePoint instead. A pickle the Trainer
    would load (``rng_state.pth``, ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``) that
    would run code is refused the same way (UnsafeCheckpoint, exit 1) before the Trainer
    loads it. A store that cannot be read is raised: starting over would throw the run's
    progress away."""
    directory = Path(output_dir)
    keys = operational_keys(operational)
    config = trainer_config(args, model)
    view = local_view(config, cache_keys_of(dataset, cache_keys), cache_root, terms)
    store = store_from_env(store)
    try:
        handed = os.environ.get(RESUME_DIR_ENV)
        if handed and (Path(handed) / TRAINER_STATE).is_file():
            path = _take_handed(Path(handed), directory, view, safe_globals)
            log.info("resuming from the supervisor's import, moved to %s", path)
            return str(path)
        local = _newest_local(directory, view)
        if store is not None:
            entry = choose(
                store,
                run=run_id(run, config, keys),
                views=[view],
                accept_older=accept_older,
                trust=trust,
                storage_options=storage_options,
                hints=TRANSFORMERS_HINTS,
            )
            if entry is not None and entry.step > (local.step if local else -1):
                path = _import(entry.url, entry.step, directory, view, trust, storage_options,
                               safe_globals)  # fmt: skip
                log.info("resuming from %s (step %d), imported as %s", entry.url, entry.step, path)
                return str(path)
        if local is not None:
            check_pickles(local.path, safe_globals)
            return str(local.path)
    except (IncompatibleRestorePoint, UnsafeCheckpoint) as exc:
        if not exit_on_refusal:
            raise
        _report(exc)
        code = EXIT_INCOMPATIBLE if isinstance(exc, IncompatibleRestorePoint) else exc.exit_code
        raise SystemExit(code) from None
    where = f"no complete checkpoint in {directory}"
    if store is not None:
        where += f" and no restore point in {store}"
    warnings.warn(f"{where}: starting fresh", UserWarning, stacklevel=2)
    return None


def _newest_local(directory: Path, view: Expectations) -> Complete | None:
    """The newest complete checkpoint, gated; the incomplete ones newer than it are skipped
    with a warning each."""
    for _step, path, found in iter_complete(directory):
        if isinstance(found, str):
            # The reason may quote the record's paths: hostile until checked, escaped.
            warnings.warn(printable(f"skipping {path.name}: {found}"), UserWarning, stacklevel=3)
            continue
        result = decide(str(path), found.head, [view], strict=True, hints=TRANSFORMERS_HINTS)
        if not result.compatible:
            raise refuse(result)
        return found
    return None


def _move_into_place(staging: Path, directory: Path, step: int) -> Path:
    """``staging`` becomes ``DIRECTORY/checkpoint-STEP``; an incomplete one there is moved
    aside first and removed (a rename, so a kill in between leaves one or the other whole)."""
    target = directory / f"checkpoint-{step}"
    aside: Path | None = None
    if target.exists():
        aside = directory / f".restorepoint-incomplete-{step}-{secrets.token_hex(4)}"
        os.replace(target, aside)
    os.replace(staging, target)
    fsync_dir(directory)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return target


def _import(  # noqa: PLR0913, PLR0917 - the pieces of one gated import, from resume_checkpoint
    url: str,
    step: int,
    directory: Path,
    view: Expectations,
    trust: Trust | None,
    storage_options: dict[str, Any] | None,
    safe_globals: Sequence[Any],
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    # Imported beside the checkpoints and renamed: the same file system, so the rename is
    # atomic, and the Trainer's rotation (checkpoint-*) never sees the staging directory.
    staging = directory / f".restorepoint-import-{secrets.token_hex(6)}"
    try:
        result = resume_import(
            url, staging, views=[view], trust=trust, storage_options=storage_options,
            hints=TRANSFORMERS_HINTS,
        )  # fmt: skip
        if not (staging / TRAINER_STATE).is_file():
            raise UsageError(
                f"the restore point holds no {TRAINER_STATE}: not a checkpoint", url=url
            )
        for name in UNPUBLISHED:
            (staging / name).unlink(missing_ok=True)
        # Checked where it lies, before it takes a checkpoint's name: a pickle that would run
        # code never becomes what the Trainer resumes from.
        check_pickles(staging, safe_globals)
        manifest = result.manifest
        write_record(staging, manifest.head_dict(), file_index(staging, manifest), url)
        return _move_into_place(staging, directory, step)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _take_handed(
    handed: Path, directory: Path, view: Expectations, safe_globals: Sequence[Any]
) -> Path:
    """The supervisor's gated import: it compared what it knows; this job knows the rest (its
    config, cache keys) and compares everything again with the head handed over."""
    head_file = os.environ.get(RESUME_HEAD_ENV) or str(handed) + ".head.json"
    head = read_head_file(head_file)
    shown = os.environ.get(RESUME_URL_ENV) or "the imported restore point"
    result = decide(shown, head, [view], strict=True, hints=TRANSFORMERS_HINTS)
    if not result.compatible:
        raise refuse(result)
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".restorepoint-import-{secrets.token_hex(6)}"
    try:
        # A copy beside the checkpoints, renamed: the import may lie on another file system.
        shutil.copytree(handed, staging, symlinks=True)
        for name in UNPUBLISHED:
            (staging / name).unlink(missing_ok=True)
        check_pickles(staging, safe_globals)
        write_record(staging, head.head_dict(), file_index(staging), shown)
        return _move_into_place(staging, directory, head.position.step)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
