"""How an Accelerate run resumes (``restorepoint.adapters.accelerate`` is the public face):
which state it resumes from, chosen by the main process for all (a supervisor's import, the
newest complete local state directory, the store's newest restore point of the run, each
gated), how each process brings its share of it into the state directory, and the scan of
every pickle Accelerate will load. A refusal is one line and its exit code."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .._posix import fsync_dir
from ..errors import IncompatibleRestorePoint, IntegrityError, RestorePointError
from ..format import Position
from ..ops.gate import decide, refuse
from ..ops.resume import choose, read_head_file, resume_import
from ..runtime.contract import (
    RESUME_DIR_ENV,
    RESUME_HEAD_ENV,
    RESUME_URL_ENV,
    report_refusal,
)
from ..runtime.safe_load import check_loadable
from ._accelerate_state import (
    ACCELERATE_HINTS,
    STATE_RECORD,
    StateRecord,
    pickles,
    rank_of,
    state_files,
)

if TYPE_CHECKING:
    from .accelerate import AccelerateRun

__all__ = [
    "check_pickles",
    "choose_state",
    "import_share",
    "newest_local",
    "record_position",
    "refused",
    "take_handed",
    "write_imported",
]

log = logging.getLogger("restorepoint.accelerate")


def choose_state(run: AccelerateRun) -> tuple[str, str] | None:
    """What to resume from (the main process): ``("handed", DIR)``, ``("local", DIR)``,
    ``("store", URL)``, or None; each gated with the run's local view."""
    handed = os.environ.get(RESUME_DIR_ENV)
    if handed and Path(handed).is_dir() and state_files(Path(handed)):
        # restorepoint run --resume-from imported it: gated here again with what only
        # this run knows (its config, trainer, world size), against the head handed over.
        head_file = os.environ.get(RESUME_HEAD_ENV) or handed + ".head.json"
        run._imported = read_head_file(head_file)
        url = os.environ.get(RESUME_URL_ENV) or handed
        view = replace(run.view, world_size=run.world)
        result = decide(url, run._imported, [view], strict=True, hints=ACCELERATE_HINTS)
        if not result.compatible:
            raise refuse(result)
        return ("handed", handed)
    local = newest_local(run)
    local_step = local[1] if local is not None else -1
    if run.store is not None:
        assert run.run is not None
        view = replace(run.view, world_size=run.world)
        entry = choose(
            run.store,
            run=run.run,
            views=[view],
            accept_older=run.accept_older,
            trust=run.trust,
            storage_options=run.options.storage_options,
            hints=ACCELERATE_HINTS,
        )
        if entry is not None and entry.step > local_step:
            return ("store", entry.url)
    if local is not None:
        return ("local", str(local[0]))
    return None


def newest_local(run: AccelerateRun) -> tuple[Path, int] | None:
    """The complete state directory (DIR, or one directly under it) of the highest step,
    gated; an incomplete one is skipped, a refused one is a refusal."""
    found: list[tuple[int, Path, StateRecord]] = []
    candidates = [run.directory]
    if run.directory.is_dir():
        candidates += sorted(
            p for p in run.directory.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
    for path in candidates:
        record = StateRecord.read(path)
        if record is not None:
            found.append((record.position.step, path, record))
    for step, path, record in sorted(found, key=lambda f: -f[0]):
        problem = record.incomplete(path)
        if problem is not None:
            log.warning("skipping the state in %s: %s", path, problem)
            continue
        result = decide(str(path), record.head, [run.view], strict=True, hints=ACCELERATE_HINTS)
        if not result.compatible:
            raise refuse(result)
        if record.world_size != run.world:
            raise IncompatibleRestorePoint(
                f"refused: the state was saved by {record.world_size} processes, "
                f"this run has {run.world}",
                url=str(path),
            )
        return path, step
    return None


def import_share(run: AccelerateRun, url: str) -> None:
    """This process's share of the restore point (the shared part and its own), imported
    through the gated import beside DIR, scanned, then moved into DIR."""
    run._url = url
    run.directory.mkdir(parents=True, exist_ok=True)
    staging = run.directory.parent / (
        f".{run.directory.name}.import-{secrets.token_hex(6)}-{run.rank}"
    )
    try:
        result = resume_import(
            url,
            staging,
            views=[replace(run.view, world_size=run.world)],
            trust=run.trust,
            storage_options=run.options.storage_options,
            hints=ACCELERATE_HINTS,
            rank=run.rank if run.world > 1 else None,
            world_size=run.world,
        )
        run._imported = result.manifest
        names = state_files(staging)
        # Checked where they lie, before they take the state's names.
        for name in pickles(names):
            check_loadable(staging / name, extra_globals=run.safe_globals)
        if run.is_main:
            (run.directory / STATE_RECORD).unlink(missing_ok=True)
        for name in names:
            os.replace(staging / name, run.directory / name)
        fsync_dir(run.directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def take_handed(run: AccelerateRun, handed: Path) -> None:
    """The supervisor's import (every process's files), scanned, then copied into DIR
    (renamed into place file by file: the import may lie on another file system) and
    recorded."""
    names = state_files(handed)
    for name in pickles(names):
        check_loadable(handed / name, extra_globals=run.safe_globals)
    run.directory.mkdir(parents=True, exist_ok=True)
    (run.directory / STATE_RECORD).unlink(missing_ok=True)
    for name in names:
        staging = run.directory / f".{name}.{secrets.token_hex(6)}"
        try:
            shutil.copyfile(handed / name, staging)
            os.replace(staging, run.directory / name)
        finally:
            staging.unlink(missing_ok=True)
    fsync_dir(run.directory)
    write_imported(run)


def write_imported(run: AccelerateRun) -> None:
    """The record of the imported state: the local directory is complete at its step."""
    assert run._imported is not None
    run._write_record(run._imported.position)


def check_pickles(run: AccelerateRun, path: Path) -> None:
    """The pickles this process loads, each through the allowlist scan: every shared one
    (optimizer, scheduler, custom checkpoints: every process loads them, and on another node
    its directory is not the main process's) and its own RNG states."""
    names = [n for n in pickles(state_files(path)) if rank_of(n) in (None, run.rank)]
    for name in names:
        check_loadable(path / name, extra_globals=run.safe_globals)


def record_position(path: Path) -> Position:
    record = StateRecord.read(path)
    if record is None:
        raise IntegrityError("the state record is gone", url=str(path))
    return record.position


def refused(run: AccelerateRun, exc: RestorePointError) -> SystemExit:
    """One line (and the mismatches) on stderr, the refused fields for the supervisor's
    telemetry, and the error's exit code (3 for a refusal)."""
    if run.is_main:
        report_refusal(exc)
    return SystemExit(exc.exit_code)
