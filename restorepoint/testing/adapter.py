"""A conformance suite for trainer adapters (shipped, so third-party adapters can run it).

Subclass ``AdapterConformance`` in a test module and provide three fixtures:

- ``adapter``: the adapter under test;
- ``produced``: a directory where the trainer (the real one, or a test double that behaves
  like it) has committed at least one snapshot;
- ``expected_step``: the step of the newest committed snapshot in ``produced``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..adapters.base import Adapter, load_adapter
from ..ops import import_restore_point, pack, read_manifest, verify

__all__ = ["AdapterConformance"]


class AdapterConformance:
    def test_implements_the_interface(self, adapter: Adapter) -> None:
        assert isinstance(adapter, Adapter)
        assert isinstance(adapter.name, str) and adapter.name

    def test_is_registered_under_its_name(self, adapter: Adapter) -> None:
        again = load_adapter(adapter.name)
        assert type(again) is type(adapter)

    def test_reports_the_trainer(self, adapter: Adapter) -> None:
        info = adapter.trainer()
        assert info.name and isinstance(info.version, str) and info.version
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.terms.items())

    def test_no_snapshot_where_there_is_none(self, adapter: Adapter, tmp_path: Path) -> None:
        assert adapter.newest_snapshot(tmp_path) is None

    def test_finds_the_newest_committed_snapshot(
        self, adapter: Adapter, produced: Path, expected_step: int
    ) -> None:
        snap = adapter.newest_snapshot(produced)
        assert snap is not None
        assert snap.step == expected_step
        assert snap.files
        for name in snap.files:
            assert (snap.root / name).is_file(), name

    def test_round_trip_to_a_resume_command(
        self, adapter: Adapter, produced: Path, expected_step: int, tmp_path: Path
    ) -> None:
        snap = adapter.newest_snapshot(produced)
        assert snap is not None
        info = adapter.trainer()
        url = str(tmp_path / "out" / "snapshot.rp")
        pack(
            snap.root,
            url,
            position=snap.position,
            trainer=(info.name, info.version),
            terms=dict(info.terms),
            include=list(snap.files),
        )
        report = verify(url)
        assert report.files == len(snap.files)
        manifest = read_manifest(url)
        assert manifest.position.step == expected_step
        assert manifest.trainer is not None and manifest.trainer.name == info.name
        restored = tmp_path / "restored"
        result = import_restore_point(url, restored)
        for name in snap.files:
            assert (restored / name).read_bytes() == (snap.root / name).read_bytes()
        command = adapter.resume_command(restored, result.manifest, ["trainer", "--flag"])
        assert isinstance(command, list) and all(isinstance(a, str) for a in command)

    def test_request_snapshot_of_a_missing_process_is_refused(self, adapter: Adapter) -> None:
        from ..errors import NotFound, UsageError

        pid = _dead_pid()
        with pytest.raises((NotFound, UsageError)):
            adapter.request_snapshot(pid)

    def test_request_snapshot_never_kills_a_process_that_does_not_catch_it(
        self, adapter: Adapter
    ) -> None:
        """A process that does not handle the adapter's signal (not up yet, or not the
        trainer) is refused, not sent a signal it would die of."""
        from ..errors import UsageError

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            time.sleep(0.3)
            with pytest.raises(UsageError, match="does not catch"):
                adapter.request_snapshot(child.pid)
            assert child.poll() is None
        finally:
            child.kill()
            child.wait()


def _dead_pid() -> int:
    """A process id that no process has (a child that has exited and been reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
