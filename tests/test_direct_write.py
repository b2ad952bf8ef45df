"""The writes past the page cache (``_direct``): ``replace_file``, by which a snapshot file
reaches the run directory, and ``DirectWriter``, by which a restore point reaches a local store.
The bytes are the pieces in order whatever their sizes and however they fall on the aligned
buffer, the file is its exact size, its pages are not left in the page cache, and where direct
I/O is refused the write through the cache gives the same file."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import subprocess
from pathlib import Path

import pytest

from restorepoint import _direct
from restorepoint._direct import DIRECT_ALIGN, DirectWriter, replace_file


def pieces_of(
    chunks: list[bytes],
) -> tuple[list[tuple[int, int]], list[ctypes.Array[ctypes.c_ubyte]]]:
    """(address, length) of each chunk's own copy in memory, and the copies (kept alive)."""
    held = [(ctypes.c_ubyte * len(c)).from_buffer_copy(c) for c in chunks]
    return [(ctypes.addressof(h), len(h)) for h in held], held


def cached_pages(path: Path) -> int:
    """How many of the file's pages the page cache holds (mincore on a mapping of it)."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        probe = ctypes.c_char.from_buffer(mapped)
        try:
            address = ctypes.c_void_p(ctypes.addressof(probe))
            assert libc.mincore(address, ctypes.c_size_t(size), vector) == 0, ctypes.get_errno()
        finally:
            del probe
    return sum(v & 1 for v in vector)


def file_system(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


def replace_with(target: Path, pieces: list[tuple[int, int]], size: int) -> bool:
    """``replace_file`` of the memory ``pieces``; whether it went past the cache."""
    direct: list[bool] = []

    def fill(writer: DirectWriter) -> None:
        direct.append(writer.direct)
        for address, length in pieces:
            writer.write_memory(address, length)

    replace_file(target, target.parent, size, fill)
    return direct[0]


@pytest.mark.parametrize(
    "sizes",
    [
        [120],  # one piece, less than a block
        [4096],  # exactly a block
        [8, 4095, 1, 4097, 30000, 3],  # pieces across blocks and buffers, ending unaligned
        [DIRECT_ALIGN * 3, DIRECT_ALIGN * 3],  # each filling the buffer exactly
        [5, 0, 70000],  # an empty piece between
        [],  # an empty file
    ],
)
def test_the_file_is_the_pieces_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    # A small buffer, so that the pieces fall across several of its writes.
    monkeypatch.setattr(_direct, "DIRECT_BUFFER", DIRECT_ALIGN * 3)
    rng = random.Random(len(sizes) * 7 + sum(sizes))
    chunks = [rng.randbytes(n) for n in sizes]
    pieces, _held = pieces_of(chunks)
    target = tmp_path / "file"
    target.write_bytes(b"x" * 200_000)  # an older, longer file: replaced
    if not replace_with(target, pieces, sum(sizes)) and sizes:
        pytest.skip(f"this file system ({file_system(tmp_path)}) refuses O_DIRECT")
    assert target.read_bytes() == b"".join(chunks)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no temporary file left


def test_the_written_pages_are_not_left_in_the_page_cache(tmp_path: Path) -> None:
    """What the write is for: no fresh page-cache memory and no writeback after it. A file
    written through the cache, for comparison, is held there."""
    kind = file_system(tmp_path)
    if kind == "tmpfs":
        pytest.skip("tmpfs keeps every file in memory")
    data = random.Random(1).randbytes(4 << 20)
    pieces, _held = pieces_of([data[:12345], data[12345:]])
    direct = tmp_path / "direct"
    if not replace_with(direct, pieces, len(data)):
        pytest.skip(f"this file system ({kind}) refuses O_DIRECT")
    cached = tmp_path / "cached"
    with open(cached, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    assert cached_pages(cached) > 0
    # The last partial block goes through the cache.
    assert cached_pages(direct) <= 1
    assert direct.read_bytes() == data


def test_without_direct_io_the_same_file_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A platform without O_DIRECT (macOS): every byte through the cache, the same file."""
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    monkeypatch.setattr(_direct, "DIRECT_BUFFER", DIRECT_ALIGN * 2)
    data = random.Random(2).randbytes(50_000)
    pieces, _held = pieces_of([data[:7], data[7:20_000], data[20_000:]])
    target = tmp_path / "f"
    assert replace_with(target, pieces, len(data)) is False
    assert target.read_bytes() == data

    # write_copied's bytes always pass through the buffer: in order with the rest.
    whole = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    copied = tmp_path / "copied"

    def fill(writer: DirectWriter) -> None:
        writer.write(data[:100])
        writer.write_copied(
            len(data) - 200,
            lambda into, done, n: ctypes.memmove(into, ctypes.addressof(whole) + 100 + done, n),
        )
        writer.write(data[-100:])

    replace_file(copied, tmp_path, len(data), fill)
    assert copied.read_bytes() == data


def test_a_snapshot_file_is_the_same_written_direct_or_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch", reason="snapshot files hold torch tensors")
    from restorepoint.runtime.snapshot_file import SnapshotImage
    from restorepoint.runtime.state import load_state, save_image

    generator = torch.Generator().manual_seed(3)
    state = {
        "model": {"w": torch.randn(1000, 37, generator=generator), "b": torch.arange(7)},
        "step": 12,
        "half": torch.randn(333, generator=generator).to(torch.bfloat16),
    }
    image = SnapshotImage(state)
    direct, cached = tmp_path / "direct.pt", tmp_path / "cached.pt"
    save_image(image, direct, tmp_path)
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    save_image(image, cached, tmp_path)
    assert direct.read_bytes() == cached.read_bytes()
    assert direct.stat().st_size == image.size
    loaded = load_state(direct)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert torch.equal(loaded["half"], state["half"])
    assert loaded["step"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cached.pt", "direct.pt"]


def test_a_stream_of_bytes_objects_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DirectWriter.write``: bytes, bytearrays and read-only views of any size, falling
    across the buffer's writes; the last partial block through the cache."""
    monkeypatch.setattr(_direct, "DIRECT_BUFFER", DIRECT_ALIGN * 2)
    rng = random.Random(5)
    parts: list[bytes] = []
    path = tmp_path / "stream"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writer = DirectWriter(fd)
        if not writer.direct:
            pytest.skip(f"this file system ({file_system(tmp_path)}) refuses O_DIRECT")
        for n in (1, 8191, 8192, 3, 20000, 0, 4096, 77):
            data = rng.randbytes(n)
            parts.append(data)
            kind = n % 3
            writer.write(data if kind == 0 else bytearray(data) if kind == 1 else memoryview(data))
        writer.finish()
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(parts)


def test_a_restore_point_into_a_local_store_is_written_past_the_cache(tmp_path: Path) -> None:
    """A local store's publisher: a large object (a restore point) goes direct, whole and
    in place at its commit; a small one (a marker) through the cache."""
    from restorepoint.storage import resolve

    kind = file_system(tmp_path)
    data = random.Random(9).randbytes(3 << 20)
    big = resolve(str(tmp_path / "store" / "big.rp"))
    with big.publish(size_hint=len(data)) as publisher:
        for start in range(0, len(data), 700_001):
            publisher.write(data[start : start + 700_001])
    small = resolve(str(tmp_path / "store" / "small.json"))
    with small.publish(size_hint=10) as publisher:
        publisher.write(b'{"a": 1}\n')
    store = tmp_path / "store"
    assert sorted(p.name for p in store.iterdir()) == ["big.rp", "small.json"]
    if kind != "tmpfs":  # tmpfs keeps every file in memory
        assert cached_pages(store / "big.rp") <= 1  # at most the last partial block
        assert cached_pages(store / "small.json") == 1
    assert (store / "big.rp").read_bytes() == data
    assert (store / "small.json").read_bytes() == b'{"a": 1}\n'


def test_a_publish_that_fails_midway_leaves_no_object(tmp_path: Path) -> None:
    from restorepoint.storage import resolve

    location = resolve(str(tmp_path / "store" / "x.rp"))

    def publish() -> None:
        with location.publish(size_hint=16 << 20) as publisher:
            publisher.write(b"a" * (9 << 20))  # one buffer written, a part held
            raise RuntimeError("the packer failed")

    with pytest.raises(RuntimeError, match="the packer failed"):
        publish()
    assert list((tmp_path / "store").iterdir()) == []
