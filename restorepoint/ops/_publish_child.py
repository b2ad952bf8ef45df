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
from pathlib import Path
from typing import IO, Any, BinaryIO

from .._direct import DirectWriter, replace_file
from .._posix import die_with_parent, keep_freed_memory, read_memory, set_thread_nice
from ..errors import RestorePointError
from ..storage import deadline_left, set_store_deadline
from ._abandon import Abandon
from ._increment import Rest
from ._publish_wire import Peer, job_from, receive, send
from ._source import BytesFile, PiecesReader
from .publish import publish

__all__ = ["main"]


class _PeerSource:
    """A payload file of ``ops.publish``'s ``memory``, read out of the parent's memory."""

    def __init__(self, pid: int, peer: Peer) -> None:
        self._pid = pid
        self.peer = peer

    @property
    def size(self) -> int:
        return self.peer.size

    def open(self) -> BinaryIO:
        return _PeerReader(self._pid, self.peer)  # type: ignore[return-value]


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


def _job(
    parent: int, job: dict[str, Any], rest: Rest, saver: _Saver, abandon: Abandon | None = None
) -> tuple[dict[str, Any], _Saving | None]:
    """One job: the publish, and beside it the snapshot file where the job asks for it. The
    publish's answer, and the save in flight (None where the job asks for none). ``abandon``:
    the parent's ask to give the publish up, if it may be (the save goes on: it is the run
    directory's)."""
    head, options, keep_best = job_from(job)
    memory: dict[str, _PeerSource | BytesFile] = {}
    for name, item in job["memory"].items():
        if "regions" in item:
            regions = tuple((int(a), int(n)) for a, n in item["regions"])
            memory[name] = _PeerSource(parent, Peer(bytes.fromhex(item["head"]), regions))
        else:
            memory[name] = BytesFile(bytes.fromhex(item["bytes"]))
    save = job.get("save")
    saving = None
    if save is not None:
        source = memory.get(save["name"])
        if not isinstance(source, _PeerSource):
            raise ValueError(
                f"the snapshot file to save is not in the job's memory: {save['name']}"
            )
        saving = saver.start(source, save)
    rest.expect(job["expect"])
    set_store_deadline(job["deadline"])
    try:
        outcome = _outcome(
            publish(
                job["source"],
                job["dest"],
                head,
                options,
                keep_last=job["keep_last"],
                keep_best=keep_best,
                memory=memory,
                rest=rest,
                progress=abandon,
            )
        )
    except Exception as exc:  # the publish's failure, answered as data
        outcome = _failure(exc)
    return outcome, saving


class _Saving:
    """A snapshot file being written on a thread of its own; ``result`` waits for it."""

    def __init__(self, run: Any) -> None:
        self._box: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=lambda: self._box.append(run()), name="rp-save")
        self._thread.start()

    def result(self) -> dict[str, Any]:
        self._thread.join()
        return self._box[0]


class _Saver:
    """Writes the snapshot files the jobs ask for, from the parent's memory, each beside its
    publish; at the priority the job names until a ``nice`` message raises every thread of
    the child (a stop), after which no save lowers itself again."""

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self._lock = threading.Lock()
        self._raised = False

    def raise_all(self, value: int) -> None:
        """A ``nice`` message: every thread of the child at ``value``, the save's included."""
        with self._lock:
            self._raised = True
            _set_nice(value)

    def start(self, source: _PeerSource, save: Mapping[str, Any]) -> _Saving:
        peer, pid = source.peer, self.parent
        target, scratch, nice = Path(save["target"]), Path(save["scratch"]), save["nice"]

        def fill(writer: DirectWriter) -> None:
            writer.write(peer.head)
            for address, length in peer.regions:

                def copy(into: int, done: int, n: int, at: int = address) -> None:
                    read_memory(pid, at + done, into, n)

                writer.write_copied(length, copy)

        def run() -> dict[str, Any]:
            with self._lock:
                if nice is not None and not self._raised:
                    set_thread_nice(threading.get_native_id(), int(nice))
            try:
                replace_file(target, scratch, peer.size, fill)
            except Exception as exc:  # answered as data, as a publish's failure is
                return _failure(exc)
            return {"ok": True}

        return _Saving(run)


class _Child:
    """The child's two threads: one hears the parent (a deadline or a priority at once, a
    job queued), the other publishes the jobs one at a time and answers each."""

    def __init__(self, parent: int, inp: IO[bytes], out: IO[bytes]) -> None:
        self.parent = parent
        self._inp = inp
        self._out = out
        self._out_lock = threading.Lock()
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.saver = _Saver(parent)
        #: The job in hand (its number, its token), and the asks to abandon a job that came
        #: before it did (number to why), under one lock.
        self._abandon_lock = threading.Lock()
        self._current: tuple[int, Abandon] | None = None
        self._early: dict[int, str] = {}

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
                self.saver.raise_all(message["value"])
            elif kind == "abandon":
                self._abandon(int(message["id"]), str(message["why"]))
            elif kind == "hello":
                self.hello(message)
            elif kind == "ping":
                left = deadline_left()
                self.answer({"kind": "pong", "deadline_left": left, "nice": os.nice(0)})
            else:
                self._jobs.put(message)

    def _abandon(self, number: int, why: str) -> None:
        """The parent's ask to abandon job ``number``: the job in hand's token, or kept for
        a job still queued; one that has ended is not in hand any more, and nothing is done."""
        with self._abandon_lock:
            current = self._current
            if current is None or current[0] != number:
                self._early[number] = why
                return
        current[1].ask(why)

    def _begin(self, job: Mapping[str, Any]) -> Abandon:
        """The token of the job about to run, asked already where its ask came first."""
        abandon = Abandon()
        number = int(job.get("id", 0))
        with self._abandon_lock:
            why = self._early.pop(number, None)
            # Asks for jobs that ended before they came are of no use any more.
            self._early = {n: w for n, w in self._early.items() if n > number}
            self._current = (number, abandon)
        if why is not None:
            abandon.ask(why)
        return abandon

    def run(self) -> None:
        threading.Thread(target=self.listen, name="rp-listen", daemon=True).start()
        rest = Rest()
        while (job := self._jobs.get()) is not None:
            saving = None
            abandon = self._begin(job)
            try:
                outcome, saving = _job(self.parent, job, rest, self.saver, abandon)
            except Exception as exc:  # every failure goes back to the parent, as data
                outcome = _failure(exc)
            finally:
                with self._abandon_lock:
                    self._current = None
            # The publish's answer first, the snapshot file's once it is written.
            outcome["saving"] = saving is not None
            self.answer(outcome)
            if saving is not None:
                self.answer({**saving.result(), "kind": "saved"})


def main(argv: list[str] | None = None) -> int:
    """The child (``_BOOT``): ``main([PARENT_PID])``."""
    args = sys.argv[1:] if argv is None else argv
    parent = int(args[0])
    if not die_with_parent(parent):
        return 0
    logging.basicConfig(level=logging.WARNING, format="restorepoint (publish process): %(message)s")
    # Every job allocates and frees the same buffers: kept, they are not faulted in anew.
    keep_freed_memory()
    with contextlib.suppress(ImportError):
        # The planes split's shifts and copies release the GIL with numpy (format/codecs.py).
        import numpy  # noqa: F401
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    # Nothing else may write to the frames' stream.
    sys.stdout = sys.stderr
    _Child(parent, inp, out).run()
    return 0
