"""The process the crash tests kill: pack SOURCE to DEST with restorepoint.pack, as a trainer
would, then stay alive (a trainer goes on training) until killed or LINGER seconds pass.

Prints ``ready`` once everything but the pack itself is imported (so that the kill delay
measures the pack, not the interpreter's start), then ``published DIGEST`` after the commit.
The head's id and time are fixed, so every pack of one source is the same bytes.

    python _packer.py SOURCE DEST [LINGER]

s3:// destinations reach their server through the environment (FSSPEC_S3)."""

from __future__ import annotations

import sys
import time

import restorepoint

#: Fixed so that the new restore point is byte-identical from one trial to the next.
RP_ID = "c0ffee00" * 4
CREATED = "2026-01-01T00:00:00.000Z"
STEP = 2


def main(argv: list[str]) -> int:
    source, dest = argv[0], argv[1]
    linger = float(argv[2]) if len(argv) > 2 else 0.0
    if dest.startswith("s3://"):
        import s3fs  # noqa: F401 - its import (~0.5 s) is not part of the pack

    print("ready", flush=True)
    result = restorepoint.pack(
        source, dest, position=STEP, chunk_size=65536, rp_id=RP_ID, created=CREATED
    )
    print("published", result.digest, flush=True)
    time.sleep(linger)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
