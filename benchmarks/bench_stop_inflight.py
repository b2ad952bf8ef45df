"""A stop while a periodic publish is in flight, under a store deadline: what lands, and when.

    python benchmarks/bench_stop_inflight.py [--size 1G] [--store s3|local] [--rounds 3]
        [--factors 2,4] [--lead 0.5] [--workdir DIR] [--json]

Needs torch, s3fs, moto[server] and boto3 (``restorepoint[torch,s3,test]``); run from the
repository root. The state is bench_resume.py's: real trained weights tiled to a third of
``--size``, with Adam's two moments after real steps.

Each run is a process of its own: a ResumableRun (its defaults: the publish in a process of its
own) publishes the snapshot at step 1 and waits for it (its time, T, is what the run knows of a
publish), takes the snapshot at step 2 (published in the background), and ``--lead`` seconds
later asks for a stop, taken at step 3, with ``upload_timeout`` set to FACTOR x T + the margin.
Two ways, alternated in each round:

- **abandon** (the default): the publish in flight is abandoned where the deadline holds the
  stop's publish but not both (docs/adapters.md, "Snapshots and signals");
- **wait**: the publish in flight is always waited for, then the stop's snapshot published: the
  code before, and what a SIGTERM handler beside DCP's ``async_save`` does (the future's
  ``result()``, then the stop's save).

Printed for each: the stop's time (request to exit 42), whether the stop's restore point landed
within ``upload_timeout``, and the newest step in the store after it. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import measured, use_checkout

use_checkout()

HINT = (
    "bench_stop_inflight.py needs torch, s3fs, moto[server] and boto3: restorepoint[torch,s3,test]"
)
WAYS = ("abandon", "wait")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run (in a process of its own): the stop's figures, as data."""
    import torch
    from bench_resume import build_state

    import restorepoint
    from restorepoint.ops import PackOptions
    from restorepoint.runtime import _inflight
    from restorepoint.torch import ResumableRun

    torch.set_num_threads(1)
    if spec["way"] == "wait":
        # The code before: nothing is ever given up for a newer snapshot.
        _inflight.Flights.supersede = lambda *_, **__: None  # type: ignore[method-assign]
    options = spec["options"]
    if options:
        import fsspec.config

        fsspec.config.conf["s3"] = options
    model, optimizer = build_state(spec["size"], 2)
    store = f"{spec['root']}/{uuid.uuid4().hex[:8]}/"
    run_dir = Path(spec["workdir"]) / uuid.uuid4().hex[:8]
    code: Any = None
    first = started = 0.0
    try:
        with ResumableRun(
            {"bench": "stop-inflight"}, run_dir=run_dir, store=store, storage_options=options
        ) as run:
            run.track(model=model, optimizer=optimizer)
            run.commit()
            run.snapshot(wait=True)
            first = float(run.uploads[-1]["seconds"])
            run.upload_timeout = spec["factor"] * first + PackOptions().deadline_margin
            run.commit()
            run.snapshot()
            time.sleep(spec["lead"])
            run.request_stop()
            started = time.monotonic()
            run.commit()
    except SystemExit as exc:
        code = exc.code
    stop_s = time.monotonic() - started
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (shutdown,) = [e for e in events if e["event"] == "graceful_shutdown"]
    steps = sorted(e.step for e in restorepoint.list_store(store, storage_options=options))
    return {
        "way": spec["way"],
        "factor": spec["factor"],
        "first_publish_s": round(first, 3),
        "upload_timeout_s": round(spec["factor"] * first + PackOptions().deadline_margin, 3),
        "stop_s": round(stop_s, 3),
        "code": code,
        "landed": bool(shutdown["upload_finished"]) and 3 in steps,
        "newest": max(steps) if steps else None,
        "superseded": any(e["event"] == "upload_superseded" for e in events),
        "stop_publish_s": next(
            (e["seconds"] for e in events if e["event"] == "uploaded" and e["step"] == 3), None
        ),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--store", choices=("s3", "local"), default="s3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--factors", default="2,4", help="upload_timeout in first publishes")
    parser.add_argument("--lead", type=float, default=0.5, help="the stop this long after")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    try:
        import torch  # noqa: F401
        from _resume_tools import Store, load
        from bench_resume import parse_size
    except ImportError as exc:
        print(f"{HINT} ({exc})", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    factors = [float(f) for f in args.factors.split(",") if f]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-stop-inflight-"))
    work.mkdir(parents=True, exist_ok=True)
    store = Store(args.store, work)
    results: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for factor in factors:
                for way in WAYS if round_ % 2 == 0 else WAYS[::-1]:
                    spec = {
                        "way": way, "factor": factor, "size": size, "lead": args.lead,
                        "root": store.root, "options": store.options, "workdir": str(work),
                    }  # fmt: skip
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", json.dumps(spec)],
                        capture_output=True, text=True, check=False,
                    )  # fmt: skip
                    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
                    if out.returncode != 0 or not lines:
                        print(out.stderr[-2000:], file=sys.stderr)
                        raise SystemExit(f"a run failed (exit {out.returncode})")
                    result = json.loads(lines[-1])
                    result.update(round=round_ + 1, load=round(load(), 2))
                    results.append(result)
                    print(
                        f"round {round_ + 1} x{factor:g} {way:8s} first publish "
                        f"{result['first_publish_s']:6.2f} s, upload_timeout "
                        f"{result['upload_timeout_s']:6.2f} s: stop {result['stop_s']:6.2f} s, "
                        f"{'landed' if result['landed'] else 'missed'}, newest step "
                        f"{result['newest']}, its publish {result['stop_publish_s']} s "
                        f"(load {result['load']})",
                        flush=True,
                    )
                    store.clear()
    finally:
        store.close()
    print(f"\nrestorepoint {measured()}, {args.size} to {args.store}, stop {args.lead} s after")
    print("| upload_timeout | way | stop (median) | the stop's restore point landed | newest |")
    print("|---|---|---|---|---|")
    for factor in factors:
        for way in WAYS:
            rows = [r for r in results if r["factor"] == factor and r["way"] == way]
            landed = sum(r["landed"] for r in rows)
            newest = ", ".join(str(r["newest"]) for r in rows)
            stop = statistics.median(r["stop_s"] for r in rows)
            print(
                f"| {factor:g} x first publish + margin | {way} | {stop:.2f} s | "
                f"{landed} of {len(rows)} | steps {newest} |"
            )
    if args.json:
        doc = {"env": {"restorepoint": measured(), "store": args.store}, "results": results}
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
