"""import: a restore point unpacked into DEST exactly, or DEST left exactly as it was.

Covers the destination rules (absent, empty, non-empty with and without force, a file or a
link), the atomic replace and its two-rename fallback, contents and modes, an integrity failure
in the middle of the stream, the free-space check (on a real small tmpfs where mounting is
allowed), the cleanup of earlier imports' leftovers, and imports from memory:// and S3."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import restorepoint
from restorepoint import (
    DestinationError,
    DigestMismatch,
    Expectations,
    IncompatibleRestorePoint,
    StorageError,
)
from restorepoint.ops import _staging, unpack
from restorepoint.testing.store import payload

CHUNK = 65536
LEFTOVER_MARKS = (unpack.STAGING_MARK, _staging.OLD_MARK)


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def pack(source: Path, url: str, **options: Any) -> restorepoint.PackResult:
    options.setdefault("position", restorepoint.Position(step=42, epoch=3, batch=1))
    options.setdefault("chunk_size", CHUNK)
    options.setdefault("threads", 2)
    return restorepoint.pack(source, url, **options)


def contents(root: Path) -> dict[str, Any]:
    """Everything under ``root`` without following links: file bytes, "dir", or ("link", to)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = path.read_bytes()
    return out


def files_of(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in contents(root).items() if isinstance(v, bytes)}


def leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if any(m in n for m in LEFTOVER_MARKS))


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


SOURCE_FILES = {
    "model.bin": payload(300_000, seed=1),  # several chunks, the last one short
    "empty.bin": b"",
    "sub/state.json": b'{"step": 42}',
    "sub/deeper/still/leaf.txt": b"leaf\n",
    "sub/deeper/zero": b"",
    "optimizer.pt": payload(CHUNK, seed=2),  # exactly one full chunk
}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "src", SOURCE_FILES)


@pytest.fixture
def rp(source: Path, tmp_path: Path) -> str:
    url = str(tmp_path / "rp.rpt")
    pack(source, url)
    return url


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The directory DEST lives in: nothing else is there, so leftovers would show."""
    path = tmp_path / "out"
    path.mkdir()
    return path


def old_tree(dest: Path) -> dict[str, bytes]:
    files = {"old.bin": b"the previous checkpoint" * 50, "keep/me.txt": b"old"}
    make_tree(dest, files)
    return files


# -- destinations ------------------------------------------------------------------------------


def test_import_into_absent_dest(rp: str, out: Path) -> None:
    dest = out / "ckpt"
    result = restorepoint.import_restore_point(rp, dest)
    assert files_of(dest) == SOURCE_FILES
    assert os.listdir(out) == ["ckpt"]
    assert result.dest == str(dest)
    assert result.bytes == sum(len(v) for v in SOURCE_FILES.values())
    assert sorted(result.files) == sorted(str(dest / rel) for rel in SOURCE_FILES)
    assert result.check.compatible and result.check.mismatches == []


def test_result_as_data(rp: str, out: Path) -> None:
    result = restorepoint.import_restore_point(rp, out / "ckpt")
    data = result.to_dict()
    assert set(data) == {
        "bytes", "dest", "files", "gated", "id", "ok", "position", "seconds", "url"
    }  # fmt: skip
    assert data["ok"] is True and data["url"] == rp and data["dest"] == str(out / "ckpt")
    assert data["position"] == {"step": 42, "epoch": 3, "batch": 1}
    assert data["id"] == restorepoint.read_manifest(rp).id
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in data["files"])
    assert data["bytes"] == result.bytes and data["seconds"] >= 0


def test_parent_directories_are_created(rp: str, out: Path) -> None:
    dest = out / "a" / "b" / "ckpt"
    restorepoint.import_restore_point(rp, dest)
    assert files_of(dest) == SOURCE_FILES


def test_import_into_an_empty_directory(rp: str, out: Path) -> None:
    dest = out / "ckpt"
    dest.mkdir()
    restorepoint.import_restore_point(rp, dest)
    assert files_of(dest) == SOURCE_FILES
    assert os.listdir(out) == ["ckpt"]


def test_non_empty_dest_is_refused_without_force(rp: str, out: Path) -> None:
    dest = out / "ckpt"
    old = old_tree(dest)
    before = contents(out)
    with pytest.raises(DestinationError, match="not empty") as info:
        restorepoint.import_restore_point(rp, dest)
    assert info.value.exit_code == 2
    assert contents(out) == before
    assert files_of(dest) == old


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_force_replaces_with_exactly_the_new_tree(
    rp: str, out: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    dest = out / "ckpt"
    old_tree(dest)
    (dest / "sub").mkdir()
    (dest / "sub" / "stale.txt").write_bytes(b"must not survive")
    if not exchange:
        monkeypatch.setattr(_staging, "rename_exchange", lambda a, b: False)
    restorepoint.import_restore_point(rp, dest, force=True)
    # Exactly the new tree: nothing of the old one merged in, no leftover beside it.
    assert files_of(dest) == SOURCE_FILES
    assert os.listdir(out) == ["ckpt"]


def test_exchange_is_really_available_here(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_tree(a, {"from-a": b"a"})
    make_tree(b, {"from-b": b"b"})
    if not _staging.rename_exchange(str(a), str(b)):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported on this file system")
    assert os.listdir(a) == ["from-b"] and os.listdir(b) == ["from-a"]


def test_fallback_puts_the_old_tree_back_when_the_second_rename_fails(
    rp: str, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = out / "ckpt"
    old = old_tree(dest)
    monkeypatch.setattr(_staging, "rename_exchange", lambda a, b: False)
    real_rename = os.rename

    def failing_rename(src: Any, dst: Any) -> None:
        if unpack.STAGING_MARK in os.fspath(src):
            raise OSError(5, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(StorageError, match="cannot move the import into place"):
        restorepoint.import_restore_point(rp, dest, force=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert files_of(dest) == old
    assert os.listdir(out) == ["ckpt"]


def test_dest_that_is_a_file_is_refused(rp: str, out: Path) -> None:
    dest = out / "ckpt"
    dest.write_bytes(b"a file")
    for force in (False, True):
        with pytest.raises(DestinationError, match="not a directory"):
            restorepoint.import_restore_point(rp, dest, force=force)
    assert dest.read_bytes() == b"a file"
    assert os.listdir(out) == ["ckpt"]


@pytest.mark.parametrize("target", ["dir", "missing"])
def test_dest_that_is_a_symlink_is_refused(rp: str, out: Path, tmp_path: Path, target: str) -> None:
    real = tmp_path / "real"
    if target == "dir":
        make_tree(real, {"x": b"x"})
    dest = out / "ckpt"
    dest.symlink_to(real)
    before = contents(tmp_path)
    for force in (False, True):
        with pytest.raises(DestinationError, match="symbolic link") as info:
            restorepoint.import_restore_point(rp, dest, force=force)
        assert info.value.exit_code == 2
    assert contents(tmp_path) == before


# -- what is written ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_modes_follow_the_umask(rp: str, out: Path, mask: int) -> None:
    dest = out / "ckpt"
    with umask(mask):
        restorepoint.import_restore_point(rp, dest)
    assert (dest.stat().st_mode & 0o7777) == 0o755 & ~mask
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames:
            assert (os.lstat(Path(dirpath, name)).st_mode & 0o7777) == 0o755 & ~mask, name
        for name in filenames:
            assert (os.lstat(Path(dirpath, name)).st_mode & 0o7777) == 0o644 & ~mask, name


def test_many_small_files(tmp_path: Path, out: Path) -> None:
    files = {f"d{i % 17}/e{i % 5}/f{i:04d}": payload(i % 300, seed=i) for i in range(1200)}
    src = make_tree(tmp_path / "many", files)
    url = str(tmp_path / "many.rpt")
    pack(src, url)
    result = restorepoint.import_restore_point(url, out / "ckpt")
    assert len(result.files) == 1200
    assert files_of(out / "ckpt") == files


@pytest.mark.parametrize("level", [None, 3], ids=["store-only", "zstd"])
def test_contents_are_byte_identical(source: Path, tmp_path: Path, out: Path, level: Any) -> None:
    url = str(tmp_path / "rp.rpt")
    pack(source, url, level=level)
    restorepoint.import_restore_point(url, out / "ckpt")
    got = files_of(out / "ckpt")
    assert {k: hashlib.sha256(v).hexdigest() for k, v in got.items()} == {
        k: hashlib.sha256(v).hexdigest() for k, v in SOURCE_FILES.items()
    }


def test_progress_sums_to_the_payload(rp: str, out: Path) -> None:
    seen: list[int] = []
    started: list[int] = []
    result = restorepoint.import_restore_point(
        rp, out / "ckpt", progress=seen.append, on_start=started.append
    )
    total = sum(len(v) for v in SOURCE_FILES.values())
    assert started == [total]
    assert sum(seen) == total == result.bytes
    assert len(seen) > 1


def test_staging_is_private_and_recognisable_while_it_fills(rp: str, out: Path) -> None:
    host = re.escape(socket.gethostname().replace("/", "_") or "host")
    pattern = re.compile(rf"\.ckpt\.rp-import-{host}-{os.getpid()}-[0-9a-f]{{12}}")
    seen: set[tuple[str, int]] = set()

    def look(n: int) -> None:
        for name in os.listdir(out):
            seen.add((name, stat.S_IMODE(os.lstat(out / name).st_mode)))

    with umask(0o022):
        restorepoint.import_restore_point(rp, out / "ckpt", progress=look)
    assert len(seen) == 1
    name, mode = seen.pop()
    assert pattern.fullmatch(name), name
    assert mode == 0o700  # closed to others until the move; DEST itself then 0755
    assert stat.S_IMODE((out / "ckpt").stat().st_mode) == 0o755


# -- failures leave DEST as it was -------------------------------------------------------------


def test_gate_refusal_writes_nothing(rp: str, out: Path) -> None:
    dest = out / "a" / "b" / "ckpt"
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.import_restore_point(rp, dest, expect=Expectations(terms={"cuda": "12.4"}))
    assert info.value.exit_code == 3
    assert os.listdir(out) == []  # not even DEST's parents


def test_gate_pass(rp: str, out: Path) -> None:
    result = restorepoint.import_restore_point(
        rp, out / "ckpt", expect=Expectations(terms={}, cache_keys={})
    )
    assert result.check.compatible
    assert files_of(out / "ckpt") == SOURCE_FILES


def _flip_in_stored_bytes(url: str, member: str) -> None:
    """Flip one stored byte of ``member`` (store-only): the layout stays intact, so the reader
    finds the fault only when it hashes that file, after the files before it were written."""
    manifest = restorepoint.read_manifest(url)
    assert manifest.payload is not None
    entry = next(e for e in manifest.payload if e.path == member)
    assert entry.codec.name == "none"
    at = entry.offset + 4 + entry.size // 2  # past the first frame header
    data = bytearray(Path(url).read_bytes())
    data[at] ^= 0x01
    Path(url).write_bytes(bytes(data))


@pytest.mark.parametrize("existing", [False, True], ids=["absent", "replaced"])
def test_digest_mismatch_mid_stream_leaves_dest_as_it_was(
    source: Path, tmp_path: Path, out: Path, existing: bool
) -> None:
    url = str(tmp_path / "bad.rpt")
    pack(source, url, level=None)
    # "sub/state.json" sorts after model.bin and optimizer.pt: those were written first.
    _flip_in_stored_bytes(url, "sub/state.json")
    dest = out / "ckpt"
    old = old_tree(dest) if existing else None
    seen: list[int] = []
    with pytest.raises(DigestMismatch) as info:
        restorepoint.import_restore_point(url, dest, force=True, progress=seen.append)
    assert info.value.member == "sub/state.json" and info.value.exit_code == 1
    assert sum(seen) >= len(SOURCE_FILES["model.bin"])  # the failure came mid-stream
    if old is None:
        assert os.listdir(out) == []
    else:
        assert files_of(dest) == old
        assert os.listdir(out) == ["ckpt"]


def test_not_enough_space_monkeypatched(
    rp: str, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage

    def tiny(path: Any) -> Any:
        return real(path)._replace(free=1000)

    monkeypatch.setattr(shutil, "disk_usage", tiny)
    with pytest.raises(StorageError, match="not enough space") as info:
        restorepoint.import_restore_point(rp, out / "a" / "ckpt")
    assert info.value.exit_code == 4 and info.value.found == 1000
    assert info.value.expected > sum(len(v) for v in SOURCE_FILES.values())
    assert os.listdir(out) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, check=False)


def test_not_enough_space_on_a_small_tmpfs(tmp_path: Path, small_tmpfs: Path) -> None:
    src = make_tree(tmp_path / "big", {"zeros.bin": b"\x00" * (3 << 20), "x": b"x"})
    url = str(tmp_path / "big.rpt")
    pack(src, url, level=3)  # small object, large payload: only the payload size matters
    assert os.path.getsize(url) < 1 << 20
    with pytest.raises(StorageError, match="not enough space"):
        restorepoint.import_restore_point(url, small_tmpfs / "ckpt")
    assert os.listdir(small_tmpfs) == []
    assert shutil.disk_usage(small_tmpfs).used == 0  # nothing was written, not even staged
    # The same file system takes a restore point that fits.
    fits = make_tree(tmp_path / "fits", {"ok.bin": payload(100_000, seed=9)})
    pack(fits, str(tmp_path / "fits.rpt"))
    restorepoint.import_restore_point(str(tmp_path / "fits.rpt"), small_tmpfs / "ckpt")
    assert files_of(small_tmpfs / "ckpt") == {"ok.bin": payload(100_000, seed=9)}


# -- leftovers of earlier imports --------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftover(parent: Path, dest_name: str, mark: str, host: str, pid: int) -> Path:
    path = parent / f".{dest_name}{mark}{host}-{pid}-{uuid.uuid4().hex[:12]}"
    make_tree(path, {"partial.bin": b"half written", "sub/x": b"x"})
    return path


def test_leftovers_of_gone_importers_are_removed(rp: str, out: Path) -> None:
    host = socket.gethostname().replace("/", "_") or "host"
    dead = _dead_pid()
    day_ago = time.time() - _staging.STALE_AFTER_S - 3600
    removed = [
        _leftover(out, "ckpt", unpack.STAGING_MARK, host, dead),
        _leftover(out, "ckpt", _staging.OLD_MARK, host, dead),
        _leftover(out, "ckpt", unpack.STAGING_MARK, "elsewhere-1", 123),
    ]
    os.utime(removed[2], (day_ago, day_ago))
    kept = [
        _leftover(out, "ckpt", unpack.STAGING_MARK, host, os.getpid()),  # alive: maybe busy
        _leftover(out, "ckpt", unpack.STAGING_MARK, "elsewhere-2", 456),  # recent, elsewhere
        _leftover(out, "other", unpack.STAGING_MARK, host, dead),  # another DEST's
    ]
    restorepoint.import_restore_point(rp, out / "ckpt")
    assert files_of(out / "ckpt") == SOURCE_FILES
    assert not any(p.exists() for p in removed)
    assert all(p.is_dir() and (p / "partial.bin").exists() for p in kept)
    assert sorted(os.listdir(out)) == sorted(["ckpt", *(p.name for p in kept)])


def test_no_leftovers_are_removed_on_refusal(rp: str, out: Path) -> None:
    host = socket.gethostname().replace("/", "_") or "host"
    dest = out / "ckpt"
    old_tree(dest)
    stale = _leftover(out, "ckpt", unpack.STAGING_MARK, host, _dead_pid())
    with pytest.raises(DestinationError):
        restorepoint.import_restore_point(rp, dest)
    assert stale.is_dir()


# -- other stores ------------------------------------------------------------------------------


def test_import_from_memory(source: Path, out: Path) -> None:
    root = f"rp-import-{uuid.uuid4().hex}"
    url = f"memory://{root}/rp.rpt"
    try:
        pack(source, url)
        result = restorepoint.import_restore_point(url, out / "ckpt")
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists(f"/{root}"):
            fs.rm(f"/{root}", recursive=True)
    assert result.url == url
    assert files_of(out / "ckpt") == SOURCE_FILES


@pytest.mark.s3
def test_import_from_s3(
    source: Path, out: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    url = f"s3://{s3_bucket}/runs/rp.rpt"
    pack(source, url, storage_options=s3_storage_options)
    result = restorepoint.import_restore_point(
        url, out / "ckpt", storage_options=s3_storage_options
    )
    assert result.url == url
    assert files_of(out / "ckpt") == SOURCE_FILES
    assert os.listdir(out) == ["ckpt"]


@pytest.mark.s3
def test_missing_s3_object_writes_nothing(
    out: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    with pytest.raises(restorepoint.NotFound):
        restorepoint.import_restore_point(
            f"s3://{s3_bucket}/nothing.rpt", out / "ckpt", storage_options=s3_storage_options
        )
    assert os.listdir(out) == []
