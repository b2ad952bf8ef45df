"""Taking a snapshot (the pause): what a snapshot may store, checked as the state is walked,
and every tensor's copy to contiguous CPU memory, into the last snapshot's memory where it
fits and on a few threads at once. The file that holds a snapshot is ``snapshot_file``'s."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from .._posix import HUGE_ADVICE, advise_huge_pages
from ..errors import UsageError
from .snapshot_file import DTYPES, MAX_INT_DIGITS, MAX_STATE_DEPTH, refuse

__all__ = ["COPY_PIECE", "COPY_THREADS", "Buffers", "Copies", "storable"]


class Buffers:
    """The tensors of the newest snapshot that is done with (published and saved), kept to
    copy the next snapshot into: a copy into pages already faulted in takes a fraction of a
    copy into fresh ones (which the kernel must find, zero and map first; at 1 GiB, 0.2 s
    against 1.3 to 2.1 s on the VM of docs/performance.md). The memory is the one snapshot
    copy's, held between snapshots instead of given back and taken again: never more than one
    snapshot's worth is kept."""

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, tuple[int, ...]], list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, like: torch.Tensor, copies: Copies) -> torch.Tensor:
        """A contiguous CPU tensor of ``like``'s dtype and shape that holds a copy of it once
        ``copies.run()`` has run: a buffer given back, or new memory."""
        key = (like.dtype, tuple(like.shape))
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
        return copies.add(like, buffer)

    def give(self, state: Any) -> None:
        """The tensors of a snapshot nothing reads any more, in the place of those kept."""
        free: dict[tuple[torch.dtype, tuple[int, ...]], list[torch.Tensor]] = {}
        for t in _tensors(state):
            free.setdefault((t.dtype, tuple(t.shape)), []).append(t)
        with self._lock:
            if not self._closed:
                self._free = free

    def close(self) -> None:
        """Give the memory back: the run is over (a snapshot still in hand later keeps its
        own)."""
        with self._lock:
            self._free = {}
            self._closed = True


#: The pause's copies run on at most this many threads (and no more than the cores): a copy
#: into fresh pages is mostly the kernel finding and zeroing them, which scales with cores.
COPY_THREADS = 4
#: A CPU tensor's copy is split into pieces of this many bytes, so that one large tensor (an
#: embedding table) is copied on every thread too; below twice this, a state is copied on
#: the calling thread alone.
COPY_PIECE = 64 << 20


class Copies:
    """The copies of a snapshot's tensors, gathered while the state is walked and made
    together by ``run``: a CPU tensor's on up to COPY_THREADS threads, in pieces of
    COPY_PIECE bytes (torch's copy releases the GIL); any other tensor (a GPU's) on the
    calling thread, as before. The pause is the copy, and training waits for it whole, so
    the copy may take every core: on the 2-core VM of docs/performance.md, 3.75 GiB took 0.92
    s on two threads against 1.65 s on one."""

    def __init__(self, threads: int | None = None, *, live: bool = False) -> None:
        self.threads = max(
            1, min(COPY_THREADS, os.cpu_count() or 1) if threads is None else threads
        )
        #: A stop's snapshot (``ResumableRun.snapshot(live=True)``): training waits until the
        #: process exits, so nothing changes the state while it is published, and a CPU
        #: tensor that is one run of memory is published from its own memory, not a copy.
        self.live = live
        self._cpu: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._other: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, source: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """The contiguous CPU tensor that will hold ``source`` (``into``, or a new one);
        ``live``: ``source`` itself where it is one (no copy)."""
        if self.live and source.device.type == "cpu" and source.is_contiguous():
            return source
        if into is None:
            into = torch.empty(tuple(source.shape), dtype=source.dtype, device="cpu")
            size = into.numel() * into.element_size()
            if size >= HUGE_ADVICE:
                # Fresh memory, filled whole by the copy: a fault per huge page, not per 4 KiB.
                advise_huge_pages(into.data_ptr(), size)
        if source.device.type == "cpu":
            self._cpu.append((into, source))
        else:
            self._other.append((into, source))
        return into

    def run(self) -> None:
        """Make every copy; the tensors ``add`` returned then hold their sources."""
        for into, source in self._other:
            into.copy_(source)
        total = sum(into.numel() * into.element_size() for into, _ in self._cpu)
        pieces = [p for into, source in self._cpu for p in _pieces(into, source)]
        self._cpu, self._other = [], []
        if self.threads == 1 or total < 2 * COPY_PIECE:
            for into, source in pieces:
                into.copy_(source)
            return
        from concurrent.futures import ThreadPoolExecutor

        try:
            with ThreadPoolExecutor(self.threads, thread_name_prefix="rp-copy") as pool:
                for _ in pool.map(lambda p: p[0].copy_(p[1]), pieces):
                    pass
        except RuntimeError:
            # No new thread now (a snapshot taken while the interpreter shuts down): every
            # copy on this thread, the same bytes.
            for into, source in pieces:
                into.copy_(source)


def _pieces(into: torch.Tensor, source: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``into``'s copy of ``source`` as copies of COPY_PIECE bytes each where both are one run
    of memory (a strided source is copied whole)."""
    size = into.numel() * into.element_size()
    if size <= COPY_PIECE or not source.is_contiguous() or into.dim() == 0:
        return [(into, source)]
    step = max(1, COPY_PIECE // into.element_size())
    flat_into, flat_source = into.view(-1), source.view(-1)
    return [
        (flat_into[i : i + step], flat_source[i : i + step]) for i in range(0, into.numel(), step)
    ]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        out = [t for item in value.values() for t in _tensors(item)]
        return out + _tensors(getattr(value, "_metadata", None))
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def storable(  # noqa: PLR0911, PLR0912 - a case per kind of value
    value: Any,
    where: str = "",
    depth: int = 0,
    buffers: Buffers | None = None,
    *,
    copies: Copies,
) -> Any:
    """``value`` with every tensor copied to contiguous CPU memory (what a snapshot pauses
    for; into ``buffers`` where they hold a tensor of its dtype and shape), or UsageError
    naming the key path and type of the first value a snapshot cannot store. Dict subclasses
    come back as dicts (an OrderedDict keeps its ``_metadata``), tuple subclasses
    (torch.Size) as tuples. The tensors hold their copies once ``copies.run()`` has run, all
    made together (nothing is copied for a state that is refused)."""
    if depth > MAX_STATE_DEPTH:
        raise UsageError(
            f"cannot snapshot: the state at {where} nests deeper than {MAX_STATE_DEPTH}"
        )
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.dtype not in DTYPES or value.is_quantized:
            raise UsageError(
                f"cannot snapshot: the tensor at {where or '(root)'} is {value.layout} "
                f"{value.dtype}, which a snapshot does not store; store a dense tensor of a "
                "plain dtype (docs/adapters.md, 'What a snapshot stores')"
            )
        t = value.detach().resolve_conj().resolve_neg()
        return copies.add(t) if buffers is None or copies.live else buffers.take(t, copies)
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise refuse(where, value) from None
        return value
    if isinstance(value, int):
        if len(str(abs(int(value)))) > MAX_INT_DIGITS:
            raise UsageError(
                f"cannot snapshot: the integer at {where} has over {MAX_INT_DIGITS} digits"
            )
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping) and isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise UsageError(
                    f"cannot snapshot: a key at {where or '(root)'} is a {type(key).__name__}; "
                    "keys must be strings or integers"
                )
            out[key] = storable(item, f"{where}[{key!r}]", depth + 1, buffers, copies=copies)
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            ordered: Any = OrderedDict(out)
            ordered._metadata = storable(
                meta, f"{where}._metadata", depth + 1, buffers, copies=copies
            )
            return ordered
        return out
    if isinstance(value, list):
        return [
            storable(item, f"{where}[{i}]", depth + 1, buffers, copies=copies)
            for i, item in enumerate(value)
        ]
    if isinstance(value, tuple) and (type(value) is tuple or isinstance(value, torch.Size)):
        return tuple(
            storable(item, f"{where}[{i}]", depth + 1, buffers, copies=copies)
            for i, item in enumerate(value)
        )
    raise refuse(where, value)
