"""An import in memory (spec section 18, "An import in memory"): every file's verified bytes
are held, DEST is as it was until ``finish()`` moves the synced copy into place (or
``discard()`` removes it), and the held bytes read back exactly, across chunk boundaries,
until they are forgotten. The staging copy is written on a thread of its own, which ends
with ``finish`` or ``discard`` (or a failure) and leaves no descriptor open."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from restorepoint.errors import IntegrityError, StorageError
from restorepoint.format import read_manifest
from restorepoint.ops import _contents, unpack
from restorepoint.ops.unpack import import_restore_point
from restorepoint.storage import resolve
from tests.ops.test_import import SOURCE_FILES, files_of, leftovers, make_tree, pack


@pytest.fixture
def rp(tmp_path: Path) -> str:
    url = str(tmp_path / "rp.rpt")
    pack(make_tree(tmp_path / "src", SOURCE_FILES), url)
    return url


def test_the_held_bytes_are_the_files_and_finish_lands_them(rp: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "ckpt"
    result = import_restore_point(rp, dest, in_memory=True)
    assert result.contents is not None
    # Held before anything is in place: DEST absent, the staging tree beside it.
    assert not dest.exists() and len(leftovers(out)) == 1
    held = result.contents
    assert sorted(held) == sorted(SOURCE_FILES)
    for path, data in SOURCE_FILES.items():
        assert held[path].size == len(data)
        assert held[path].read(0, len(data)) == data
    # Reads that cross the 64 KiB chunks, and one past the end.
    model = SOURCE_FILES["model.bin"]
    for start, end in [(65530, 65542), (1, 200_000), (299_990, 300_010)]:
        assert held["model.bin"].read(start, end) == model[start:end]
    buffer = bytearray(70_000)
    assert held["model.bin"].readinto(65_000, memoryview(buffer)) == 70_000
    assert bytes(buffer) == model[65_000:135_000]
    # Forgotten bytes are gone; later ones are still there.
    held["model.bin"].forget(131_072)
    with pytest.raises(ValueError, match="forgotten"):
        held["model.bin"].read(0, 10)
    assert held["model.bin"].read(131_072, 131_080) == model[131_072:131_080]

    result.finish()
    result.finish()  # once only
    assert files_of(dest) == SOURCE_FILES
    assert leftovers(out) == []
    assert oct(os.lstat(dest).st_mode & 0o777) != oct(0o700)


def test_discard_leaves_dest_as_it_was(rp: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = import_restore_point(rp, out / "ckpt", in_memory=True)
    result.discard()
    result.finish()  # nothing left to finish
    assert os.listdir(out) == []


def _stage_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "rp-stage"]


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_staging_copy_is_written_behind_the_bytes_and_bounded_by_forget(
    rp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging copy is written on a thread of its own (``rp-stage``) from the chunks the
    import keeps: a reader that forgets bytes waits for the writer to be past them (here with
    no lag allowed), the thread ends with ``finish``, and no descriptor is left open."""
    monkeypatch.setattr(_contents, "WRITE_LAG", 0)
    fds = _fds()
    out = tmp_path / "out"
    out.mkdir()
    result = import_restore_point(rp, out / "ckpt", in_memory=True)
    assert result.contents is not None
    (staging,) = leftovers(out)
    model = SOURCE_FILES["model.bin"]
    held = result.contents["model.bin"]
    held.forget(200_000)
    # Every chunk wholly before byte 200000 (three of 64 KiB) is forgotten, so written.
    assert (out / staging / "model.bin").stat().st_size >= 3 * 65536
    held.forget(held.size)
    assert (out / staging / "model.bin").read_bytes() == model
    result.finish()
    assert files_of(out / "ckpt") == SOURCE_FILES
    assert _stage_threads() == []
    assert _fds() == fds


def test_a_failed_or_discarded_import_leaves_no_writer_and_no_descriptor(
    rp: str, tmp_path: Path
) -> None:
    fds = _fds()
    # Refused mid-payload (a corrupted stored byte of model.bin): the writer is stopped
    # and joined before the staging directory is removed.
    bad = tmp_path / "bad.rpt"
    data = bytearray(Path(rp).read_bytes())
    reader = resolve(rp).reader()
    try:
        manifest = read_manifest(reader)[1]
    finally:
        reader.close()
    (entry,) = [e for e in manifest.payload or () if e.path == "model.bin"]
    data[entry.offset + entry.stored_size // 2] ^= 0x40
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(IntegrityError):
        import_restore_point(str(bad), out / "ckpt", in_memory=True)
    assert os.listdir(out) == []
    assert _stage_threads() == []
    assert _fds() == fds
    # Discarded before the writer is done: stopped, joined, removed.
    result = import_restore_point(rp, out / "ckpt", in_memory=True)
    result.discard()
    assert os.listdir(out) == []
    assert _stage_threads() == []
    assert _fds() == fds


def test_a_write_that_fails_fails_finish_not_the_held_bytes(
    rp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link planted in the staging directory (an attacker racing the importer) makes the
    writer's create fail: the held bytes, verified, are still whole (a reader forgetting
    them does not wait for a writer that stopped), ``finish`` fails with StorageError
    (exit 4), DEST is as it was and nothing was written through the link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    original = unpack._Tree.__init__

    def init(self: unpack._Tree, root: str) -> None:
        original(self, root)
        os.symlink(outside / "model.bin", os.path.join(root, "model.bin"))

    monkeypatch.setattr(unpack._Tree, "__init__", init)
    monkeypatch.setattr(_contents, "WRITE_LAG", 0)
    out = tmp_path / "out"
    out.mkdir()
    fds = _fds()
    result = import_restore_point(rp, out / "ckpt", in_memory=True)
    assert result.contents is not None
    held = result.contents["model.bin"]
    assert held.read(0, held.size) == SOURCE_FILES["model.bin"]
    held.forget(held.size)
    with pytest.raises(StorageError) as info:
        result.finish()
    assert info.value.exit_code == 4
    assert os.listdir(out) == [] and os.listdir(outside) == []
    assert _stage_threads() == []
    assert _fds() == fds
