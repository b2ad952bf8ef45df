"""Multi-rank publish against one rank's alone (spec section 25, docs/performance.md).

    python benchmarks/bench_multipart.py [--ranks 2] [--repeat 3] [--workdir DIR] [--json]

Each "rank" is a process of its own (as on separate nodes; here they share the machine's
cores and disk) holding, in its own directory, the real-weights checkpoint of
``restorepoint.testing.weights`` (about 131 MiB: a trained BERT's state dict in float32 and
bfloat16; under DDP every rank's is the same). Measured, side by side in one run, each the
median of ``--repeat`` rounds:

- one rank: ``publish`` of its directory into a local store (what a single-process run does);
- N ranks, each its own state: every rank's ``publish_part`` of its whole checkpoint at once,
  then rank 0's ``publish_commit`` (state that differs on every rank, as sharded state does);
- N ranks under DDP, as ``ResumableRun`` publishes them: what every rank holds alike goes once,
  in rank 0's shared part, and each rank's part holds only its own small file (its RNG states
  and position, ``--own-kib``); then the commit;
- the commit alone (a head and an empty payload). No side prunes after its publish.

The ratios against one rank are the price of a multi-rank snapshot against one rank's. On one
machine the ranks share CPU and disk, so they are upper bounds of what separate nodes see.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from restorepoint.format import PartRef
from restorepoint.ops import HeadSpec, PackOptions, publish
from restorepoint.ops.parts import CommitPlan, publish_commit, publish_part
from restorepoint.testing.weights import write_checkpoint

SPEC = HeadSpec(position=100, trainer=("bench", "1"), terms={"torch": "2.13.0"}, run="bench")


def _write_rank(directory: Path) -> int:
    return sum(write_checkpoint(directory).values())


def _part(args: tuple[str, str, dict[str, Any], int | None]) -> dict[str, Any]:
    source, store, plan, rank = args
    ref = publish_part(source, store, SPEC, CommitPlan.from_dict(plan), rank=rank)
    return ref.to_dict()


def _ddp_rank(args: tuple[str, str | None, str, dict[str, Any], int]) -> list[dict[str, Any]]:
    """One DDP rank: its own small part; rank 0 also the shared part."""
    own, shared, store, plan, rank = args
    refs = [_part((own, store, plan, rank))]
    if shared is not None:
        refs.append(_part((shared, store, plan, None)))
    return refs


def _timed_commit(pool: Any, store: str, ranks: int, func: Any, jobs: Any) -> tuple[float, float]:
    plan = CommitPlan.new(ranks)
    started = time.perf_counter()
    got = pool.map(func, [(*job[:-1], plan.to_dict(), job[-1]) for job in jobs])
    refs = [r for item in got for r in (item if isinstance(item, list) else [item])]
    mid = time.perf_counter()
    publish_commit(store, SPEC, plan, [PartRef(**r) for r in refs])
    done = time.perf_counter()
    return done - started, done - mid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--own-kib", type=int, default=16, help="each DDP rank's own file (RNG, position)"
    )
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rp-bench-multipart-"))
    sources = [work / f"node{r}" for r in range(args.ranks)]
    size = 0
    for d in sources:
        size = _write_rank(d)
    owns = [work / f"own{r}" for r in range(args.ranks)]
    for r, d in enumerate(owns):
        d.mkdir(parents=True, exist_ok=True)
        (d / f"last.rank{r}.pt").write_bytes(os.urandom(args.own_kib * 1024))
    one, many, ddp, commit = [], [], [], []
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.ranks) as pool:
        for i in range(args.repeat):
            store = f"{work / f'store{i}'}/"
            started = time.perf_counter()
            publish(sources[0], store, SPEC.at(SPEC.position), PackOptions())  # type: ignore[arg-type]
            one.append(time.perf_counter() - started)
            store = f"{work / f'mstore{i}'}/"
            each = [(str(d), store, r) for r, d in enumerate(sources)]
            total, last = _timed_commit(pool, store, args.ranks, _part, each)
            many.append(total)
            commit.append(last)
            store = f"{work / f'dstore{i}'}/"
            jobs = [
                (str(d), str(sources[0]) if r == 0 else None, store, r) for r, d in enumerate(owns)
            ]
            ddp.append(_timed_commit(pool, store, args.ranks, _ddp_rank, jobs)[0])
    result = {
        "ranks": args.ranks,
        "mib_per_rank": round(size / 2**20, 1),
        "cores": os.cpu_count(),
        "one_rank_s": statistics.median(one),
        "all_ranks_s": statistics.median(many),
        "ddp_s": statistics.median(ddp),
        "commit_s": statistics.median(commit),
    }
    result["ddp_ratio"] = result["ddp_s"] / result["one_rank_s"]
    result["ratio"] = result["all_ranks_s"] / result["one_rank_s"]
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.ranks} ranks x {result['mib_per_rank']} MiB (real weights), "
        f"{os.cpu_count()} cores, median of {args.repeat}"
    )
    rows = [
        ("one rank publish", result["one_rank_s"], "s"),
        (f"{args.ranks} ranks, each its own state", result["all_ranks_s"], "s"),
        ("  of which the commit", result["commit_s"], "s"),
        (f"{args.ranks} ranks under DDP (state once)", result["ddp_s"], "s"),
        ("ratio each own / one rank", result["ratio"], "x"),
        ("ratio DDP / one rank", result["ddp_ratio"], "x"),
    ]
    for label, value, unit in rows:
        print(f"  {label:<34} {value:8.3f} {unit}")


if __name__ == "__main__":
    main()
