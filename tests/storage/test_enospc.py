"""A full disk under a local store and under an import destination (docs/reliability.md, "Full
disks"): a real ENOSPC, on a small tmpfs the test mounts. Each case fails with one line that
names the path and exit 4 (StorageError), leaves nothing partial (no temporary file, nothing
under a final name, no staging directory), and keeps the previous good state."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from clirun import cli, one_error_line
from fulldisk import cli_env, fill, small_disk

import restorepoint
from restorepoint.errors import StorageError
from restorepoint.ops.unpack import import_restore_point

MiB = 1 << 20


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, hidden ones included, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def random_tree(root: Path, sizes: dict[str, int]) -> Path:
    root.mkdir(parents=True)
    for name, size in sizes.items():
        (root / name).write_bytes(os.urandom(size))
    return root


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", 2 * MiB) as mounted:
        yield mounted


def test_a_publish_into_a_full_local_store(disk: Path, tmp_path: Path) -> None:
    small = random_tree(tmp_path / "small", {"w.bin": 200_000})
    big = random_tree(tmp_path / "big", {"w.bin": 3 * MiB})
    store = disk / "store"
    head = ("--trainer", "t=1", "--run", "r1", "--codec", "none")
    env = cli_env(disk)
    first = cli("pack", str(small), f"{store}/", "--step", "1", *head, extra_env=env)
    assert first.returncode == 0, first.stderr
    previous = first.stdout.splitlines()[-1]
    before = tree(store)

    # Into the store, with a prune after the publish: the publish fails, nothing is pruned.
    proc = cli(
        "pack", str(big), f"{store}/", "--step", "2", "--keep-last", "1", *head, extra_env=env
    )
    assert proc.returncode == 4
    line = one_error_line(proc)
    name = rf"{re.escape(str(store))}/r1/0+2-\S+\.rp"
    assert re.fullmatch(rf"restorepoint: error: {name}: no space left on the device", line), line
    assert tree(store) == before  # no temporary file, nothing under a final name
    assert cli("verify", previous).returncode == 0

    # At a URL of its own, the same.
    one = disk / "one.rp"
    proc = cli(
        "pack",
        str(big),
        str(one),
        "--step",
        "2",
        "--trainer",
        "t=1",
        "--codec",
        "none",
        extra_env=env,
    )
    assert proc.returncode == 4
    assert one_error_line(proc) == f"restorepoint: error: {one}: no space left on the device"
    assert sorted(os.listdir(disk)) == ["store"]


def test_an_import_into_a_full_destination(disk: Path, tmp_path: Path) -> None:
    source = random_tree(tmp_path / "src", {"a.bin": 400_000, "b.bin": 400_000})
    rp = tmp_path / "a.rp"
    restorepoint.pack(source, str(rp), position=5, trainer=("t", "1"), codec="none")
    dest = disk / "dest"
    dest.mkdir()
    (dest / "old.txt").write_bytes(b"the previous import")

    # The CLI: the free-space check before anything is unpacked.
    fill(disk, leave=256 << 10)
    proc = cli("import", str(rp), str(dest), "--force", "--trainer", "t=1", extra_env=cli_env(disk))
    assert proc.returncode == 4
    line = one_error_line(proc)
    assert line.startswith(f"restorepoint: error: {dest}: not enough space for the payload: ")
    assert tree(dest) == {"old.txt": b"the previous import"}
    assert sorted(os.listdir(disk)) == ["dest", "filler"]
    (disk / "filler").unlink()

    # The disk fills while the import writes (another writer takes the rest after the first
    # chunk): ENOSPC in the staging directory.
    fillers: list[Path] = []

    def progress(_n: int) -> None:
        if not fillers:
            fillers.append(fill(disk, leave=0))

    with pytest.raises(StorageError) as info:
        import_restore_point(str(rp), dest, force=True, progress=progress)
    assert fillers
    err = info.value
    assert err.exit_code == 4
    assert str(err) == f"{dest}: no space left on the device"
    assert tree(dest) == {"old.txt": b"the previous import"}
    assert sorted(os.listdir(disk)) == ["dest", "filler"]  # no staging directory left
