"""The store suite on local files (plain paths and file:// URLs), and what only POSIX publishing
promises: a temporary file beside the final name, fsync of the file and of the directory, a
rename that replaces a symlink rather than writing through it."""

from __future__ import annotations

import itertools
import os
import re
import stat
from pathlib import Path

import pytest

from restorepoint.errors import AlreadyExists
from restorepoint.storage import resolve
from restorepoint.testing.store import StoreConformance, payload, publish_and_fail


def _path(url: str) -> Path:
    return Path(url.removeprefix("file://"))


class TestLocalStore(StoreConformance):
    @pytest.fixture(params=["path", "file-url"])
    def base_url(self, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        root = tmp_path / "store"
        root.mkdir()
        return f"{root}/" if request.param == "path" else f"file://{root}/"

    def raw_get(self, url: str) -> bytes:
        return _path(url).read_bytes()

    def raw_put(self, url: str, data: bytes) -> None:
        path = _path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def raw_list(self, prefix: str) -> list[str]:
        root = _path(prefix)
        return sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()
        )


def _partial_pattern(final: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(final)}\.rp-partial-{os.getpid()}-[0-9a-f]{{12}}")


def test_temporary_file_is_beside_the_final_name_and_removed_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "runs" / "step-1.rp"
    location = resolve(str(final))
    seen: list[str] = []

    def attempt() -> None:
        with location.publish() as pub:
            pub.write(b"x" * 1000)
            seen.extend(os.listdir(final.parent))
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        attempt()
    assert len(seen) == 1
    assert _partial_pattern("step-1.rp").fullmatch(seen[0]), seen
    assert os.listdir(final.parent) == []


def test_file_and_directory_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "step-2.rp"
    calls: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        st = os.fstat(fd)
        calls.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with resolve(str(final)).publish() as pub:
        pub.write(payload(10_000))
    monkeypatch.undo()
    # The data reaches the disk before the rename, and the rename before we return.
    assert calls == [("file", final.stat().st_ino), ("dir", tmp_path.stat().st_ino)]


def test_a_symlink_at_the_destination_is_replaced_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.rp"
    target.write_bytes(b"the target")
    link = tmp_path / "latest.rp"
    link.symlink_to(target)
    with resolve(str(link)).publish() as pub:
        pub.write(b"the new object")
    assert not link.is_symlink()
    assert link.read_bytes() == b"the new object"
    assert target.read_bytes() == b"the target"
    assert sorted(os.listdir(tmp_path)) == ["elsewhere.rp", "latest.rp"]


def test_create_only_refuses_a_symlink_and_a_dangling_one(tmp_path: Path) -> None:
    link = tmp_path / "latest.rp"
    link.symlink_to(tmp_path / "nowhere.rp")
    with pytest.raises(AlreadyExists):
        publish_and_fail(resolve(str(link)), b"new", None, create_only=True)
    assert link.is_symlink()
    assert not (tmp_path / "nowhere.rp").exists()
    assert os.listdir(tmp_path) == ["latest.rp"]


def test_reader_keeps_reading_the_object_it_opened(tmp_path: Path) -> None:
    final = tmp_path / "step-3.rp"
    old, new = payload(20_000, seed=1), payload(30_000, seed=2)
    final.write_bytes(old)
    reader = resolve(str(final)).reader()
    try:
        with resolve(str(final)).publish() as pub:
            pub.write(new)
        # One descriptor for every read: a publish over the name cannot mix two objects.
        assert reader.size == len(old)
        assert reader.read_range(0, len(old)) == old
    finally:
        reader.close()
    assert final.read_bytes() == new


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_stream_asks_the_kernel_to_read_ahead_of_it_a_window_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload stream keeps the kernel reading ahead of it (WILLNEED, a window at a time,
    half a window before it is needed), so that reading a cold file overlaps its decoding.
    What it reads is the file's bytes from where it starts, whatever the read sizes."""
    from restorepoint.storage import _local

    monkeypatch.setattr(_local, "READ_AHEAD", 64 << 10)
    advised: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    data = payload(300_000, seed=3)
    final = tmp_path / "object.rp"
    final.write_bytes(data)
    reader = resolve(str(final)).reader()
    try:
        stream = reader.open_stream(1000)
        got = [stream.read(n) for n in (10, 40_000, 1, 100_000, 7_000)]
        while chunk := stream.read(20_000):  # a payload's reads: a chunk at a time
            got.append(chunk)
        stream.close()
    finally:
        reader.close()
    assert b"".join(got) == data[1000:]
    # Windows of READ_AHEAD, one after another from where the stream starts, up to its end
    # (a read longer than half a window, 100,000 bytes here, may outrun one).
    window = 64 << 10
    assert advised[0] == (1000, window)
    assert all(length == window for _, length in advised)
    assert all(a[0] + window <= b[0] for a, b in itertools.pairwise(advised))
    assert advised[-1][0] + window >= len(data)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_is_permission_denied(tmp_path: Path) -> None:
    from restorepoint.errors import PermissionDenied

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionDenied):
            resolve(str(locked / "x.rp")).publisher()
    finally:
        locked.chmod(0o700)
