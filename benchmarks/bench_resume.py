"""The whole save-and-resume cycle, as a user meets it, side by side in one run: restorepoint's
ResumableRun against torch.save, PyTorch DCP (save and async_save) and Lightning's checkpoint IO,
on a local disk and on moto's S3 server.

    python benchmarks/bench_resume.py [--size 1G,4G,8G] [--stores local,s3] [--repeat 2]
        [--workdir DIR] [--json]

Needs torch, s3fs, moto[server], boto3 and the real weights (``restorepoint[torch,s3,test]``);
Lightning and DCP rows are skipped when they cannot be imported. Run from the repository root.

The state is a model of real trained weights (all-MiniLM-L6-v2, ``restorepoint.testing.weights``,
tiled to a third of ``--size``, each tile scaled by its own factor) with Adam's two moments after
``--adam-steps`` real optimizer steps: model + optimizer is ``--size``. Each round runs, for each
store, every tool in a seeded shuffled order (ours, a peer, ..., then the next round):

- **save**: the pause (training stopped), then a fixed compute loop (a 384x384 matmul chain on
  one torch thread) runs until the checkpoint is published; published = in the store, complete.
  restorepoint hashes (sha256 of every byte, recorded in the index) and compresses on the way;
  the peers do neither.
- **resume**: a fresh start of the same model: from nothing in the run directory to the end
  of the first compute step (ours: ResumableRun + resume() from the store; the peers: the
  download, torch.load / dcp.load and load_state_dict).
- **bytes** stored, the **slowdown** of the compute loop while a publish runs in the
  background, and the **peak RSS** of this process during the save and during the resume (the
  kernel's high-water mark, reset before each; it includes the model and its optimizer).

Figures are medians over the rounds, then each as a ratio to the best peer. The load average is
printed beside every figure: on a shared machine the figures are noisy, and the ratios (tools
seconds apart) less so than the seconds. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import fs_type

HINT = "bench_resume.py needs torch, s3fs, moto[server] and boto3: restorepoint[torch,s3,test]"
MATMUL = 384
#: Compute steps before each save: the baseline the slowdown is measured against.
BASELINE_STEPS = 15
#: A background publish that takes longer than this is reported as not finished.
LIMIT_S = 900.0
TOOLS = ("restorepoint", "torch.save", "dcp.save", "dcp.async_save", "lightning")
#: Ours, with the background at the training thread's priority (``background_nice=None``):
#: not in the default list; on a machine that other processes load, nice +19 leaves the
#: publish what they do not take, and this row shows what the publish itself costs.
OURS = ("restorepoint", "restorepoint-nice0")
FIGURES = ("pause_s", "published_s", "bytes", "slowdown", "resume_s", "rss_save", "rss_resume")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def load() -> float:
    return os.getloadavg()[0]


# -- the state --------------------------------------------------------------------------------


def build_state(size: int, adam_steps: int) -> tuple[Any, Any]:
    """Real weights tiled to size / 3 bytes of float32 parameters, and Adam after real steps
    (the gradient of a smooth loss of the weights: the moments take real distributions)."""
    import torch

    from restorepoint.testing.weights import safetensors_state_dict

    corpus = [t for t in safetensors_state_dict().values() if t.is_floating_point()]
    model = torch.nn.Module()
    want, have, i = size // 3, 0, 0
    while have < want:
        t = corpus[i % len(corpus)].float()
        scale = 1.0 + 1e-3 * (i // len(corpus))
        n = min(t.numel(), (want - have) // 4)
        if n <= 0:
            break
        data = (t.flatten()[:n] * scale).reshape(t.shape if n == t.numel() else (n,))
        model.register_parameter(f"p{i}", torch.nn.Parameter(data.clone()))
        have += n * 4
        i += 1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(adam_steps):
        for p in model.parameters():
            loss = ((p - p.detach().roll(1)) ** 2).mean() + 1e-2 * (p * p).sum()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


class Compute:
    """A fixed compute step, on one torch thread."""

    def __init__(self) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(MATMUL, MATMUL, generator=g)
        self.b = torch.randn(MATMUL, MATMUL, generator=g) / MATMUL**0.5

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

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


# -- the tools --------------------------------------------------------------------------------


class Cycle:
    """One tool's save and resume of the state, measured."""

    def __init__(self, model: Any, optimizer: Any, compute: Compute, store: Store, work: Path):
        self.model, self.optimizer, self.compute = model, optimizer, compute
        self.store, self.work = store, work
        self.out: dict[str, Any] = {}

    def background(self, start: float, done: Callable[[], bool]) -> None:
        """Compute steps until ``done``; the published time and the slowdown."""
        steps: list[float] = []
        while not done():
            if time.perf_counter() - start > LIMIT_S:
                raise RuntimeError("the publish did not finish")
            steps.append(self.compute.step())
        self.out["published_s"] = time.perf_counter() - start
        self.out["busy_steps"] = len(steps)
        if len(steps) >= 3:
            self.out["slowdown"] = statistics.median(steps) / self.out["base_step_s"] - 1

    def save(self, tool: str, tag: str) -> None:
        self.out["base_step_s"] = statistics.median(
            self.compute.step() for _ in range(BASELINE_STEPS)
        )
        with PeakRSS() as rss:
            getattr(self, "save_" + tool.replace(".", "_").replace("-", "_"))(tag)
        self.out["rss_save"] = rss.peak
        self.out.setdefault("published_s", self.out["pause_s"])
        self.out["load_save"] = load()

    def resume(self, tool: str, tag: str) -> None:
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            getattr(self, "resume_" + tool.replace(".", "_").replace("-", "_"))(tag)
            self.compute.step()
            self.out["resume_s"] = time.perf_counter() - t0
        self.out["rss_resume"] = rss.peak
        self.out["load_resume"] = load()

    # restorepoint: ResumableRun, its defaults (zstd level 1 as codec planes, one background
    # thread at nice +19), publishing to the store.
    def _run(self, tag: str, run_dir: Path, nice: int | None = 19) -> Any:
        from restorepoint.torch import ResumableRun

        return ResumableRun(
            {"bench": "resume", "tag": tag},
            background_nice=nice,
            run_dir=run_dir,
            store=self.store.url("rp") + "/",
            storage_options=self.store.options,
            final_snapshot=False,
            upload_timeout=LIMIT_S,
        )

    def save_restorepoint(self, tag: str, nice: int | None = 19) -> None:
        with self._run(tag, self.work / f"run-{tag}", nice) as run:
            run.track(model=self.model, optimizer=self.optimizer)
            t0 = time.perf_counter()
            run.snapshot()
            self.out["pause_s"] = time.perf_counter() - t0
            self.background(t0, lambda: run.wait(timeout=0))
            upload = run.uploads[-1] if run.uploads else {}
            if not upload.get("ok"):
                raise RuntimeError(f"the publish failed: {upload}")
        shutil.rmtree(self.work / f"run-{tag}")
        self.out["bytes"] = self.store.size("rp")

    def resume_restorepoint(self, tag: str) -> None:
        run_dir = self.work / f"fresh-{tag}"
        with self._run(tag, run_dir) as run:
            run.track(model=self.model, optimizer=self.optimizer)
            run.resume()
            if run.resumed_from is None:
                raise RuntimeError("restorepoint did not resume")
        shutil.rmtree(run_dir)

    def save_restorepoint_nice0(self, tag: str) -> None:
        self.save_restorepoint(tag, None)

    resume_restorepoint_nice0 = resume_restorepoint

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


# -- the run ----------------------------------------------------------------------------------


def snapshot_of(state: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in state.items()}


def check_resumed(model: Any, reference: dict[str, Any], tool: str) -> None:
    import torch

    for name, value in model.state_dict().items():
        if not torch.equal(value, reference[name]):
            raise RuntimeError(f"{tool}: the resumed model differs from the saved one ({name})")


def measure_size(
    size: int, stores: list[str], tools: list[str], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    import gc

    model, optimizer = build_state(size, args.adam_steps)
    compute = Compute()
    reference = snapshot_of(model.state_dict())
    state_bytes = sum(t.numel() * t.element_size() for t in reference.values()) * 3
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {t: [] for t in tools} for s in stores}
    opened = {kind: Store(kind, workdir) for kind in stores}
    failures: list[str] = []
    try:
        for r in range(args.repeat):
            for kind in stores:
                order = list(tools)
                random.Random(1000 * r + len(kind)).shuffle(order)
                for tool in order:
                    store = opened[kind]
                    store.clear()
                    cycle = Cycle(model, optimizer, compute, store, workdir)
                    tag = f"{size}-{r}-{kind}-{uuid.uuid4().hex[:6]}"
                    try:
                        cycle.save(tool, tag)
                        gc.collect()
                        cycle.resume(tool, tag)
                        check_resumed(model, reference, tool)
                    except BaseException as exc:  # DCP's CheckpointException is a BaseException
                        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                            raise
                        # A store that fails a request past its retries (moto under load
                        # answers 500) fails that cycle, not the run: it is reported, not timed.
                        failures.append(f"{kind} round {r} {tool}: {type(exc).__name__}: {exc}")
                        print(f"  FAILED {failures[-1]}", file=sys.stderr, flush=True)
                        continue
                    finally:
                        gc.collect()
                    runs[kind][tool].append(cycle.out)
                    print(
                        f"  {size / (1 << 30):.3g} GiB {kind:5} round {r} {tool:15}"
                        f" pause {cycle.out['pause_s']:7.3f} s  published"
                        f" {cycle.out['published_s']:7.3f} s  resume {cycle.out['resume_s']:7.3f} s"
                        f"  (load {cycle.out['load_resume']:.2f})",
                        file=sys.stderr,
                        flush=True,
                    )
                store.clear()
    finally:
        for store in opened.values():
            store.close()
    return {"size": size, "state_bytes": state_bytes, "runs": runs, "failures": failures}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians per tool and figure, and each figure of ours as a ratio to the best peer."""
    out: dict[str, Any] = {}
    for kind, by_tool in result["runs"].items():
        med: dict[str, dict[str, float | None]] = {}
        for tool, rounds in by_tool.items():
            med[tool] = {}
            for fig in (*FIGURES, "load_save", "load_resume"):
                values = [r[fig] for r in rounds if r.get(fig) is not None]
                med[tool][fig] = statistics.median(values) if values else None
        ratios = {tool: _ratios(med, tool) for tool in OURS if tool in med}
        out[kind] = {"median": med, "vs_best_peer": ratios.get("restorepoint", {})}
        if "restorepoint-nice0" in ratios:
            out[kind]["vs_best_peer_nice0"] = ratios["restorepoint-nice0"]
    return out


def _ratios(med: dict[str, dict[str, float | None]], ours_tool: str) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    for fig in FIGURES:
        ours = med[ours_tool].get(fig)
        peers = {t: v[fig] for t, v in med.items() if t not in OURS and v[fig] is not None}
        if ours is None or not peers:
            ratios[fig] = None
            continue
        best = min(peers, key=lambda t: peers[t])  # type: ignore[arg-type,return-value]
        if fig == "slowdown":
            ratios[fig] = {"ours": ours, "best_peer": best, "peer": peers[best]}
            continue
        value = peers[best]
        ratios[fig] = {"ratio": ours / value if value else None, "best_peer": best}
    return ratios


def fmt(fig: str, v: float | None) -> str:
    if v is None:
        return "-"
    if fig == "bytes":
        return f"{v / (1 << 20):.0f} MiB"
    if fig.startswith("rss"):
        return f"{v / (1 << 20):.0f} MiB"
    if fig == "slowdown":
        return f"{v:+.1%}"
    return f"{v:.2f} s"


def print_table(results: list[dict[str, Any]]) -> None:
    names = {
        "pause_s": "pause per snapshot",
        "published_s": "snapshot -> published",
        "bytes": "bytes stored",
        "slowdown": "step slowdown during publish",
        "resume_s": "empty machine -> first step",
        "rss_save": "peak RSS, save",
        "rss_resume": "peak RSS, resume",
    }
    for res in results:
        for kind, summary in res["summary"].items():
            med = summary["median"]
            tools = list(med)
            print(
                f"\n== {res['state_bytes'] / (1 << 30):.2f} GiB of state, {kind} store"
                f" (median of {res['repeat']}; load average {res['load_start']:.2f}"
                f" -> {res['load_end']:.2f})"
            )
            print(f"{'figure':30}" + "".join(f"{t:>19}" for t in tools) + "  ours / best peer")
            for fig in FIGURES:
                row = f"{names[fig]:30}" + "".join(f"{fmt(fig, med[t][fig]):>19}" for t in tools)
                r = summary["vs_best_peer"][fig]
                if r is None:
                    cell = "-"
                elif fig == "slowdown":
                    cell = f"{r['ours']:+.1%} vs {r['peer']:+.1%} ({r['best_peer']})"
                else:
                    cell = f"{r['ratio']:.2f}x ({r['best_peer']})" if r["ratio"] else "-"
                print(row + f"  {cell}")
            loads = "".join(f"{med[t]['load_resume'] or 0:>19.2f}" for t in tools)
            print(f"{'load average (1 min)':30}" + loads)


def plot(results: list[dict[str, Any]], target: Path) -> str:
    """Each figure against the state's size, ours and each peer; or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib to get one)"
    kinds = sorted({k for r in results for k in r["summary"]})
    fig, axes = plt.subplots(len(kinds), len(FIGURES), figsize=(4 * len(FIGURES), 3.5 * len(kinds)))
    for i, kind in enumerate(kinds):
        for j, name in enumerate(FIGURES):
            ax = axes[i][j] if len(kinds) > 1 else axes[j]
            tools = sorted(
                {t for r in results for t in r["summary"].get(kind, {}).get("median", {})}
            )
            for tool in tools:
                xs, ys = [], []
                for r in results:
                    v = r["summary"].get(kind, {}).get("median", {}).get(tool, {}).get(name)
                    if v is not None:
                        xs.append(r["state_bytes"] / (1 << 30))
                        ys.append(v)
                ax.plot(xs, ys, marker="o", label=tool)
            ax.set_title(f"{name} ({kind})", fontsize=9)
            ax.set_xlabel("state, GiB")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(target)
    return f"plot written to {target}"


def fits(size: int) -> bool:
    """Whether the run fits in memory: the state, a snapshot's copy of it and a resumed copy,
    with room to spare (about 3.5x the state)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return size * 3.5 <= info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G,4G,8G", help="state sizes: 32M, 1G, ... (a list)")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--adam-steps", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--plot", type=Path, default=None, help="default: docs/ beside performance.md"
    )
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import warnings

    # DCP says, at every call, that it saves in one process: it does, on purpose.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    try:
        import torch
    except ImportError:
        print(HINT, file=sys.stderr)
        return 2
    tools, skipped = available_tools(args.tools.split(","))
    stores = args.stores.split(",")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="rp-resume-")) if own else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    results, notes = [], [f"{t}: skipped ({why})" for t, why in skipped.items()]
    try:
        for text in args.size.split(","):
            size = parse_size(text)
            if not fits(size):
                notes.append(f"{text}: skipped, does not fit in this machine's memory")
                print(notes[-1], file=sys.stderr)
                continue
            started = load()
            res = measure_size(size, stores, tools, args, workdir)
            notes += [f"{text}: failed, not timed: {f}" for f in res["failures"]]
            res.update(repeat=args.repeat, load_start=started, load_end=load())
            res["summary"] = summarize(res)
            results.append(res)
    finally:
        torch.set_num_threads(previous_threads)
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(results)
    target = args.plot or Path(__file__).resolve().parent.parent / "docs" / "bench_resume.png"
    notes.append(plot(results, target) if results else "no size ran: no plot")
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "workdir_fs": fs_type(workdir),
        "moto": "a server process of its own on 127.0.0.1",
    }
    for note in notes:
        print(f"note: {note}")
    if args.json:
        print(json.dumps({"env": env, "notes": notes, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
