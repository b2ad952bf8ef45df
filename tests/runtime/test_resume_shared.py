"""A resume from a store that is a local path makes its tensors of the import's own bytes: the
import decodes each file into one buffer of its own, verifies it, and the snapshot file's
tensors are views of that buffer, with no copy of their bytes. The state is bit for bit the
saved one, training goes on from it exactly as from a state loaded by torch, the memory of
what the model copied into its parameters goes back to the system, and bytes once made into a
tensor are never read again as the file's."""

from __future__ import annotations

import gc
import json
import mmap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from restorepoint import _posix
from restorepoint.errors import IntegrityError
from restorepoint.ops import _contents
from restorepoint.ops._contents import Contents, file_buffer
from restorepoint.ops.unpack import import_restore_point
from restorepoint.runtime.snapshot_file import read_snapshot_held
from restorepoint.runtime.state import load_state, save_state
from restorepoint.torch import ResumableRun

from .test_resume_in_memory import (
    CONFIG,
    QUICK,
    _clone,
    model_and_optimizer,
    published,
    rng_kept,  # noqa: F401 - the fixture, used by every test here
    same,
    state_of,
    the_restore_point,
)


def shared(t: torch.Tensor) -> bool:
    """Whether a tensor's memory is held bytes made into a tensor (torch.frombuffer: a storage
    that cannot be resized), not memory a copy was made into."""
    return not t.untyped_storage().resizable()


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def test_the_resumed_optimizer_state_is_the_imports_bytes_and_trains_on(
    tmp_path: Path,
) -> None:
    """The optimizer keeps the tensors it is given: they are the import's bytes, shared, not
    copies. Two steps later the resumed run and a run restored from the saved state by torch
    agree bit for bit (the shared memory is writable, and the optimizer's in-place updates
    land in it)."""
    store, saved = published(tmp_path)
    model, optimizer = model_and_optimizer(1)
    with ResumableRun(CONFIG, run_dir=tmp_path / "b", store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
        assert run.step == 3
    assert same(_clone(state_of(model, optimizer)), saved)
    moments = [t for t in optimizer_tensors(optimizer) if t.dim()]
    assert moments and all(shared(t) for t in moments)
    assert not any(shared(p) for p in model.parameters())  # the model copied its own

    reference, reference_opt = model_and_optimizer(2)
    reference.load_state_dict(saved["model"])
    reference_opt.load_state_dict(_clone(saved["optimizer"]))
    batches = [torch.randn(16, 64, generator=torch.Generator().manual_seed(s)) for s in (5, 6)]
    for m, opt in ((model, optimizer), (reference, reference_opt)):
        for x in batches:
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    assert same(state_of(model, optimizer), state_of(reference, reference_opt))


def test_what_the_model_copied_goes_back_to_the_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the model has copied its parameters out of the shared bytes, nothing refers to
    them: their whole pages are handed back (madvise), those of the optimizer's state are
    not, and a resume in a fresh process that ran out of memory would see the difference."""
    given: list[int] = []
    give_back = _contents.give_back

    def recorded(address: int, length: int) -> None:
        given.append(length)
        give_back(address, length)

    monkeypatch.setattr(_contents, "give_back", recorded)
    # The state here is small: its file gets a mapping of its own as a large one does.
    monkeypatch.setattr(_posix, "HUGE_ADVICE", 0)
    store, _ = published(tmp_path)
    model, optimizer = model_and_optimizer(1)
    with ResumableRun(CONFIG, run_dir=tmp_path / "b", store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
    gc.collect()
    parameters = sorted(p.numel() * p.element_size() for p in model.parameters())
    moments = optimizer_tensors(optimizer)
    # Every parameter's bytes (and small things: the RNG states, the steps) were given back;
    # none of the optimizer's, which still trains on them.
    assert sorted(n for n in given if n in parameters) == parameters
    assert all(shared(t) for t in moments if t.dim())
    del optimizer, moments, run  # the run tracks the optimizer
    gc.collect()
    # With the optimizer gone, its two moments' bytes per parameter go back as well.
    times = Counter(given)
    assert all(times[n] == 3 for n in parameters), (times, parameters)


def test_pages_given_back_read_as_zeros_and_the_rest_stays() -> None:
    """``Contents.share`` hands out writable memory of the file's buffer; what it gives back
    is the whole pages inside the range, and the bytes around them stay as they were."""
    size = 8 << 20  # a mapping of its own (huge_buffer) wherever the system makes one
    buffer, own = file_buffer(size)
    pattern = bytes(range(1, 256)) * (size // 255 + 1)
    buffer[:] = pattern[:size]
    contents = Contents()
    contents.adopt(buffer, own)
    contents.append(buffer.toreadonly())
    start, end = 3 * mmap.PAGESIZE + 5, 9 * mmap.PAGESIZE + 7
    got = contents.share(start, end)
    assert got is not None
    view, release = got
    assert not view.readonly and bytes(view) == pattern[start:end]
    if not own:
        assert release is None
        return
    assert release is not None
    release()
    whole = bytes(buffer[start:end])
    inner = (4 * mmap.PAGESIZE - start, 9 * mmap.PAGESIZE - start)
    assert whole[: inner[0]] == pattern[start : 4 * mmap.PAGESIZE]
    assert whole[inner[0] : inner[1]] == bytes(inner[1] - inner[0])
    assert whole[inner[1] :] == pattern[9 * mmap.PAGESIZE : end]
    assert bytes(buffer[:start]) == pattern[:start]


def test_shared_bytes_are_never_read_again_as_the_files() -> None:
    """Bytes made into a tensor are the tensor's: a read of them, or a second share, is
    refused (ValueError); the bytes beside them still read. Held bytes with a staging copy to
    write, or without one buffer, are not shared at all (None)."""
    data = bytes(range(256)) * 64
    buffer, own = file_buffer(len(data))
    buffer[:] = data
    contents = Contents()
    contents.adopt(buffer, own)
    contents.append(buffer.toreadonly())
    assert contents.share(100, 200) is not None
    for start, end in [(150, 160), (0, 101), (199, 300), (100, 200)]:
        with pytest.raises(ValueError, match="shared"):
            contents.read(start, end)
    with pytest.raises(ValueError, match="shared"):
        contents.share(150, 300)
    assert contents.read(0, 100) == data[:100]
    assert contents.read(200, 300) == data[200:300]
    assert contents.share(300, 400) is not None

    unplaced = Contents()
    unplaced.append(data)
    assert unplaced.share(0, 10) is None


def test_a_misaligned_tensor_is_copied_and_an_aligned_one_shared(tmp_path: Path) -> None:
    """A snapshot file whose float tensor lies at an odd offset (a foreign writer; ours aligns
    every tensor to its element size) still loads, bit for bit: that tensor is copied out, the
    one-byte tensor before it is shared."""
    small = torch.tensor([7, 8, 9], dtype=torch.uint8)
    floats = torch.arange(5, dtype=torch.float32) / 3
    save_state({"a": floats, "b": small}, tmp_path / "last.pt", tmp_path)
    raw = (tmp_path / "last.pt").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    body = raw[8 + length :]
    spans = {name: header[name]["data_offsets"] for name in header if name != "__metadata__"}
    # The uint8 tensor first (3 bytes), the float32 one right after it, at offset 3.
    (byte_name,) = [n for n in spans if header[n]["dtype"] == "U8"]
    (float_name,) = [n for n in spans if header[n]["dtype"] == "F32"]
    byte_bytes = body[slice(*spans[byte_name])]
    float_bytes = body[slice(*spans[float_name])]
    header[byte_name]["data_offsets"] = [0, 3]
    header[float_name]["data_offsets"] = [3, 3 + len(float_bytes)]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    crafted = len(text).to_bytes(8, "little") + text + byte_bytes + float_bytes
    buffer, own = file_buffer(len(crafted))
    buffer[:] = crafted
    contents = Contents()
    contents.adopt(buffer, own)
    contents.append(buffer.toreadonly())
    state: Any = read_snapshot_held("crafted", contents)
    assert torch.equal(state["a"], floats) and torch.equal(state["b"], small)
    assert shared(state["b"]) and not shared(state["a"])


def test_an_import_without_a_copy_loads_the_same_state_twice(tmp_path: Path) -> None:
    """Two imports without a copy of one restore point give two states of their own: a change
    to one's tensors is not the other's."""
    store, saved = published(tmp_path)
    rp = str(the_restore_point(store))
    states = []
    for _ in range(2):
        result = import_restore_point(rp, tmp_path / "x", in_memory=True, copy=False)
        assert result.contents is not None
        held = {Path(result.dest) / p: c for p, c in result.contents.items()}
        states.append(load_state(Path(result.dest) / "last.pt", held=held))
    first, second = (s["objects"]["optimizer"]["state"] for s in states)
    key = next(iter(first))
    assert same(first, second)
    first[key]["exp_avg"].add_(1)
    assert not torch.equal(first[key]["exp_avg"], second[key]["exp_avg"])
    assert same(second[key]["exp_avg"], saved["optimizer"]["state"][key]["exp_avg"])


def test_held_bytes_shared_before_are_refused_as_a_damaged_file(tmp_path: Path) -> None:
    """Bytes already made into a tensor are not the file's any more: a read of the state that
    would share them again is refused as an IntegrityError naming the file, not a traceback
    of the buffer's bookkeeping."""
    save_state({"a": torch.arange(64, dtype=torch.float32)}, tmp_path / "last.pt", tmp_path)
    data = (tmp_path / "last.pt").read_bytes()
    buffer, own = file_buffer(len(data))
    buffer[:] = data
    contents = Contents()
    contents.adopt(buffer, own)
    contents.append(buffer.toreadonly())
    assert contents.share(len(data) - 8, len(data)) is not None
    with pytest.raises(IntegrityError, match="share bytes"):
        read_snapshot_held("twice", contents)
