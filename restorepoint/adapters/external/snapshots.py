"""The snapshots an external trainer left in its project directory, as the adapter sees them:
which files are snapshots, which of them are committed (the commit point is the trainer's log
line announcing one; without a log, a file that has settled), and cleaning the project down
to the newest that verified."""

from __future__ import annotations

import contextlib
import fnmatch
import glob as globbing
import os
import time
from pathlib import Path

from ..._posix import fsync_dir
from ...errors import UsageError
from ...format import Position
from ..base import Snapshot
from .log import parse_log
from .process import complete
from .profile import Profile

__all__ = ["ProjectSnapshots"]


class ProjectSnapshots:
    """The snapshot side of ``ExternalAdapter``: its ``profile``, the trainer's ``log_files``
    and the ``settle_seconds`` a file without a log line must stay unchanged."""

    profile: Profile
    log_files: tuple[str, ...]
    settle_seconds: float

    def snapshot_dir(self, workdir: Path) -> Path:
        """Where the trainer writes its snapshots under the project directory ``workdir``."""
        return workdir / self.profile.snapshot_dir

    def is_snapshot_file(self, name: str) -> bool:
        """Whether a file named ``name`` is a snapshot: it matches the profile's glob and none
        of its partial patterns (a file still being written)."""
        p = self.profile
        return fnmatch.fnmatchcase(name, p.snapshot_glob) and not any(
            fnmatch.fnmatchcase(name, pat) for pat in p.partial
        )

    def _log_paths(self, workdir: Path) -> list[Path]:
        found: dict[Path, float] = {}
        for pattern in self.log_files:
            if any(ch in pattern for ch in "*?["):
                if Path(pattern).is_absolute():
                    matches = [Path(m) for m in globbing.glob(pattern)]
                else:
                    matches = list(workdir.glob(pattern))
            else:
                matches = [Path(pattern) if Path(pattern).is_absolute() else workdir / pattern]
            for m in matches:
                try:
                    if m.is_file():
                        found[m] = m.stat().st_mtime
                except OSError:
                    continue
        # Oldest log first, so that announcements read in the order they were made.
        return sorted(found, key=lambda m: (found[m], str(m)))

    def committed_snapshots(self, workdir: str | os.PathLike[str]) -> list[Snapshot]:
        """Every committed snapshot still in ``workdir``, oldest first.

        With a log: the snapshots the log announces (the announcement is printed after the
        file is written), whose file is still there and not empty; a later announcement of the
        same file replaces the earlier one. Without any log: the files matching the snapshot
        glob with a step in their name, unchanged for ``settle_seconds``."""
        root = Path(workdir)
        base = self.snapshot_dir(root)
        logs = self._log_paths(root)
        by_name: dict[str, int] = {}
        if logs:
            for log in logs:
                try:
                    text = log.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                for entry in parse_log(text, self.profile):
                    if self.is_snapshot_file(entry.name):
                        by_name.pop(entry.name, None)
                        by_name[entry.name] = entry.step
            ordered = list(by_name.items())
            return [
                self.snapshot_of(base, name, step)
                for name, step in ordered
                if complete(base / name)
            ]
        if self.profile.name_step is None or not base.is_dir():
            return []
        now = time.time()
        found: list[tuple[int, float, str]] = []
        for file in base.iterdir():
            if not self.is_snapshot_file(file.name):
                continue
            named = self.profile.name_step.search(file.name)
            try:
                st = file.stat()
            except OSError:
                continue
            if named is None or not file.is_file() or st.st_size == 0:
                continue
            # No announcement to go by: a file still being written keeps changing.
            if now - st.st_mtime < self.settle_seconds:
                continue
            found.append((int(named.group("step")), st.st_mtime, file.name))
        return [self.snapshot_of(base, name, step) for step, _, name in sorted(found)]

    def snapshot_of(self, base: Path, name: str, step: int) -> Snapshot:
        """The snapshot in the file ``name`` under ``base``, at ``step``."""
        return Snapshot(base, (name,), Position(step=step))

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """The newest committed snapshot under the project directory ``workdir``."""
        snaps = self.committed_snapshots(workdir)
        return snaps[-1] if snaps else None

    def clean_project(
        self, workdir: str | os.PathLike[str], keep: Snapshot | None = None
    ) -> list[Path]:
        """Remove the snapshots older than ``keep``, so only the newest is kept.

        The order is the caller's and it matters: (1) the trainer commits a snapshot (its log
        line); (2) the caller packs it into a restore point and verifies that (restorepoint
        ``pack`` and ``verify``); (3) only then ``clean_project(workdir, keep=snap)``. Here
        ``keep`` is checked again to be committed and complete, and nothing is removed when it
        is not. Snapshots newer than ``keep`` (committed meanwhile, not yet verified), files
        whose step is unknown and partial files stay. ``keep=None`` keeps the newest committed
        snapshot, for a caller that verified it. Returns the removed paths."""
        root = Path(workdir)
        snaps = self.committed_snapshots(root)
        if keep is None:
            if not snaps:
                return []
            keep = snaps[-1]
        base = self.snapshot_dir(root)
        kept = {s.files: s.step for s in snaps}
        if kept.get(keep.files) != keep.step or Path(keep.root).resolve() != base.resolve():
            raise UsageError(
                f"{self.profile.name}: {', '.join(keep.files)} (step {keep.step}) is not a "
                f"committed snapshot of {root}; nothing removed"
            )
        steps = {s.files[0]: s.step for s in snaps}
        removed: list[Path] = []
        if not base.is_dir():
            return removed
        for entry in sorted(base.iterdir()):
            name = entry.name
            if name in keep.files or not self.is_snapshot_file(name) or not entry.is_file():
                continue
            step = steps.get(name)
            if step is None and self.profile.name_step is not None:
                named = self.profile.name_step.search(name)
                step = int(named.group("step")) if named else None
            if step is None or step >= keep.step:
                continue
            entry.unlink(missing_ok=True)
            removed.append(entry)
        if removed:
            with contextlib.suppress(OSError):
                fsync_dir(base)
        return removed
