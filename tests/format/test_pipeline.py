"""The writer's and reader's pools: each file's sha256 is fed in chunk order from any thread,
files hash side by side, memory stays within the budget, and the order of checks is the spec's
(a file is reported verified only after its digest has been compared)."""

from __future__ import annotations

import hashlib
import io
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import restorepoint
from restorepoint import DigestMismatch
from restorepoint.format import PayloadDecoder, read_manifest
from restorepoint.format import _pipeline as pipeline
from restorepoint.testing import ForgedEntry, Parts, assemble

CHUNK = 65536


def never() -> None:
    """A pipeline that never fails."""


@given(
    chunks=st.lists(st.binary(max_size=3000), max_size=40),
    seed=st.integers(0, 2**32 - 1),
    threads=st.integers(1, 6),
)
@settings(max_examples=150, deadline=None)
def test_a_lane_hashes_in_order_whatever_order_its_chunks_arrive_in(
    chunks: list[bytes], seed: int, threads: int
) -> None:
    lane = pipeline.HashLane(len(chunks))
    order = list(range(len(chunks)))
    random.Random(seed).shuffle(order)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: lane.feed(i, chunks[i]), order))
    assert lane.hexdigest(never) == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_a_budget_lets_one_chunk_in_even_when_it_is_larger() -> None:
    budget = pipeline.Budget(10, 4)
    ticket = budget.acquire(100, never)
    assert not budget.has_room(1)
    ticket.done()
    assert not budget.has_room(1)  # both uses are needed: hashed, and written or handed out
    ticket.done()
    assert budget.has_room(10)


def test_a_waiting_reader_sees_the_pipeline_fail() -> None:
    budget = pipeline.Budget(10, 1)
    budget.acquire(5, never)
    failed = threading.Event()

    def check() -> None:
        if failed.is_set():
            raise RuntimeError("stopped")

    threading.Timer(0.3, failed.set).start()
    with pytest.raises(RuntimeError, match="stopped"):
        budget.acquire(5, check)


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def many_files() -> dict[str, bytes]:
    rng = random.Random(7)
    files = {f"shard-{i:03d}.bin": rng.randbytes(rng.randrange(0, 3 * CHUNK)) for i in range(60)}
    files["big.bin"] = rng.randbytes(9 * CHUNK + 5)
    files["empty"] = b""
    return files


@pytest.mark.parametrize("codec", ["auto", "zstd", "none"])
def test_every_thread_count_writes_the_same_payload(tmp_path: Path, codec: str) -> None:
    files = many_files()
    write_tree(tmp_path / "src", files)
    results = [
        restorepoint.pack(
            tmp_path / "src",
            str(tmp_path / f"{threads}.rp"),
            position=1,
            chunk_size=CHUNK,
            threads=threads,
            codec=codec,
        )
        for threads in (1, 2, 4)
    ]
    payloads = [[e.to_dict() for e in r.manifest.payload or ()] for r in results]
    assert payloads[0] == payloads[1] == payloads[2]
    assert {e["path"]: e["sha256"] for e in payloads[0]} == {
        path: hashlib.sha256(data).hexdigest() for path, data in files.items()
    }
    for threads in (1, 3):
        report = restorepoint.verify(str(tmp_path / "2.rp"), threads=threads)
        assert report.bytes == sum(len(d) for d in files.values())


def budget_peaks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes in flight of every budget after each acquire, from now on."""
    peaks: list[int] = []
    acquire = pipeline.Budget.acquire

    def tracking(self: pipeline.Budget, n: int, failed: object) -> pipeline.Ticket:
        ticket = acquire(self, n, failed)  # type: ignore[arg-type]
        peaks.append(self._bytes)
        return ticket

    monkeypatch.setattr(pipeline.Budget, "acquire", tracking)
    return peaks


def test_the_writer_stays_within_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks = budget_peaks(monkeypatch)
    write_tree(tmp_path / "src", many_files())
    restorepoint.pack(
        tmp_path / "src", str(tmp_path / "rp.rp"), position=1, chunk_size=CHUNK, threads=2
    )
    # max(2, 2 * threads) chunks' worth: 4 * 64 KiB, whatever the payload's size (2.3 MB here).
    assert max(peaks) <= 4 * CHUNK
    assert len(peaks) > 40


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def size(self) -> int:
        return len(self.data)

    def read_range(self, start: int, end: int) -> bytes:
        return self.data[start:end]


def test_a_file_is_reported_verified_only_after_all_its_chunks_and_its_digest() -> None:
    files = {f"f{i:02d}.bin": bytes([i]) * (i * 20000 + 1) for i in range(12)}
    parts = Parts.sample(files={})
    parts.entries = [ForgedEntry.from_bytes(p, files[p], chunk_size=CHUNK) for p in sorted(files)]
    # One byte of the ninth file flipped in its stored bytes, its digest left as it was.
    bad = parts.entries[8]
    bad.stored_chunks[-1] = bad.stored_chunks[-1][:-1] + b"\xff"
    data = assemble(parts)
    head, manifest = read_manifest(_Bytes(data))
    stream = io.BytesIO(data)
    stream.seek(head.data_start)
    seen: dict[str, int] = {}
    verified: list[str] = []

    def consume() -> None:
        for entry, chunk in PayloadDecoder(manifest, stream, threads=4).events():
            if chunk is None:
                assert seen.get(entry.path, 0) == entry.size
                verified.append(entry.path)
            else:
                seen[entry.path] = seen.get(entry.path, 0) + len(chunk)

    with pytest.raises(DigestMismatch) as info:
        consume()
    assert info.value.member == "f08.bin"
    assert verified == sorted(files)[:8]
