"""The pause's copies (runtime/capture.py): gathered while the state is walked and made
together, CPU tensors on a few threads in pieces. What comes out is what a copy one tensor at a
time gives, bit for bit, in memory of its own (or the last snapshot's, reused), whatever the
layout of the source; a state that is refused copies nothing."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from restorepoint.errors import UsageError  # noqa: E402
from restorepoint.runtime import capture  # noqa: E402
from restorepoint.runtime.capture import Buffers, Copies  # noqa: E402
from restorepoint.runtime.state import to_cpu  # noqa: E402


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    big = torch.randn(640, 1000)  # 2.4 MiB: several pieces of 256 KiB
    meta: Any = OrderedDict(weight=torch.randn(3, 5).to(torch.bfloat16))
    meta._metadata = {"": {"version": 1}}
    return {
        "big": big,
        "strided": big.t()[::3],  # not one run of memory: copied whole
        "scalar": torch.tensor(7, dtype=torch.int64),
        "flags": torch.rand(11) > 0.5,
        "empty": torch.empty(0, 4),
        "nested": [meta, (torch.arange(10, dtype=torch.int16), 3.5, "text")],
    }


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and b.is_contiguous()
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b) and getattr(a, "_metadata", None) == getattr(b, "_metadata", None)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _pointers(value: Any) -> set[int]:
    if isinstance(value, torch.Tensor):
        return {value.data_ptr()} if value.numel() else set()
    if isinstance(value, dict):
        return {p for v in value.values() for p in _pointers(v)}
    if isinstance(value, (list, tuple)):
        return {p for v in value for p in _pointers(v)}
    return set()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_the_copies_made_together_hold_the_state_bit_for_bit(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capture, "COPY_PIECE", 256 << 10)
    state = _state()
    copies = Copies(threads)
    got = to_cpu(state, "state", copies=copies)
    copies.run()
    _same(state, got)
    # Memory of its own: training that goes on changes none of it.
    assert not _pointers(got) & _pointers(state)
    before = got["big"].clone()
    state["big"].add_(1.0)
    assert torch.equal(got["big"], before)


def test_the_copies_go_into_the_last_snapshot_s_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "COPY_PIECE", 256 << 10)
    state = _state()
    buffers = Buffers()
    first = to_cpu(state, "state", buffers)
    buffers.give(first)
    state["big"].mul_(2.0)
    copies = Copies(2)
    second = to_cpu(state, "state", buffers, copies)
    copies.run()
    _same(state, second)
    assert _pointers(second) == _pointers(first)  # every tensor into the memory given back


def test_a_refused_state_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The walk refuses before any copy is made: the copies of what came before are never run.
    runs: list[int] = []
    real = Copies.run

    def run(self: Copies) -> None:
        runs.append(1)
        real(self)

    monkeypatch.setattr(Copies, "run", run)
    with pytest.raises(UsageError, match=r"the state at \['bad'\] is a object, which"):
        to_cpu({"fine": torch.ones(4), "bad": object()})
    assert runs == []
    to_cpu({"fine": torch.ones(4)})
    assert runs == [1]


def test_a_large_state_is_split_into_pieces_for_the_threads() -> None:
    into, source = torch.empty(3 * capture.COPY_PIECE // 4 + 5), torch.randn(1)
    assert len(capture._pieces(into, source.expand(into.shape))) == 1  # strided: whole
    source = torch.randn(into.shape)
    pieces = capture._pieces(into, source)
    assert len(pieces) == 4  # three whole pieces and the 20 bytes left
    assert sum(p[0].numel() for p in pieces) == into.numel()
    for a, b in pieces:
        a.copy_(b)
    assert torch.equal(into, source)


def test_without_threads_the_copies_are_made_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # While the interpreter shuts down no thread can start: the copies are made one by one.
    import concurrent.futures

    class Refused(concurrent.futures.ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Refused)
    monkeypatch.setattr(capture, "COPY_PIECE", 256 << 10)
    state = _state()
    copies = Copies(2)
    got = to_cpu(state, "state", copies=copies)
    copies.run()
    _same(state, got)


def test_a_stop_s_snapshot_is_the_state_s_own_memory_where_that_is_one_run() -> None:
    """``Copies(live=True)``, a stop's: training waits until the process exits, so a CPU
    tensor in one run of memory is published from its own memory (no pause for a copy, no
    second copy of the state), and the memory given back by the last snapshot is not
    taken. A tensor that is not one run of memory is still copied, contiguous."""
    state = _state()
    buffers = Buffers()
    kept = to_cpu(state, "state", buffers)
    buffers.give(kept)
    copies = Copies(2, live=True)
    got = to_cpu(state, "state", buffers, copies)
    copies.run()
    _same(state, got)
    assert got["big"] is state["big"] or got["big"].data_ptr() == state["big"].data_ptr()
    assert got["nested"][1][0].data_ptr() == state["nested"][1][0].data_ptr()
    assert got["strided"].data_ptr() not in _pointers(state)
    assert not _pointers(got) & _pointers(kept)
