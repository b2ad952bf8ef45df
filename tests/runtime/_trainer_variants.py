"""Small trainers on the ResumableRun contract that record what the model saw.

In-process: ``train()`` runs (or resumes) one run to its end or to a preemption and returns an
``Outcome``: the exit code, the position resume() reported, every sample index fed to the model
in order, the random numbers drawn after each commit, and the final state of every tracked
object. As a script (``python _trainer_variants.py ddp ...``) it is one rank of a DDP run over
gloo, for tests/runtime/test_distributed.py.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from restorepoint.format import Position
from restorepoint.testing.process import exit_after
from restorepoint.torch import ResumableRun

CONFIG: dict[str, Any] = {
    "model": {"inputs": 8, "hidden": 16, "dropout": 0.25},
    "optimizer": {"lr": 0.01},
    "scheduler": {"step_size": 4, "gamma": 0.5},
    # 44 samples in micro-batches of 4 are 11 micro-batches: 6 effective batches of 2, the last
    # one short, so positions count a partial effective batch too.
    "data": {"samples": 44, "batch_size": 4, "accumulate": 2, "seed": 99},
    "epochs": 3,
    "seed": 11,
    "train": {"snapshot_every": 0},
}
OPERATIONAL = ["epochs", "train.snapshot_every"]


def steps_per_epoch(config: dict[str, Any] = CONFIG) -> int:
    data = config["data"]
    micro = -(-data["samples"] // data["batch_size"])
    return -(-micro // data["accumulate"])


def total_steps(config: dict[str, Any] = CONFIG) -> int:
    return steps_per_epoch(config) * config["epochs"]


def config_with(**changes: Any) -> dict[str, Any]:
    """A copy of CONFIG with dotted keys changed: ``config_with(**{"optimizer.lr": 0.1})``."""
    config = copy.deepcopy(CONFIG)
    for dotted, value in changes.items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


class IndexedData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """A fixed synthetic data set whose items carry their index, so the test sees exactly which
    samples the model was fed. With ``pid_dir``, every load appends ``index`` to a file named
    after the loading process, which tells the test a DataLoader worker's pid."""

    def __init__(self, config: dict[str, Any], offset: int = 0, pid_dir: Path | None = None):
        g = torch.Generator().manual_seed(config["data"]["seed"] + offset)
        n, d = config["data"]["samples"], config["model"]["inputs"]
        self.x = torch.randn(n, d, generator=g)
        w = torch.randn(d, 1, generator=g)
        self.y = (self.x @ w > 0).float()
        self.pid_dir = pid_dir

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self.pid_dir is not None:
            with open(self.pid_dir / str(os.getpid()), "a") as f:
                f.write(f"{i}\n")
        return self.x[i], self.y[i], i


def draw() -> tuple[float, float, float]:
    """One number from each global RNG a training loop may use."""
    return (random.random(), float(np.random.rand()), float(torch.rand(1).item()))


@dataclass
class Outcome:
    code: int = 0
    position: Position | None = None
    run: ResumableRun | None = None
    seen: list[int] = field(default_factory=list)
    # Drawn after every commit; a resumed run draws once right after resume(), standing in for
    # the draw after the commit it was preempted at.
    draws: list[tuple[float, float, float]] = field(default_factory=list)
    epoch_draws: list[float] = field(default_factory=list)
    state: dict[str, Any] | None = None
    #: What ended the run with its exit code, when an error did (a refusal: exit 3).
    error: BaseException | None = None


#: before_commit(run, step_about_to_be_committed) runs after the optimizer step.
Hook = Callable[[ResumableRun, int], None]


def build(config: dict[str, Any], seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    m = config["model"]
    model = torch.nn.Sequential(
        torch.nn.Linear(m["inputs"], m["hidden"]),
        torch.nn.ReLU(),
        torch.nn.Dropout(m["dropout"]),
        torch.nn.Linear(m["hidden"], 1),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=config["optimizer"]["lr"])
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, config["scheduler"]["step_size"], config["scheduler"]["gamma"]
    )
    # Enabled on the CPU with a short growth interval: its scale and growth tracker change
    # during the run, so a resume that lost them would show.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}


def train(
    root: Path,
    *,
    config: dict[str, Any] | None = None,
    store: str | None = None,
    stop_at: int | None = None,
    stop_how: str = "request",
    before_commit: Hook | None = None,
    data: torch.utils.data.Dataset[Any] | None = None,
    loader_kwargs: dict[str, Any] | None = None,
    extra_objects: dict[str, Any] | None = None,
    **run_kwargs: Any,
) -> Outcome:
    """Run or resume to the end, or until the stop requested before committing ``stop_at``
    (``stop_how``: "request" calls run.request_stop(), "signal" sends this process SIGTERM)."""
    config = copy.deepcopy(config or CONFIG)
    out = Outcome()
    data = data if data is not None else IndexedData(config)
    batch, accumulate = config["data"]["batch_size"], config["data"]["accumulate"]
    try:
        with ResumableRun(
            config,
            root=root,
            store=store,
            operational=OPERATIONAL,
            snapshot_every="train.snapshot_every",
            **run_kwargs,
        ) as run:
            out.run = run
            random.seed(run.seed)
            np.random.seed(run.seed)
            objects = build(config, run.seed)
            model, optimizer = objects["model"], objects["optimizer"]
            scheduler, scaler = objects["scheduler"], objects["scaler"]
            run.track(**objects, **(extra_objects or {}))
            out.position = run.resume()
            if run.resumed_from is not None:
                out.draws.append(draw())
            for _epoch in run.epochs(config["epochs"]):
                loader = run.dataloader(data, batch, accumulate, **(loader_kwargs or {}))
                for group in run.effective_batches(loader, accumulate):
                    for x, y, idx in group:
                        out.seen.extend(int(i) for i in idx)
                        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
                        scaler.scale(loss / len(group)).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
                    scheduler.step()
                    if before_commit is not None:
                        before_commit(run, run.step + 1)
                    if stop_at == run.step + 1:
                        if stop_how == "signal":
                            os.kill(os.getpid(), signal.SIGTERM)
                        else:
                            run.request_stop()
                    run.commit()
                    out.draws.append(draw())
                # Epoch-end work (validation, say) that draws from the global RNG.
                out.epoch_draws.append(float(torch.rand(1).item()))
            out.state = copy.deepcopy({k: v.state_dict() for k, v in objects.items()})
    except SystemExit as exc:
        out.code = int(exc.code) if isinstance(exc.code, int) else 1
        out.error = exc.__cause__
    return out


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Equal bit for bit: tensors by dtype, shape and every value; everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {a.keys()} {b}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, type(a)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def saves_here(monkeypatch: Any) -> list[str]:
    """The names of the snapshot files the training process itself writes beside a publish
    from now on (``runtime.publish.save_image``, wrapped), in order: with a publish process
    the child writes them, and the list stays empty."""
    from restorepoint.runtime import publish as runtime_publish

    here: list[str] = []
    real = runtime_publish.save_image

    def save_here(image: Any, target: Path, scratch: Path) -> None:
        here.append(target.name)
        real(image, target, scratch)

    monkeypatch.setattr(runtime_publish, "save_image", save_here)
    return here


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's events; a run that had none has no events.jsonl."""
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


# -- one rank of a DDP run (a script, started by test_distributed.py) ------------------------


def ddp_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    # Under torchrun: RANK and WORLD_SIZE, and an env:// rendezvous (no --init).
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    parser.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    parser.add_argument("--init", help="file:// rendezvous of the process group")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--store")
    parser.add_argument("--out", required=True, help="the final state; {rank} is the rank")
    parser.add_argument("--stop-at", type=int, help="rank 0 requests a stop before this commit")
    parser.add_argument("--snapshot-every", type=int)
    parser.add_argument("--pack-delay", type=float, help="seconds each pack waits first")
    parser.add_argument(
        "--root-per-rank", action="store_true", help="each rank its own node: ROOT/nodeR"
    )
    parser.add_argument("--sigterm-at", type=int, help="every rank gets SIGTERM at this step")
    parser.add_argument(
        "--kill-in-upload", type=int, help="this rank is SIGKILLed while its part uploads"
    )
    parser.add_argument("--ddp-option", action="append", default=[], help="NAME=true|false")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per step")
    parser.add_argument(
        "--chunk-delay", type=float, help="seconds a part's pack waits at each chunk: a slow store"
    )
    parser.add_argument("--upload-timeout", type=float, default=300.0)
    parser.add_argument(
        "--backend",
        default="gloo",
        help="the default group's backend: \"cuda:gloo\" carries no CPU tensor, as NCCL's does not",
    )
    args = parser.parse_args(argv)
    args.out = Path(args.out.format(rank=args.rank))
    if args.root_per_rank:
        args.root = args.root / f"node{args.rank}"
    if args.kill_in_upload == args.rank:
        from restorepoint.format.writer import Writer

        real_add = Writer.add

        def dying_add(self: Any, *a: Any, **k: Any) -> Any:
            # Killed in the middle of its part's upload: the head is out, no file yet.
            if self.head.part is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_add(self, *a, **k)

        Writer.add = dying_add  # type: ignore[method-assign]
    if args.pack_delay:
        from restorepoint.runtime import _parts as runtime_parts
        from restorepoint.runtime import publish as runtime_publish

        def slow(real: Any) -> Any:
            def slow_publish(*a: Any, **k: Any) -> Any:
                # A slow upload: the next snapshot comes while this one is still being packed.
                time.sleep(args.pack_delay)
                return real(*a, **k)

            return slow_publish

        runtime_publish.publish = slow(runtime_publish.publish)  # type: ignore[assignment]
        runtime_parts.publish_part = slow(runtime_parts.publish_part)  # type: ignore[assignment]
    if args.chunk_delay:
        from restorepoint.runtime import _parts as runtime_parts

        real_part = runtime_parts.publish_part

        def slow_part(*a: Any, progress: Any = None, **k: Any) -> Any:
            def slow(n: int) -> None:
                # A store that takes its time over each chunk: the pack's hook, where a
                # publish that is given up raises, runs after the wait.
                time.sleep(args.chunk_delay)
                if progress is not None:
                    progress(n)

            return real_part(*a, progress=slow, **k)

        runtime_parts.publish_part = slow_part  # type: ignore[assignment]
    torch.set_num_threads(1)
    if args.world > 1:
        torch.distributed.init_process_group(
            args.backend, init_method=args.init, rank=args.rank, world_size=args.world
        )
        if args.backend != "gloo":
            try:
                torch.distributed.all_reduce(torch.zeros(1))
            except RuntimeError as exc:
                # What an NCCL job's default group answers a CPU tensor.
                print(f"the default group refuses a CPU tensor: {exc}", flush=True)
    config = copy.deepcopy(CONFIG)
    # Every rank sees its own data (same order, other samples), as a sharded loader gives.
    data = IndexedData(config, offset=args.rank)
    batch, accumulate = config["data"]["batch_size"], config["data"]["accumulate"]
    code = 0
    try:
        with ResumableRun(
            config,
            root=args.root,
            store=args.store,
            operational=OPERATIONAL,
            snapshot_every=args.snapshot_every,
            upload_timeout=args.upload_timeout,
        ) as run:
            random.seed(run.seed + args.rank)
            np.random.seed(run.seed + args.rank)
            objects = build(config, run.seed)
            # Each rank its own dropout masks: per-rank RNG states are part of the snapshot.
            torch.manual_seed(run.seed + 1000 * args.rank)
            model = objects["model"]
            net: torch.nn.Module = model
            if torch.distributed.is_initialized() and args.backend == "gloo":
                options = {k: v == "true" for k, v in (o.split("=") for o in args.ddp_option)}
                net = torch.nn.parallel.DistributedDataParallel(model, **options)
            optimizer, scheduler = objects["optimizer"], objects["scheduler"]
            run.track(model=model, optimizer=optimizer, scheduler=scheduler)
            pos = run.resume()
            print(f"resumed {pos.step} {pos.epoch} {pos.batch}", flush=True)
            for _epoch in run.epochs(config["epochs"]):
                for group in run.effective_batches(
                    run.dataloader(data, batch, accumulate), accumulate
                ):
                    for i, (x, y, _idx) in enumerate(group):
                        last = i == len(group) - 1
                        # DDP averages gradients on the last micro-batch only.
                        sync = last or net is model
                        with contextlib.nullcontext() if sync else net.no_sync():  # type: ignore[operator]
                            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x), y)
                            (loss / len(group)).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    scheduler.step()
                    if args.stop_at == run.step + 1 and args.rank == 0:
                        run.request_stop()
                    if args.sigterm_at == run.step + 1:
                        os.kill(os.getpid(), signal.SIGTERM)
                    if args.step_delay:
                        time.sleep(args.step_delay)
                    run.commit()
                    print(f"step {run.step}", flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.out)
    except SystemExit as exc:
        code = int(exc.code) if isinstance(exc.code, int) else 1
        print(f"exit {code} at step {run.step}", flush=True)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["ddp"]:
        exit_after(lambda: ddp_main(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} ddp ...")
