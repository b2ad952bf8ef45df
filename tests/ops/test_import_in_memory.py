"""An import in memory (spec section 18, "An import in memory"): every file's verified bytes
are held, DEST is as it was until ``finish()`` moves the synced copy into place (or
``discard()`` removes it), and the held bytes read back exactly, across chunk boundaries,
until they are forgotten."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from restorepoint.ops.unpack import import_restore_point
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
