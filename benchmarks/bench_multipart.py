"""Multi-rank publish against one rank's alone (spec section 25, docs/performance.md).

    python benchmarks/bench_multipart.py [--ranks 2] [--repeat 3] [--workdir DIR] [--json]

Each "rank" is a process of its own (as on separate nodes; here they share the machine's
cores and disk) holding, in its own directory, the real-weights checkpoint of
``restorepoint.testing.weights`` (about 131 MiB: a trained BERT's state dict in float32 and
bfloat16; under DDP every rank's is the same). Measured, side by side in one run, each the
median of ``--repeat`` rounds:

- one rank: ``publish`` of its directory into a local store (what a single-process run does);
- N ranks: every rank's ``publish_part`` at once, then rank 0's ``publish_commit`` (what a
  multi-rank snapshot costs from the first byte to the commit point);
- the commit alone (a head and an empty payload). Neither side prunes after its publish.

The ratio N ranks / one rank is the price of every rank's state against one's. On one machine
the ranks share CPU and disk, so the ratio is an upper bound of what separate nodes see.
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


def _part(args: tuple[str, str, dict[str, Any], int]) -> dict[str, Any]:
    source, store, plan, rank = args
    ref = publish_part(source, store, SPEC, CommitPlan.from_dict(plan), rank=rank)
    return ref.to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rp-bench-multipart-"))
    sources = [work / f"node{r}" for r in range(args.ranks)]
    size = 0
    for d in sources:
        size = _write_rank(d)
    one, many, commit = [], [], []
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.ranks) as pool:
        for i in range(args.repeat):
            store = f"{work / f'store{i}'}/"
            started = time.perf_counter()
            publish(sources[0], store, SPEC.at(SPEC.position), PackOptions())  # type: ignore[arg-type]
            one.append(time.perf_counter() - started)
            store = f"{work / f'mstore{i}'}/"
            plan = CommitPlan.new(args.ranks)
            started = time.perf_counter()
            refs = pool.map(
                _part, [(str(d), store, plan.to_dict(), r) for r, d in enumerate(sources)]
            )
            mid = time.perf_counter()
            publish_commit(store, SPEC, plan, [PartRef(**r) for r in refs])
            done = time.perf_counter()
            many.append(done - started)
            commit.append(done - mid)
    result = {
        "ranks": args.ranks,
        "mib_per_rank": round(size / 2**20, 1),
        "cores": os.cpu_count(),
        "one_rank_s": statistics.median(one),
        "all_ranks_s": statistics.median(many),
        "commit_s": statistics.median(commit),
    }
    result["ratio"] = result["all_ranks_s"] / result["one_rank_s"]
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.ranks} ranks x {result['mib_per_rank']} MiB (real weights), "
        f"{os.cpu_count()} cores, median of {args.repeat}"
    )
    print(f"  one rank publish           {result['one_rank_s']:8.3f} s")
    print(f"  {args.ranks} ranks: parts + commit    {result['all_ranks_s']:8.3f} s")
    print(f"    of which the commit      {result['commit_s']:8.3f} s")
    print(f"  ratio all ranks / one rank {result['ratio']:8.2f}")


if __name__ == "__main__":
    main()
