"""The publish process's side (``publish_process`` is the parent's): it reads its parent's
memory, runs the one publish (``ops.publish``) for each job the parent hands over, one at a
time, and answers each as data. Started as ``python -c publish_process._BOOT PARENT_PID``,
which ignores the stop and snapshot signals before anything else and then runs ``main``; it
imports no torch."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any, BinaryIO

from .._posix import die_with_parent, read_memory, set_thread_nice
from ..errors import RestorePointError
from ..storage import deadline_left, set_store_deadline
from ._increment import Rest
from ._publish_wire import Peer, job_from, receive, send
from ._source import BytesFile, PiecesReader
from .publish import publish

__all__ = ["main"]


class _PeerSource:
    """A payload file of ``ops.publish``'s ``memory``, read out of the parent's memory."""

    def __init__(self, pid: int, peer: Peer) -> None:
        self._pid = pid
        self._peer = peer

    @property
    def size(self) -> int:
        return self._peer.size

    def open(self) -> BinaryIO:
        return _PeerReader(self._pid, self._peer)  # type: ignore[return-value]


class _PeerReader(PiecesReader):
    """The bytes of a Peer, each read one copy out of the parent's memory into a buffer of
    its own (uninitialised: numpy's where the child has it; a bytearray's zero fill is a pass
    over the bytes for nothing)."""

    def __init__(self, pid: int, peer: Peer) -> None:
        super().__init__([peer.head, *peer.regions])
        self._pid = pid

    def allocate(self, size: int) -> tuple[int, memoryview]:
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            array = numpy.empty(size, numpy.uint8)
            return int(array.ctypes.data), memoryview(array).toreadonly()
        raw = bytearray(size)
        address = ctypes.addressof((ctypes.c_char * size).from_buffer(raw))
        return address, memoryview(raw).toreadonly()

    def fetch(self, into: int, address: int, length: int) -> None:
        read_memory(self._pid, address, into, length)


def _outcome(result: Any) -> dict[str, Any]:
    pack = result.pack
    prune = result.prune_error
    return {
        "kind": "done",
        "ok": True,
        "url": result.url,
        "size": pack.size,
        "incremental": pack.incremental,
        "reused": pack.reused,
        "choices": pack.choices.to_dict() if pack.choices is not None else None,
        "prune_error": _failure(prune) if prune is not None else None,
    }


def _failure(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RestorePointError):
        return {
            "kind": "done",
            "ok": False,
            "class": type(exc).__name__,
            "message": exc.message,
            "url": exc.url,
        }
    return {"kind": "done", "ok": False, "class": None, "message": f"{type(exc).__name__}: {exc}"}


def _set_nice(value: int) -> None:
    """Every thread of this process at ``value`` (on Linux a nice value is per thread)."""
    for task in os.listdir("/proc/self/task"):
        if task.isdigit():
            set_thread_nice(int(task), value)


def _job(parent: int, job: dict[str, Any], rest: Rest) -> dict[str, Any]:
    head, options, keep_best = job_from(job)
    memory: dict[str, _PeerSource | BytesFile] = {}
    for name, item in job["memory"].items():
        if "regions" in item:
            regions = tuple((int(a), int(n)) for a, n in item["regions"])
            memory[name] = _PeerSource(parent, Peer(bytes.fromhex(item["head"]), regions))
        else:
            memory[name] = BytesFile(bytes.fromhex(item["bytes"]))
    rest.expect(job["expect"])
    set_store_deadline(job["deadline"])
    result = publish(
        job["source"],
        job["dest"],
        head,
        options,
        keep_last=job["keep_last"],
        keep_best=keep_best,
        memory=memory,
        rest=rest,
    )
    return _outcome(result)


class _Child:
    """The child's two threads: one hears the parent (a deadline or a priority at once, a
    job queued), the other publishes the jobs one at a time and answers each."""

    def __init__(self, parent: int, inp: IO[bytes], out: IO[bytes]) -> None:
        self.parent = parent
        self._inp = inp
        self._out = out
        self._out_lock = threading.Lock()
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def answer(self, doc: Mapping[str, Any]) -> None:
        with self._out_lock:
            send(self._out, json.dumps(doc).encode())

    def hello(self, message: dict[str, Any]) -> None:
        """Read the parent's probe bytes back: whether this child can read its memory."""
        address, text = message["probe"]
        probe = bytes.fromhex(text)
        seen = bytearray(len(probe))
        try:
            into = ctypes.addressof((ctypes.c_char * len(seen)).from_buffer(seen))
            read_memory(self.parent, address, into, len(seen))
        except OSError as exc:
            self.answer({"kind": "ready", "ok": False, "error": exc.strerror or str(exc)})
            return
        ok = bytes(seen) == probe
        self.answer({"kind": "ready", "ok": ok, "error": "" if ok else "the bytes read differ"})

    def listen(self) -> None:
        try:
            self._hear()
        finally:
            # However the input ends (the parent gone, or a bug here), the child ends after
            # the job in hand: a parent waiting for an answer then reads the end.
            self._jobs.put(None)

    def _hear(self) -> None:
        while (body := receive(self._inp)) is not None:
            message = json.loads(body)
            kind = message["kind"]
            if kind == "end":
                # The parent's close: its input may never end (a forked data loader worker
                # holds a copy of the pipe's write end), so it says so.
                return
            if kind == "deadline":
                set_store_deadline(message["at"])
            elif kind == "nice":
                _set_nice(message["value"])
            elif kind == "hello":
                self.hello(message)
            elif kind == "ping":
                left = deadline_left()
                self.answer({"kind": "pong", "deadline_left": left, "nice": os.nice(0)})
            else:
                self._jobs.put(message)

    def run(self) -> None:
        threading.Thread(target=self.listen, name="rp-listen", daemon=True).start()
        rest = Rest()
        while (job := self._jobs.get()) is not None:
            try:
                outcome = _job(self.parent, job, rest)
            except Exception as exc:  # every failure goes back to the parent, as data
                outcome = _failure(exc)
            self.answer(outcome)


def main(argv: list[str] | None = None) -> int:
    """The child (``_BOOT``): ``main([PARENT_PID])``."""
    args = sys.argv[1:] if argv is None else argv
    parent = int(args[0])
    if not die_with_parent(parent):
        return 0
    logging.basicConfig(level=logging.WARNING, format="restorepoint (publish process): %(message)s")
    with contextlib.suppress(ImportError):
        # The planes split's shifts and copies release the GIL with numpy (format/codecs.py).
        import numpy  # noqa: F401
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    # Nothing else may write to the frames' stream.
    sys.stdout = sys.stderr
    _Child(parent, inp, out).run()
    return 0
