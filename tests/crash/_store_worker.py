"""The process the store crash tests kill: pack into a store with keep-last 1 (the seed
workflow of a trainer that publishes each checkpoint and keeps only the newest), or prune a
store with keep-last 2, or publish an incremental restore point (spec section 28) into a store
that holds a chain, with keep-last 1 (tests/crash/test_kill_chain.py), then stay alive until
killed or LINGER seconds pass.

Prints ``ready`` once everything but the operation itself is imported (so that the kill delay
measures the operation, not the interpreter's start), then ``done N`` (N: restore points
deleted) when the operation returned. The new restore point's id and time are fixed, so every
pack of one source is the same bytes under the same name.

    python _store_worker.py pack SOURCE STORE/ LINGER
    python _store_worker.py incremental SOURCE STORE/ LINGER
    python _store_worker.py prune STORE/ LINGER

s3:// stores reach their server through the environment (FSSPEC_S3)."""

from __future__ import annotations

import sys
import time

import restorepoint
from restorepoint.ops.publish import HeadSpec, PackOptions, publish

RUN = "r1"
#: Fixed so that the new restore point is byte-identical, and named alike, from trial to trial.
RP_ID = "5703e000" * 4
CREATED = "2026-01-02T00:00:00.000Z"
#: Past every older restore point the tests put in the store (steps 1 to 8).
STEP = 10
CHUNK_SIZE = 65536


def main(argv: list[str]) -> int:
    verb, store, linger = argv[0], argv[-2], float(argv[-1])
    if store.startswith("s3://"):
        import s3fs  # noqa: F401 - its import (~0.5 s) is not part of the operation

    print("ready", flush=True)
    if verb == "pack":
        head = HeadSpec(STEP, run=RUN, rp_id=RP_ID, created=CREATED)
        done = publish(argv[1], store, head, PackOptions(chunk_size=CHUNK_SIZE), keep_last=1)
        report = done.pruned
        assert report is not None
    elif verb == "incremental":
        head = HeadSpec(STEP, run=RUN, rp_id=RP_ID, created=CREATED)
        options = PackOptions(chunk_size=CHUNK_SIZE, incremental=True)
        done = publish(argv[1], store, head, options, keep_last=1)
        report = done.pruned
        assert report is not None
    elif verb == "prune":
        report = restorepoint.prune(store, keep_last=2, run=RUN)
    else:
        raise SystemExit(f"unknown verb {verb!r}")
    print("done", len(report.deleted), flush=True)
    time.sleep(linger)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
