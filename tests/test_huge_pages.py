"""Fresh memory in huge pages (``_posix.advise_huge_pages``, ``_posix.huge_buffer``) or
faulted in by one call (``_posix.populate``): the advice reaches the kernel for the memory it
names, a huge buffer is aligned, exact, writable and goes back to the system with its last
view, a populated range is resident with its bytes unchanged, and what is made in such memory
(a decoded planes chunk, a snapshot's tensors, a pause's copies) is bit for bit what was
stored."""

from __future__ import annotations

import ctypes
import gc
import mmap
import sys
from pathlib import Path

import pytest

from restorepoint import _posix
from restorepoint._posix import (
    HUGE_ADVICE,
    POPULATE_MIN,
    _madvise,
    advise_huge_pages,
    freed_memory_reported,
    huge_buffer,
    populate,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _madvise() is None,
    reason="transparent huge pages are Linux's (and need its sysfs entry)",
)


@pytest.fixture(autouse=True)
def kept_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The advice as a guest whose freed memory stays its own asks for it: on a guest that
    reports freed memory to its host (this test suite's VM may), none is asked for, and the
    tests of that are below."""
    monkeypatch.setattr(_posix, "freed_memory_reported", lambda: False)


def _balloon(root: Path, name: str, features: str | None) -> None:
    device = root / name
    device.mkdir(parents=True)
    if features is not None:
        (device / "features").write_text(features + "\n")


def test_a_balloon_that_reports_freed_memory_is_seen(tmp_path: Path) -> None:
    """Free page reporting is bit 5 of a virtio balloon's features (VIRTIO_BALLOON_F_REPORTING);
    no balloon, a balloon without it, or one whose features cannot be read is no reporting."""
    check = freed_memory_reported.__wrapped__
    assert not check(str(tmp_path / "none"))
    _balloon(tmp_path / "a", "virtio0", "0110000100" + "0" * 118)
    assert not check(str(tmp_path / "a"))
    _balloon(tmp_path / "b", "virtio0", None)
    _balloon(tmp_path / "b", "virtio3", "0110010100" + "0" * 118)
    assert check(str(tmp_path / "b"))
    _balloon(tmp_path / "c", "virtio0", "0110")
    assert not check(str(tmp_path / "c"))


def test_where_freed_memory_is_reported_no_huge_page_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """There a fresh huge page is memory the host must back again at its first touch: the
    fresh memory is left to the kernel's 4 KiB pages, which it recycles; a buffer of its own
    is still a mapping of its own."""
    monkeypatch.setattr(_posix, "freed_memory_reported", lambda: True)
    own = huge_buffer(HUGE_ADVICE * 2)
    assert own is not None  # a mapping of its own still, for its pages to be given back
    assert len(own) == HUGE_ADVICE * 2 and not _advised(_address(own))
    del own
    size = 4 * HUGE_ADVICE
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        address = _address(memoryview(mapping))
        advise_huge_pages(address, size)
        assert not _advised(address + size // 2)
    finally:
        gc.collect()
        mapping.close()


def _mapping(address: int) -> dict[str, str] | None:
    """The fields of /proc/self/smaps for the mapping that holds ``address``."""
    found: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            if found is not None:
                break
            if low <= address < high:
                found = {}
        elif found is not None:
            key, _, value = line.partition(":")
            found[key] = value.strip()
    return found


def _advised(address: int) -> bool:
    fields = _mapping(address)
    assert fields is not None, "no mapping holds the address"
    return "hg" in fields["VmFlags"].split()


def _address(view: memoryview) -> int:
    probe = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def test_a_huge_buffer_is_aligned_exact_writable_advised_and_given_back() -> None:
    huge = _madvise()[1]  # type: ignore[index]
    size = 2 * HUGE_ADVICE + 12345
    view = huge_buffer(size)
    assert view is not None and len(view) == size and not view.readonly
    address = _address(view)
    assert address % huge == 0
    assert _advised(address) and _advised(address + size - 1)
    pattern = bytes(range(256)) * (size // 256) + bytes(size % 256)
    view[:] = pattern
    assert bytes(view) == pattern
    # The mapping is the buffer's own: with its last view it is unmapped (the address may be
    # mapped again since, by the allocator for reading smaps itself, but not advised).
    view.release()
    del view
    gc.collect()
    again = _mapping(address)
    assert again is None or "hg" not in again["VmFlags"].split()
    assert huge_buffer(HUGE_ADVICE - 1) is None


def test_the_advice_names_only_the_whole_huge_pages_inside_the_memory() -> None:
    # A fresh mapping of its own (memory the allocator hands out may have been advised
    # before, in a long process), and a range that starts one page into it.
    huge = _madvise()[1]  # type: ignore[index]
    mapping = mmap.mmap(-1, 4 * huge)
    view = memoryview(mapping)
    base = _address(view)
    start = base + mmap.PAGESIZE
    advise_huge_pages(start, 3 * huge)
    inside = -(-start // huge) * huge
    assert _advised(inside) and _advised(inside + huge - 1)
    if inside - start >= mmap.PAGESIZE:  # the part before the first whole huge page
        assert not _advised(start)
    # Nothing to advise, and odd ranges, are no error.
    advise_huge_pages(start + 1, 10)
    advise_huge_pages(start, 0)
    view.release()
    mapping.close()


def _resident_kib(address: int) -> int:
    fields = _mapping(address)
    assert fields is not None, "no mapping holds the address"
    return int(fields["Rss"].split()[0])


def test_populate_makes_the_whole_pages_inside_resident_and_changes_no_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = mmap.PAGESIZE
    size = POPULATE_MIN + 8 * page
    # A fresh private mapping of its own: nothing of it is resident until it is written.
    mapping = mmap.mmap(-1, size)
    view = memoryview(mapping)
    base = _address(view)
    view[page : page + 5] = b"kept!"
    assert _resident_kib(base) == page // 1024
    # A range that starts inside the first page and ends inside the last one.
    populate(base + 100, size - 200)
    if _posix._populate_refused:
        pytest.skip("this kernel does not know MADV_POPULATE_WRITE (before Linux 5.14)")
    # The whole pages inside it (the one written before among them), not the first and last
    # it only touches.
    assert _resident_kib(base) == (size - 2 * page) // 1024
    assert bytes(view[page : page + 5]) == b"kept!"
    assert bytes(view[2 * page : 3 * page]) == bytes(page)
    view.release()
    mapping.close()

    # Below POPULATE_MIN: not worth a call, nothing made resident.
    small = mmap.mmap(-1, POPULATE_MIN)
    small_view = memoryview(small)
    populate(_address(small_view), POPULATE_MIN - 1)
    assert _resident_kib(_address(small_view)) == 0
    # A kernel that refused it once is not asked again: still no error, nothing done.
    monkeypatch.setattr(_posix, "_populate_refused", True)
    populate(_address(small_view), POPULATE_MIN)
    assert _resident_kib(_address(small_view)) == 0
    small_view.release()
    small.close()


def test_a_big_held_planes_chunk_decodes_into_a_huge_buffer_bit_for_bit() -> None:
    np = pytest.importorskip("numpy")
    from restorepoint.format import PlanesCodec

    rng = np.random.default_rng(0)
    plain = (rng.standard_normal(HUGE_ADVICE // 4) * 0.02).astype(np.float32).tobytes() + b"ab"
    codec = PlanesCodec(1)
    stored = codec.encode(plain)
    assert stored[0] == 2  # byte planes: the merge made it
    # Held by its caller (an import in memory): a mapping of its own, advised.
    decoded = codec.decode(stored, len(plain), held=True)
    assert bytes(decoded) == plain
    assert _advised(np.frombuffer(decoded, np.uint8).ctypes.data)
    # Let go at once (verify, an import to disk): the allocator's memory, reused chunk after
    # chunk, and the same bytes.
    again = codec.decode(stored, len(plain))
    assert bytes(again) == plain


def test_big_tensors_are_made_in_advised_memory_bit_for_bit(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from restorepoint.runtime.capture import Copies
    from restorepoint.runtime.state import read_state, save_state

    g = torch.Generator().manual_seed(0)
    big = torch.randn(HUGE_ADVICE // 4 + 7, generator=g)
    # Between POPULATE_MIN and HUGE_ADVICE: populated, not advised.
    mid = torch.randn(POPULATE_MIN // 4 * 3 + 5, generator=g)
    small = torch.randn(16, generator=g)
    # The pause's copies: a fresh CPU tensor for each, the big one advised.
    copies = Copies()
    into = [copies.add(big), copies.add(small)]
    copies.run()
    assert torch.equal(into[0], big) and torch.equal(into[1], small)
    assert _advised(into[0].data_ptr() + into[0].numel() * 4 // 2)
    # A snapshot file read back: each tensor made in its own memory, the big one advised.
    save_state({"big": big, "mid": mid, "small": small}, tmp_path / "last.pt", tmp_path)
    state = read_state(tmp_path / "last.pt")
    assert torch.equal(state["big"], big) and torch.equal(state["small"], small)
    assert torch.equal(state["mid"], mid)
    assert _advised(state["big"].data_ptr() + big.numel() * 4 // 2)
