"""bench_resume.py's tools: the compute loop that stands for training, the peak RSS, the stores
(a local directory, moto's S3 server in a process of its own) and each tool's save and resume
(``Cycle``). See bench_resume.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MATMUL = 384
#: Compute steps before each save and again after its publish: the baseline the slowdown is
#: measured against (both sides, so that a drift of the process's own step time over the
#: round is not taken for the publish's doing).
BASELINE_STEPS = 30
#: A background publish that takes longer than this is reported as not finished.
LIMIT_S = 900.0
#: ResumableRun's own default background priority.
DEFAULT = "default"


def load() -> float:
    return os.getloadavg()[0]


class Compute:
    """A fixed compute step, on one torch thread (the thread that makes it: its steps run
    there too, which ``clock`` reads)."""

    def __init__(self) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(MATMUL, MATMUL, generator=g)
        self.b = torch.randn(MATMUL, MATMUL, generator=g) / MATMUL**0.5
        try:
            self._schedstat: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._schedstat = None

    def clock(self) -> tuple[int, int, int] | None:
        """This thread's wall, on-CPU and runnable-but-waiting nanoseconds so far (the
        kernel's schedstat); None where the kernel does not keep them. Between two readings,
        the wall time the thread neither ran nor waited for a core it spent blocked: for this
        loop, which does no I/O, waiting for the GIL (or for an interrupt's handler)."""
        if self._schedstat is None:
            return None
        run, wait, _ = os.pread(self._schedstat, 128, 0).split()
        return time.perf_counter_ns(), int(run), int(wait)

    def step(self) -> float:
        t0 = time.perf_counter()
        x = self.a
        for _ in range(8):
            x = x @ self.b
        return time.perf_counter() - t0


class PeakRSS:
    """This process's peak resident set during a block: the kernel's high-water mark, reset at
    the start (``/proc/self/clear_refs``); where that is refused, sampled every 10 ms."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._reset = False

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    @staticmethod
    def _hwm() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRSS:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError:
            self._thread.start()
        self.peak = self._rss()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._reset:
            self.peak = max(self.peak, self._hwm())
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


# -- the stores -------------------------------------------------------------------------------


class Store:
    """Where the checkpoints go: a local directory, or a bucket of moto's S3 server (in a
    process of its own, so that its CPU is not this process's GIL)."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.proc: subprocess.Popen[bytes] | None = None
        self.options: dict[str, Any] | None = None
        if kind == "local":
            self.root = str(workdir / "store")
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        endpoint = f"http://127.0.0.1:{port}"
        self.options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        for _ in range(200):
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:
                time.sleep(0.05)
        else:
            raise RuntimeError("moto's S3 server did not start")
        # Lightning's checkpoint IO and DCP's FsspecReader take no storage options: fsspec's
        # configuration gives every s3 filesystem of this process the endpoint and the keys.
        import fsspec.config

        fsspec.config.conf["s3"] = self.options
        self.root = f"s3://{bucket}"

    @classmethod
    def attach(cls, kind: str, root: str, options: dict[str, Any] | None) -> Store:
        """The same store, in another process (a resume's own): no server started, nothing
        cleared by it; an S3 store's endpoint and keys for every s3 filesystem here too."""
        store = cls.__new__(cls)
        store.kind, store.root, store.options, store.proc = kind, root, options, None
        if kind != "local":
            import fsspec.config

            fsspec.config.conf["s3"] = options
        return store

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def fs(self) -> Any:
        import fsspec

        return fsspec.filesystem("file") if self.kind == "local" else fsspec.filesystem("s3")

    def size(self, name: str) -> int:
        fs = self.fs()
        path = self.url(name)
        fs.invalidate_cache()
        if not fs.exists(path):
            return 0
        return int(fs.du(path)) if fs.isdir(path) else int(fs.size(path))

    def clear(self) -> None:
        fs = self.fs()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(self.root, recursive=True) if self.kind == "local" else [
                fs.rm(p, recursive=True) for p in fs.ls(self.root)
            ]
        fs.invalidate_cache()
        if self.kind == "local":
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def evict(self) -> None:
        """What an empty machine has: none of the store's files in the page cache. Each local
        file is made durable, then its pages are dropped (``posix_fadvise(DONTNEED)``), so that
        every tool's resume reads the local store from the disk, as a fresh machine reads its
        network file system, whether the tool's save wrote past the cache or into it. Moto
        keeps its objects in its own memory: nothing to drop there."""
        if self.kind != "local":
            return
        for path in Path(self.root).rglob("*"):
            if not path.is_file():
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


# -- the tools --------------------------------------------------------------------------------


#: Wall, on-CPU and waiting nanoseconds of the training thread over some steps, and the steps.
Spent = tuple[int, int, int, int]


def _spent(
    first: tuple[int, int, int] | None, last: tuple[int, int, int] | None, steps: int
) -> Spent | None:
    """Wall, on-CPU and waiting nanoseconds between two ``Compute.clock`` readings, and the
    steps made between them."""
    if first is None or last is None or not steps:
        return None
    wall, run, wait = (b - a for a, b in zip(first, last, strict=True))
    return wall, run, wait, steps


class Cycle:
    """One tool's save and resume of the state, measured."""

    def __init__(self, model: Any, optimizer: Any, compute: Compute, store: Store, work: Path):
        self.model, self.optimizer, self.compute = model, optimizer, compute
        self.store, self.work = store, work
        self.out: dict[str, Any] = {}
        #: The compute steps made while the last save's publish ran (``background``), and
        #: what the kernel accounts of them (``_spent``).
        self._busy: list[float] = []
        self._busy_clock: Spent | None = None

    def background(self, start: float, done: Callable[[], bool]) -> None:
        """Compute steps until ``done``; the published time and the slowdown."""
        steps: list[float] = []
        first = self.compute.clock()
        while not done():
            if time.perf_counter() - start > LIMIT_S:
                raise RuntimeError("the publish did not finish")
            steps.append(self.compute.step())
        self._busy_clock = _spent(first, self.compute.clock(), len(steps))
        self.out["published_s"] = time.perf_counter() - start
        self.out["busy_steps"] = len(steps)
        self._busy = steps

    def _baseline(self) -> tuple[list[float], Spent | None]:
        first = self.compute.clock()
        steps = [self.compute.step() for _ in range(BASELINE_STEPS)]
        return steps, _spent(first, self.compute.clock(), len(steps))

    def save(self, tool: str, tag: str) -> None:
        before, clock_before = self._baseline()
        self._busy, self._busy_clock = [], None
        with PeakRSS() as rss:
            getattr(self, "save_" + tool.replace(".", "_").replace("-", "_"))(tag)
        self.out["rss_save"] = rss.peak + self.out.pop("rss_child", 0)
        after, clock_after = self._baseline()
        self.out["base_step_s"] = statistics.median(before + after)
        if len(self._busy) >= 3:
            self.out["slowdown"] = statistics.median(self._busy) / self.out["base_step_s"] - 1
            self._waited(clock_before, clock_after)
        self.out.setdefault("published_s", self.out["pause_s"])
        self.out["load_save"] = load()

    def _waited(self, before: Spent | None, after: Spent | None) -> None:
        """The slowdown of the mean step in three parts that the kernel accounts to the
        training thread, each in a mean baseline step's time (less what the baseline itself
        had of it): the time it was runnable and waited for a core, the time it was blocked
        (neither running nor runnable: for this loop, the GIL), and its own CPU time, which
        the machine's speed moves too (on this VM by tens of percent between minutes, with
        nothing else running)."""
        busy = self._busy_clock
        if busy is None or before is None or after is None:
            return
        wall, run, wait, steps = (b + a for b, a in zip(before, after, strict=True))
        step = wall / steps
        b_wall, b_run, b_wait, b_steps = busy
        self.out["waited_core"] = (b_wait / b_steps - wait / steps) / step
        self.out["waited_blocked"] = (
            (b_wall - b_run - b_wait) / b_steps - (wall - run - wait) / steps
        ) / step
        self.out["slowdown_cpu"] = (b_run / b_steps - run / steps) / step
        # The three add up to the slowdown of the mean step (the figure above is the median's).
        self.out["slowdown_mean"] = (b_wall / b_steps) / step - 1

    def resume(self, tool: str, tag: str) -> None:
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            self.first_step: float | None = None
            getattr(self, "resume_" + tool.replace(".", "_").replace("-", "_"))(tag)
            if self.first_step is None:
                self.step()
            assert self.first_step is not None
            self.out["resume_s"] = self.first_step - t0
        self.out["rss_resume"] = rss.peak
        self.out["load_resume"] = load()

    # restorepoint: ResumableRun, its defaults (zstd level 1 as codec planes, one background
    # thread at its default nice), publishing to the store; ``nice`` other than DEFAULT sets
    # background_nice.
    def _run(
        self, tag: str, run_dir: Path, nice: int | str | None = DEFAULT, background: str = "auto"
    ) -> Any:
        from restorepoint.torch import ResumableRun

        extra = {} if nice == DEFAULT else {"background_nice": nice}
        return ResumableRun(
            {"bench": "resume", "tag": tag},
            **extra,
            background=background,
            run_dir=run_dir,
            store=self.store.url("rp") + "/",
            storage_options=self.store.options,
            final_snapshot=False,
            upload_timeout=LIMIT_S,
        )

    def save_restorepoint(
        self, tag: str, nice: int | str | None = DEFAULT, background: str = "auto"
    ) -> None:
        with self._run(tag, self.work / f"run-{tag}", nice, background) as run:
            run.track(model=self.model, optimizer=self.optimizer)
            # A training run starts its publish process (the default) when training begins,
            # long before its first snapshot: not timed.
            run.commit()
            run.worker.prepared.wait(60)
            t0 = time.perf_counter()
            run.snapshot()
            self.out["pause_s"] = time.perf_counter() - t0
            # Published: the store holds it (the upload is recorded); the run then writes
            # last.pt to its run directory from memory, timed apart.
            self.background(t0, lambda: bool(run.uploads) or run.wait(timeout=0))
            run.wait()
            self.out["saved_s"] = time.perf_counter() - t0
            upload = run.uploads[-1] if run.uploads else {}
            if not upload.get("ok"):
                raise RuntimeError(f"the publish failed: {upload}")
            process = run.publisher.process
            from restorepoint.ops import publish_process

            if background != "thread" and process is None and publish_process.available():
                raise RuntimeError("the publish process did not start")
            # Its peak resident set counts with the training process's (a sum of two peaks:
            # at most what the two held at once).
            self.out["rss_child"] = (process.peak_rss() or 0) if process is not None else 0
        shutil.rmtree(self.work / f"run-{tag}")
        self.out["bytes"] = self.store.size("rp")

    def step(self) -> None:
        """The first training step after a resume: when it ends is the figure."""
        self.compute.step()
        self.first_step = time.perf_counter()

    def resume_restorepoint(self, tag: str) -> None:
        run_dir = self.work / f"fresh-{tag}"
        with self._run(tag, run_dir) as run:
            run.track(model=self.model, optimizer=self.optimizer)
            run.resume()
            if run.resumed_from is None:
                raise RuntimeError("restorepoint did not resume")
            # Training starts while the import's copy lands in the run directory (the run
            # joins it at exit, as a training loop would at its end).
            self.step()
        shutil.rmtree(run_dir)

    def save_restorepoint_stop(self, tag: str) -> None:
        """Ours under a stop (SIGTERM, a termination notice, Slurm's signal): the state at the
        stop is copied and published while training waits, at the process's priority (the
        cores are the publish's and ``last.pt``'s), then the run exits 42 (caught here).
        Published: when the stop returns, the restore point in the store and ``last.pt`` in
        the run directory (a stop waits for both). No compute loop runs: training has stopped."""
        run_dir = self.work / f"run-{tag}"
        try:
            with self._run(tag, run_dir) as run:
                run.track(model=self.model, optimizer=self.optimizer)
                publisher, close = run.publisher, run.publisher.close

                def closing() -> None:
                    # The child's peak, read before the run ends it.
                    process = publisher.process
                    self.out["rss_child"] = (process.peak_rss() or 0) if process else 0
                    close()

                publisher.close = closing  # type: ignore[method-assign]
                run.commit()
                run.worker.prepared.wait(60)
                run.request_stop()
                t0 = time.perf_counter()
                run.commit()
        except SystemExit as exc:
            if exc.code != 42:
                raise RuntimeError(f"the stop exited {exc.code}") from None
            self.out["published_s"] = time.perf_counter() - t0
        else:
            raise RuntimeError("the stop did not end the run")
        self.out["pause_s"] = run.last_pause_s
        upload = run.uploads[-1] if run.uploads else {}
        if not upload.get("ok"):
            raise RuntimeError(f"the publish failed: {upload}")
        shutil.rmtree(run_dir)
        self.out["bytes"] = self.store.size("rp")

    resume_restorepoint_stop = resume_restorepoint

    def save_restorepoint_thread(self, tag: str) -> None:
        self.save_restorepoint(tag, background="thread")

    resume_restorepoint_thread = resume_restorepoint

    def save_restorepoint_nice0(self, tag: str) -> None:
        self.save_restorepoint(tag, None)

    resume_restorepoint_nice0 = resume_restorepoint

    def save_restorepoint_nice5(self, tag: str) -> None:
        self.save_restorepoint(tag, 5)

    resume_restorepoint_nice5 = resume_restorepoint

    def save_restorepoint_nice10(self, tag: str) -> None:
        self.save_restorepoint(tag, 10)

    resume_restorepoint_nice10 = resume_restorepoint

    def save_restorepoint_nice19(self, tag: str) -> None:
        self.save_restorepoint(tag, 19)

    resume_restorepoint_nice19 = resume_restorepoint

    # torch.save + fsync to the local disk, then s3fs put (on a thread: training goes on).
    def _state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def save_torch_save(self, tag: str) -> None:
        import torch

        local = self.store.kind == "local"
        path = Path(self.store.url("torch.pt")) if local else self.work / "torch.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(self._state(), f)
            f.flush()
            os.fsync(f.fileno())
        self.out["pause_s"] = time.perf_counter() - t0
        if not local:
            failed: list[BaseException] = []

            def put() -> None:
                try:
                    self.store.fs().put(str(path), self.store.url("torch.pt"))
                except Exception as exc:
                    failed.append(exc)

            thread = threading.Thread(target=put)
            thread.start()
            self.background(t0, lambda: not thread.is_alive())
            path.unlink()
            if failed:
                raise RuntimeError(f"the upload failed: {failed[0]}")
        self.out["bytes"] = self.store.size("torch.pt")

    def resume_torch_save(self, tag: str) -> None:
        import torch

        path = Path(self.store.url("torch.pt"))
        if self.store.kind != "local":
            path = self.work / "download.pt"
            self.store.fs().get(self.store.url("torch.pt"), str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.store.kind != "local":
            path.unlink()

    # DCP: the state dict of torch.distributed.checkpoint.state_dict, FileSystemWriter on a
    # local disk, FsspecWriter to S3, as its docs recommend; one process, no process group.
    def _dcp_io(self, write: bool) -> Any:
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

        url = self.store.url("dcp")
        if self.store.kind == "local":
            return FileSystemWriter(url) if write else FileSystemReader(url)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        return FsspecWriter(url) if write else FsspecReader(url)

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def save_dcp_save(self, tag: str) -> None:
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        dcp.save(self._dcp_state(), storage_writer=self._dcp_io(True), no_dist=True)
        self.out["pause_s"] = time.perf_counter() - t0
        self.out["bytes"] = self.store.size("dcp")

    def save_dcp_async_save(self, tag: str) -> None:
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        future = dcp.async_save(self._dcp_state(), storage_writer=self._dcp_io(True), no_dist=True)
        self.out["pause_s"] = time.perf_counter() - t0
        self.background(t0, future.done)
        future.result()
        self.out["bytes"] = self.store.size("dcp")

    def resume_dcp_save(self, tag: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        dcp.load(state, storage_reader=self._dcp_io(False), no_dist=True)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    resume_dcp_async_save = resume_dcp_save

    # Lightning: what Trainer.save_checkpoint / load end in, TorchCheckpointIO, to the URL.
    def save_lightning(self, tag: str) -> None:
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        t0 = time.perf_counter()
        TorchCheckpointIO().save_checkpoint(self._state(), self.store.url("lightning.ckpt"))
        self.out["pause_s"] = time.perf_counter() - t0
        self.out["bytes"] = self.store.size("lightning.ckpt")

    def resume_lightning(self, tag: str) -> None:
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        state = TorchCheckpointIO().load_checkpoint(self.store.url("lightning.ckpt"))
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def available_tools(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    skipped: dict[str, str] = {}
    tools = []
    for tool in wanted:
        module = {"dcp.save": "torch.distributed.checkpoint", "lightning": "lightning.fabric"}
        module["dcp.async_save"] = module["dcp.save"]
        try:
            if tool in module:
                __import__(module[tool])
            tools.append(tool)
        except ImportError as exc:
            skipped[tool] = str(exc)
    return tools, skipped
