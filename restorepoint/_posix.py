"""POSIX helpers, once: the fsync of a file or a directory, the atomic write of a small file,
the atomic exchange of two paths, whether a process is alive, and when it started, and advice
to the kernel on fresh memory. Every module that needs one of these calls it here."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import errno
import functools
import mmap
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from .errors import UsageError

__all__ = [
    "HUGE_ADVICE",
    "Disposition",
    "FileTooLarge",
    "NotRegularFile",
    "advise_huge_pages",
    "allow_reader",
    "atomic_write",
    "die_with_parent",
    "freed_memory_reported",
    "fsync_dir",
    "fsync_file",
    "give_back",
    "huge_buffer",
    "keep_freed_memory",
    "pid_alive",
    "populate",
    "preempt_signal",
    "process_owner",
    "process_start_time",
    "read_memory",
    "read_regular",
    "release_free_memory",
    "rename_exchange",
    "send_signal",
    "signal_disposition",
    "signal_number",
]


def thread_nice(native_id: int) -> int | None:
    """A thread's nice value (on Linux a nice value is per thread), or None where the system
    does not say (no ``getpriority``, or an id it does not know)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, native_id)
    except (OSError, AttributeError):
        return None


def set_thread_nice(native_id: int, value: int) -> None:
    """Set a thread's nice value where the system lets it (raising a priority needs root or
    ``RLIMIT_NICE``); nothing otherwise."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, native_id, value)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable (a rename or a create in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Make a file's contents durable (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:  # pragma: no cover - a platform without dlopen(NULL)
        return None


def release_free_memory() -> None:
    """Give the allocator's free memory back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Memory freed by a thread that did not allocate it, in blocks below the
    allocator's mmap threshold, otherwise stays in the process's resident set: a loader that
    lets go of 4 MiB chunks as it fills tensors would hold both at its peak. It changes no
    setting; it costs microseconds when there is little to give back."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_MADV_HUGEPAGE = 14
#: Fresh memory of this many bytes or more is worth the advice (``advise_huge_pages``): it
#: holds at least one whole huge page wherever it lies.
HUGE_ADVICE = 4 << 20
#: What the kernel calls the size of a transparent huge page (2 MiB on x86_64).
_HUGE_PAGE_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


@functools.cache
def _libc_madvise() -> Any:
    """libc's madvise (errno kept), on Linux; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = getattr(ctypes.CDLL(None, use_errno=True), "madvise", None)
    except OSError:
        return None
    if func is not None:
        func.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        func.restype = ctypes.c_int
    return func


@functools.cache
def _madvise() -> tuple[Any, int] | None:
    """madvise and the size of a transparent huge page, where the kernel has them."""
    func = _libc_madvise()
    if func is None:
        return None
    try:
        with open(_HUGE_PAGE_SIZE, encoding="ascii") as f:
            huge = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if huge <= 0 or huge & (huge - 1):
        return None
    return func, huge


#: Where Linux lists the virtio balloons of a guest, and the feature bit of free page
#: reporting (VIRTIO_BALLOON_F_REPORTING) in each one's ``features`` string of 0s and 1s.
_BALLOONS = "/sys/bus/virtio/drivers/virtio_balloon"
_REPORTING_BIT = 5


@functools.cache
def freed_memory_reported(balloons: str = _BALLOONS) -> bool:
    """Whether this Linux guest reports the memory it frees to its host (a virtio balloon
    with free page reporting): every free block of a huge page's order (2 MiB) is handed back,
    and the host backs it again at its next touch. On such a guest fresh huge pages are the
    slowest memory there is (on the VM measured: 256 MiB touched in 590 ms in fresh huge
    pages, 154 ms in 4 KiB pages, which the kernel recycles before any is reported, and 17 ms
    in huge pages the host still backs; docs/performance.md), so no huge pages are asked for
    there (``advise_huge_pages``, ``huge_buffer``). Where the host backs the guest's memory
    whole (a GPU passed through pins it), there is no such balloon."""
    try:
        names = os.listdir(balloons)
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(balloons, name, "features"), encoding="ascii") as f:
                bits = f.read(256).strip()
        except (OSError, ValueError):
            continue
        if len(bits) > _REPORTING_BIT and bits[_REPORTING_BIT] == "1":
            return True
    return False


def advise_huge_pages(address: int, length: int) -> None:
    """Ask Linux to back the memory at ``address`` (``length`` bytes, not yet touched) with
    transparent huge pages where it can: ``madvise(MADV_HUGEPAGE)`` on the whole huge pages
    inside it. A copy into fresh memory then faults once per huge page (2 MiB) rather than
    once per 4 KiB page: at 1 GiB, 262,144 faults fewer, which a two-core machine pays for in
    kernel time (docs/performance.md). Nothing elsewhere, where huge pages are off
    (``never``), where freed memory goes back to the host (``freed_memory_reported``), or
    where the kernel says no: it is advice, and never an error."""
    advise = _madvise()
    if advise is None or freed_memory_reported():
        return
    func, huge = advise
    start = -(-address // huge) * huge
    end = (address + length) // huge * huge
    if end > start:
        func(start, end - start, _MADV_HUGEPAGE)


_MADV_POPULATE_WRITE = 23
#: Fresh memory below this many bytes is not worth a system call (``populate``): a few faults.
POPULATE_MIN = 64 << 10
#: Whether the kernel refused MADV_POPULATE_WRITE (before Linux 5.14): not asked again.
_populate_refused = False


def populate(address: int, length: int) -> None:
    """Fault in the fresh memory at ``address`` (``length`` bytes, about to be written whole)
    in one call, ``madvise(MADV_POPULATE_WRITE)`` on the whole pages inside it, rather than
    page by page as a copy first writes it: on the 2-core VM of docs/performance.md, 1 GiB of
    576 KiB tensors filled in 0.39 s against 0.60 s. For memory below HUGE_ADVICE, which huge
    pages cannot back; nothing below POPULATE_MIN, elsewhere than Linux, or where the kernel
    does not know the advice (before 5.14): it is advice, and never an error. The call
    releases the GIL (ctypes)."""
    global _populate_refused  # noqa: PLW0603 - one flag, set once, read without a lock
    if length < POPULATE_MIN or _populate_refused:
        return
    func = _libc_madvise()
    if func is None:
        return
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    refused = end > start and func(start, end - start, _MADV_POPULATE_WRITE) != 0
    if refused and ctypes.get_errno() == errno.EINVAL:
        _populate_refused = True


def huge_buffer(size: int) -> memoryview | None:
    """``size`` writable bytes of fresh memory of their own, starting at a huge page and
    advised into huge pages (``advise_huge_pages``), given back to the system as soon as the
    last view of them goes (an anonymous mapping: no allocator holds on to it, so no trim is
    needed to keep the resident set bounded). Where freed memory goes back to the host
    (``freed_memory_reported``), the mapping is made without the advice: its own still, in
    the kernel's 4 KiB pages. None below HUGE_ADVICE, elsewhere than Linux, or when no mapping
    can be made: the caller allocates as usual."""
    advise = _madvise()
    if advise is None or size < HUGE_ADVICE:
        return None
    huge = advise[1]
    try:
        mapping = mmap.mmap(-1, size + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        probe = ctypes.c_char.from_buffer(mapping)
        offset = -ctypes.addressof(probe) % huge
        del probe
        if not freed_memory_reported():
            mapping.madvise(mmap.MADV_HUGEPAGE, offset, size)
    except (OSError, ValueError, AttributeError):
        return None
    return memoryview(mapping)[offset : offset + size]


# -- another process's memory ----------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
#: Yama's prctl: which process may read this one's memory (ptrace_scope 1).
_PR_SET_PTRACER = 0x59616D61


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


@functools.cache
def _libc() -> Any:
    """libc with errno kept, on Linux; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a platform without dlopen(NULL)
        return None


def read_memory(pid: int, address: int, into: int, length: int) -> None:
    """Copy ``length`` bytes at ``address`` in process ``pid`` to ``into`` in this one
    (``process_vm_readv``: one copy, no shared mapping, the GIL released by ctypes). OSError
    where the kernel refuses (another user's process, Yama's ptrace_scope without
    ``allow_reader``, a seccomp filter), where the memory is not mapped there, or elsewhere
    than Linux."""
    libc = _libc()
    func = getattr(libc, "process_vm_readv", None) if libc is not None else None
    if func is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available here")
    func.restype = ctypes.c_ssize_t
    done = 0
    while done < length:
        local = _IOVec(into + done, length - done)
        remote = _IOVec(address + done, length - done)
        got = func(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            code = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise OSError(code, f"process_vm_readv: {os.strerror(code)}")
        done += got


#: glibc's mallopt parameters; the largest block it may serve from its heaps (64-bit), and
#: how much free memory at a heap's top it keeps.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_HEAP_BLOCK_MAX = 32 << 20
_HEAP_KEEP = 256 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep what is freed for the next allocation instead of giving it
    back to the kernel: blocks up to 32 MiB from its heaps, and up to 256 MiB free at a
    heap's top. For a process that allocates and frees the same few buffers chunk after
    chunk (the CLI's pack and verify, the publish process), where memory given back is found,
    zeroed and mapped anew at the next chunk. With it, a CLI verify of the 131 MiB checkpoint
    took 20,000 minor faults instead of 40,000, and the publish process's 1 GiB stop job
    20,000 instead of 86,000 to 106,000, with 0.43 to 0.57 s of system time instead of 0.62
    to 0.75 s, on a VM that reports freed memory to its host (docs/performance.md). Only for
    a process of restorepoint's own: the library leaves its caller's allocator alone. False,
    and nothing changed, where the user tuned malloc (a MALLOC_* variable, or GLIBC_TUNABLES
    naming it) or where the libc has no mallopt (musl, elsewhere than Linux)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(k.startswith("MALLOC_") for k in os.environ) or "malloc" in tunables:
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # A fixed mmap threshold also ends glibc's own moving of it (and of the trim threshold).
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCK_MAX) and mallopt(_M_TRIM_THRESHOLD, _HEAP_KEEP)
    )


def allow_reader(pid: int) -> None:
    """Let process ``pid`` (a child of this one) read this process's memory where Yama's
    ``ptrace_scope`` is 1, which otherwise lets a process read only its descendants'. Nothing
    where Yama is not there; never an error."""
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)


def die_with_parent(parent: int) -> bool:
    """Have the kernel send this process SIGKILL when the thread that started it ends (its
    parent process exits, killed or not). False where it cannot be asked (elsewhere than
    Linux) or where the parent ``parent`` has already gone (this process was adopted)."""
    libc = _libc()
    if libc is None or libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    return os.getppid() == parent


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


_MADV_DONTNEED = 4


def give_back(address: int, length: int) -> None:
    """Hand the whole pages inside ``length`` bytes at ``address`` back to the system
    (``madvise(MADV_DONTNEED)``): they read as zeros afterwards. For memory of a mapping of
    our own (``huge_buffer``) that nothing reads any more while the rest of the mapping lives
    on: a resume's tensors made of one file's bytes (runtime/snapshot_file.py), once a model
    has copied those of its parameters. Nothing elsewhere than Linux; never an error."""
    func = _libc_madvise()
    if func is None:
        return
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        func(start, end - start, _MADV_DONTNEED)


def rename_exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where the system or
    the file system does not support it, OSError for any other failure."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is None:
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a small file so that a reader (or a crash) sees the old or the new one whole: a
    temporary file beside it (named after the process and the thread, so two writers never
    share one), fsync, rename, fsync of the directory."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        # No litter: a temporary file left in checkpoints/ would be packed with the state.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            # A failed write (ENOSPC) names no file: name the one that was being written.
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise
    fsync_dir(target.parent)


class NotRegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a directory where a file was asked for."""


def read_regular(
    path: str | os.PathLike[str], *, limit: int | None = None, offset: int = 0
) -> bytes:
    """A local file's bytes, refused (NotRegularFile) unless it is a regular file: a plain
    open of a FIFO waits for a writer, forever, and a device may never end. The open does not
    block (O_NONBLOCK), the check is on the descriptor opened, not on the name. With ``limit``,
    a file whose size from ``offset`` on is larger is refused (FileTooLarge) before any byte is
    read, and no more than ``limit`` bytes are read should it grow meanwhile."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", name)
        if limit is not None and st.st_size - offset > limit:
            raise FileTooLarge(errno.EFBIG, f"larger than {limit} bytes", name)
        os.set_blocking(fd, True)
        if offset:
            f.seek(offset)
        return f.read() if limit is None else f.read(limit)


class FileTooLarge(OSError):
    """A file larger than the size cap its reader gives (read_regular's ``limit``)."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts: EPERM). A
    number no process can have (negative, zero, beyond what kill accepts) is not alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat):
    with the pid, it names one process for as long as the machine runs (a pid comes round
    again, a (pid, start time) pair does not). None where /proc cannot tell."""
    try:
        text = read_regular(f"/proc/{pid}/stat", limit=1 << 16).decode(errors="replace")
        # Fields after the command name (which may hold spaces and parentheses): the start
        # time is the 20th after the name.
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_owner(pid: int) -> tuple[int, ...] | None:
    """The real, effective, saved and file-system uids of process ``pid`` (/proc/PID/status);
    None where /proc cannot tell."""
    try:
        text = read_regular(f"/proc/{pid}/status", limit=1 << 16).decode(errors="replace")
        line = next(ln for ln in text.splitlines() if ln.startswith("Uid:"))
        return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError, StopIteration):
        return None


class Disposition(enum.Enum):
    """What a process does with a signal, as /proc/PID/status says."""

    GONE = "gone"
    DEFAULT = "default"
    IGNORED = "ignored"
    CAUGHT = "caught"
    #: no /proc to tell
    UNKNOWN = "unknown"


def signal_disposition(pid: int, signum: int) -> Disposition:
    """What process ``pid`` does with ``signum``: a signal it does not catch kills it (SIGUSR1
    and SIGUSR2 by default), so a snapshot request is sent only to a process that catches it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return Disposition.GONE if Path("/proc/self/status").exists() else Disposition.UNKNOWN
    except OSError:
        return Disposition.UNKNOWN
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith(("Z", "X")):
        return Disposition.GONE
    bit = 1 << (signum - 1)
    try:
        caught = int(fields["SigCgt"].strip(), 16)
        ignored = int(fields["SigIgn"].strip(), 16)
    except (KeyError, ValueError):
        return Disposition.UNKNOWN
    if caught & bit:
        return Disposition.CAUGHT
    return Disposition.IGNORED if ignored & bit else Disposition.DEFAULT


def signal_number(value: str | int) -> int:
    """A signal given as a number or a name, with or without SIG: 15, "TERM", "SIGUSR2"."""
    if isinstance(value, int):
        return value
    text = value.strip().upper()
    if text.isdigit():
        return int(text)
    name = text if text.startswith("SIG") else f"SIG{text}"
    try:
        return int(getattr(signal, name))
    except AttributeError:
        raise UsageError(f"unknown signal {value!r}") from None


def preempt_signal(value: str | int | None = None) -> int:
    """The preemption signal: ``value``, else ``$SUBMITIT_PREEMPT_SIGNAL``, else SIGUSR2 (what
    submitit sends by default)."""
    if value is None:
        value = os.environ.get("SUBMITIT_PREEMPT_SIGNAL") or "SIGUSR2"
    return signal_number(value)


def send_signal(pid: int, signum: int = signal.SIGUSR1) -> None:
    """Signal a trainer that has reported itself up; one that is gone is a UsageError."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise UsageError(f"no trainer process {pid}") from None
