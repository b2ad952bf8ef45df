"""Side-by-side pack/verify benchmark: restorepoint against the tools a checkpoint would
otherwise go through (tar + zstd + sha256sum, torch.save) and against the single-pass limit
(one read-and-hash pass over every source byte).

    python benchmarks/bench_pack.py [--size-gib 1.0] [--repeat 3] [--workdir DIR] [--json]

The source is a checkpoint-like directory of float32 tensors (normally distributed, so close
to incompressible, like real weights) plus small JSON files, generated once and cached in the
work directory. Each round runs every tool once, in an order shuffled from round to round so
that machine noise falls on all of them alike; the table reports the median and the best.
Peak RSS of pack and verify is measured in child processes, at the source size and at
multiples of it, to show that memory does not grow with the payload. See docs/performance.md.
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import fs_type

MIB = 1 << 20
GIB = 1 << 30
READ_SIZE = 4 * MIB
SETTLE_S = 0.5

#: Tensor file sizes in MiB for a 1 GiB source (sum 1024), scaled by --size-gib.
TENSOR_MIB = (8, 16, 24, 32, 40, 48, 56, 64, 64, 72, 80, 88, 96, 104, 112, 120)
HINT = "bench_pack.py needs numpy and torch: pip install numpy 'restorepoint[torch]'"

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


# -- the source ------------------------------------------------------------------------------


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


def ensure_source(workdir: Path, size_gib: float) -> tuple[Path, int]:
    """The cached source directory for this size; generated only when missing or different."""
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


def source_files(source: Path) -> list[Path]:
    return sorted(p for p in source.rglob("*") if p.is_file())


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


def run_checked(args: list[str]) -> None:
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")


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


def make_tools(
    source: Path, verify_object: Path, torch_state: tuple[Any, dict[str, bytes]] | None
) -> list[Tool]:
    import restorepoint

    files = source_files(source)

    def rp_pack(out: Path) -> int:
        return restorepoint.pack(str(source), str(out / "pack.rp"), position=0).size

    def rp_store(out: Path) -> int:
        return restorepoint.pack(str(source), str(out / "store.rp"), position=0, level=None).size

    from restorepoint import trust

    keys = Path(tempfile.mkdtemp(prefix="rp-bench-keys-"))
    atexit.register(shutil.rmtree, keys, True)
    trust.generate(keys / "signer.key", "signing")
    trust.generate(keys / "recipient.key", "encryption")
    signer = trust.load_signing_key(keys / "signer.key")
    recipient = trust.load_public(keys / "recipient.key.pub", "encryption")

    def rp_pack_trust(out: Path) -> int:
        return restorepoint.pack(
            str(source), str(out / "trust.rp"), position=0, sign=[signer], encrypt_to=[recipient]
        ).size

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

    def rp_verify(out: Path) -> int:
        restorepoint.verify(str(verify_object))
        return 0

    def sha256sum(out: Path) -> int:
        run_checked(["sha256sum", str(verify_object)])
        return 0

    tools = [
        Tool("pack", "restorepoint pack (zstd 1)", rp_pack),
        Tool("pack_store", "restorepoint pack (store only)", rp_store),
        Tool("pack_trust", "restorepoint pack (zstd 1, signed + encrypted)", rp_pack_trust),
        Tool("tar", "tar | zstd -1 -T0 + sha256sum", tar_pipeline),
    ]
    if torch_state is not None:
        tensors, smalls = torch_state

        def torch_save(out: Path, durable: bool) -> int:
            import torch

            # The two variants differ only by the fsyncs: torch.save to a path, as users call
            # it, then the file's dirty pages flushed through a second descriptor.
            target = out / "model.pt"
            torch.save(tensors, target)
            if durable:
                fsync_path(target)
            for name, data in smalls.items():
                path = out / "json" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("wb") as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
            if durable:
                for directory in {(out / "json" / n).parent for n in smalls} | {out}:
                    fsync_path(directory)
            return target.stat().st_size + sum(len(d) for d in smalls.values())

        tools += [
            Tool("torch_save", "torch.save + JSON files", lambda o: torch_save(o, False)),
            Tool(
                "torch_save_fsync", "torch.save + JSON files + fsync", lambda o: torch_save(o, True)
            ),
        ]
    tools += [
        Tool("single_pass", "single pass: read + sha256", limit),
        Tool("single_pass_write", "single pass + write + fsync", limit_write),
        Tool("verify", "restorepoint verify", rp_verify),
        Tool("sha256sum", "sha256sum of the object", sha256sum),
    ]
    return tools


def load_torch_state(source: Path) -> tuple[Any, dict[str, bytes]] | None:
    try:
        import numpy as np
        import torch
    except ImportError:
        print(f"torch.save rows skipped: {HINT}")
        return None
    tensors = {}
    smalls = {}
    for path in source_files(source):
        name = path.relative_to(source).as_posix()
        if path.suffix == ".bin":
            tensors[name] = torch.from_numpy(np.fromfile(path, dtype=np.float32))
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


def measure_rss(source: Path, total: int, workdir: Path, multiples: list[int]) -> list[dict]:
    out = workdir / "out"
    rows = []
    base, _ = child_rss("import")
    for k in multiples:
        src = source
        if k > 1:
            src = workdir / f"rss-x{k}"
            replicate(source, src, k)
        try:
            clear(out)
            obj = out / "rss.rp"
            pack_rss, pack_s = child_rss("pack", str(src), str(obj))
            verify_rss, verify_s = child_rss("verify", str(obj))
            rows.append(
                {
                    "multiple": k,
                    "source_bytes": total * k,
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


def summarize(tools: list[Tool], total: int) -> dict[str, dict[str, Any]]:
    runs = {}
    for tool in tools:
        median = statistics.median(tool.times)
        best = min(tool.times)
        runs[tool.key] = {
            "label": tool.label,
            "times_s": [round(t, 4) for t in tool.times],
            "median_s": round(median, 4),
            "best_s": round(best, 4),
            "median_gib_s": round(total / GIB / median, 3),
            "best_gib_s": round(total / GIB / best, 3),
            "archive_bytes": tool.archive or None,
            "compression_ratio": round(total / tool.archive, 4) if tool.archive else None,
        }
    return runs


def targets(runs: dict[str, dict[str, Any]], rss: list[dict]) -> list[dict[str, Any]]:
    """Each target as a ratio of throughputs (equivalently, the inverse ratio of times)."""

    def speedup(a: str, b: str, which: str) -> float:
        return runs[b][f"{which}_s"] / runs[a][f"{which}_s"]

    specs = [
        ("pack / tar pipeline", "pack", "tar", ">=", 2.0),
        ("pack / torch.save+fsync", "pack", "torch_save_fsync", ">=", 1.0),
        ("pack / torch.save (no fsync)", "pack", "torch_save", ">=", 1.0),
        ("store-only pack / torch.save+fsync", "pack_store", "torch_save_fsync", None, None),
        ("single-pass / store-only pack", "single_pass", "pack_store", "<=", 1.3),
        (
            "single-pass+write+fsync / store-only pack",
            "single_pass_write",
            "pack_store",
            None,
            None,
        ),
        ("verify / sha256sum", "verify", "sha256sum", ">=", 2.0),
        # Signing and encryption together may cost at most 25% of pack throughput.
        ("signed+encrypted pack / pack", "pack_trust", "pack", ">=", 0.75),
    ]
    out = []
    for name, a, b, op, goal in specs:
        if a not in runs or b not in runs:
            continue
        value, best = speedup(a, b, "median"), speedup(a, b, "best")
        passed = None if op is None else (value >= goal if op == ">=" else value <= goal)
        out.append(
            {
                "name": name,
                "value": round(value, 3),
                "value_best": round(best, 3),
                "op": op,
                "target": goal,
                "pass": passed,
            }
        )
    if rss:
        peak = max(max(r["pack_mb"], r["verify_mb"]) for r in rss)
        out.append(
            {
                "name": "peak RSS MB (pack, verify, any size)",
                "value": peak,
                "value_best": None,
                "op": "<",
                "target": 150.0,
                "pass": peak < 150.0,
            }
        )
    return out


def print_table(
    meta: dict[str, Any], runs: dict[str, dict[str, Any]], goals: list, rss: list
) -> None:
    print()
    print(
        f"source {meta['source_bytes'] / GIB:.2f} GiB ({meta['tensor_files']} tensor files, "
        f"{meta['json_files']} JSON files), repeat {meta['repeat']}, "
        f"workdir on {meta['workdir_fs']}, {meta['cpus']} CPUs"
    )
    print(f"{'':42} {'median':>15} {'best':>15}")
    print(f"{'tool':42} {'s':>7} {'GiB/s':>7} {'s':>7} {'GiB/s':>7} {'src/archive':>12}")
    for run in runs.values():
        ratio = f"{run['compression_ratio']:.3f}" if run["compression_ratio"] else ""
        print(
            f"{run['label']:42} {run['median_s']:7.3f} {run['median_gib_s']:7.3f} "
            f"{run['best_s']:7.3f} {run['best_gib_s']:7.3f} {ratio:>12}"
        )
    if rss:
        print()
        print(f"{'peak RSS (MB)':42} {'source GiB':>10} {'pack':>8} {'verify':>8} {'import':>8}")
        for r in rss:
            print(
                f"{'':42} {r['source_bytes'] / GIB:10.2f} {r['pack_mb']:8.1f} "
                f"{r['verify_mb']:8.1f} {r['import_only_mb']:8.1f}"
            )
    print()
    print(f"{'target (ratio of throughputs, medians)':42} {'value':>7} {'best':>7} {'target':>9}")
    for g in goals:
        best = "" if g["value_best"] is None else f"{g['value_best']:7.2f}"
        goal = "" if g["op"] is None else f"{g['op']} {g['target']:g}"
        verdict = "" if g["pass"] is None else ("PASS" if g["pass"] else "FAIL")
        print(f"{g['name']:42} {g['value']:7.2f} {best:>7} {goal:>9}  {verdict}")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="source size (default 1.0)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every tool (default 3)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "restorepoint-bench",
        help="where the cached source and the outputs go (e.g. a directory under /dev/shm)",
    )
    parser.add_argument(
        "--rss-sizes",
        default="1,2",
        help="peak-RSS runs at these multiples of --size-gib (default 1,2; empty: none)",
    )
    parser.add_argument("--json", action="store_true", help="also print every number as JSON")
    args = parser.parse_args(argv)
    if args.size_gib <= 0 or args.repeat < 1:
        parser.error("--size-gib must be positive and --repeat at least 1")
    try:
        args.rss_sizes = [int(x) for x in args.rss_sizes.split(",") if x.strip()]
    except ValueError:
        parser.error("--rss-sizes takes whole multiples, e.g. 1,2")
    if any(k < 1 for k in args.rss_sizes):
        parser.error("--rss-sizes takes whole multiples, e.g. 1,2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import numpy  # noqa: F401
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
    verify_object = workdir / "verify.rp"
    source, total = ensure_source(workdir, args.size_gib)
    files = source_files(source)
    try:
        torch_state = load_torch_state(source)
        # One untimed pass puts the source in the page cache: every tool then reads it warm.
        single_pass(files)
        restorepoint.pack(str(source), str(verify_object), position=0)
        tools = make_tools(source, verify_object, torch_state)
        for r in range(args.repeat):
            # A fresh order each round (seeded, so runs are comparable): no tool always
            # follows the same neighbour and inherits its writeback or its cache state.
            order = tools[:]
            random.Random(r).shuffle(order)
            for tool in order:
                clear(out)
                started = time.perf_counter()
                size = tool.run(out)
                tool.times.append(time.perf_counter() - started)
                tool.archive = size or tool.archive
            print(f"round {r + 1}/{args.repeat} done", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        verify_object.unlink(missing_ok=True)
        rss = measure_rss(source, total, workdir, args.rss_sizes)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        verify_object.unlink(missing_ok=True)
    runs = summarize(tools, total)
    goals = targets(runs, rss)
    import zstandard

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "source_bytes": total,
        "tensor_files": sum(1 for f in files if f.suffix == ".bin"),
        "json_files": sum(1 for f in files if f.suffix == ".json"),
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
    print_table(meta, runs, goals, rss)
    if args.json:
        print(json.dumps({"meta": meta, "runs": runs, "targets": goals, "rss": rss}, indent=2))
    return 0


def _version_of(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
