"""Publish into S3 (moto) through the fault-injecting proxy of the tests: throughput and
success rate at 0 %, 1 % and 5 % injected faults (resets and 503 SlowDown, half each), and the
time to fail on a store that stalls every request.

    python benchmarks/bench_faults.py [--publishes 20] [--size-mib 20] [--json]

Needs moto[server] and s3fs (``restorepoint[s3,test]``); run from the repository root (the
proxy lives in tests/_servers). Each publish is one ``pack`` of a fresh checkpoint into a store
with the default retry policy, except the stall timeout, set to 2 s for the stalled store."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--size-mib", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import boto3
    from _servers.faults import FaultProxy, Faults
    from _servers.s3 import s3_options
    from moto.server import ThreadedMotoServer

    from restorepoint import pack
    from restorepoint.errors import RestorePointError
    from restorepoint.storage import resolve
    from restorepoint.testing.store import checkpoint

    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    proxy = FaultProxy(port, "s3").start()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = checkpoint(Path(tmp) / "src", seed=1, size=args.size_mib << 20)
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        for rate in (0.0, 0.01, 0.05):
            proxy.set(Faults(reset=rate / 2, error=rate / 2, seed=7))
            store = resolve(f"s3://{bucket}/r{rate}/", s3_options(proxy.endpoint))
            ok, seconds = 0, 0.0
            for step in range(args.publishes):
                start = time.perf_counter()
                try:
                    pack(source, store, run="bench", position=step)
                    ok += 1
                    seconds += time.perf_counter() - start
                except RestorePointError:
                    pass
            rows.append(
                {
                    "faults": rate,
                    "publishes": args.publishes,
                    "succeeded": ok,
                    "requests": proxy.requests,
                    "injected": sum(proxy.injected.values()),
                    "mib_per_s": (ok * size / (1 << 20)) / seconds if seconds else 0.0,
                }
            )
        os.environ["RESTOREPOINT_STORE_STALL_TIMEOUT"] = "2"
        proxy.set(Faults(stall=1.0, stall_s=3600))
        store = resolve(f"s3://{bucket}/stalled/", s3_options(proxy.endpoint))
        start = time.perf_counter()
        try:
            pack(source, store, run="bench", position=0)
            failed = ""
        except RestorePointError as exc:
            failed = type(exc).__name__
        stalled = {"time_to_fail_s": time.perf_counter() - start, "error": failed}
    proxy.stop()
    server.stop()
    result = {"size_bytes": size, "rows": rows, "stalled": stalled}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"checkpoint {size / (1 << 20):.1f} MiB, {args.publishes} publishes per rate")
    print("faults  succeeded  requests  injected  MiB/s")
    for r in rows:
        print(
            f"{r['faults']:>5.0%}  {r['succeeded']:>4}/{r['publishes']:<4}  {r['requests']:>8}"
            f"  {r['injected']:>8}  {r['mib_per_s']:6.1f}"
        )
    print(f"stalled store (stall timeout 2 s): failed with {failed} after "
          f"{stalled['time_to_fail_s']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
