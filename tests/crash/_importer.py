"""The process the crash tests kill: import URL into DEST with restorepoint.import_restore_point,
as a job resuming on a new machine would, then stay alive until killed or LINGER seconds pass.

Prints ``ready`` once everything but the import itself is loaded (so that the kill delay
measures the import, not the interpreter's start), then ``imported`` after the move into place.

    python _importer.py URL DEST LINGER [--force] [--no-exchange] [--in-memory]

``--no-exchange`` makes the importer use its fallback for file systems without
renameat2(RENAME_EXCHANGE): two renames. ``--in-memory`` imports as a ResumableRun resuming
from its store does: the bytes held, the staging copy written on a thread of its own, then
``finish()`` (U8, U9).
"""

from __future__ import annotations

import sys
import time

import restorepoint


def main(argv: list[str]) -> int:
    url, dest, linger = argv[0], argv[1], float(argv[2])
    force = "--force" in argv[3:]
    if "--no-exchange" in argv[3:]:
        from restorepoint.ops import _staging

        _staging.rename_exchange = lambda a, b: False
    print("ready", flush=True)
    if "--in-memory" in argv[3:]:
        restorepoint.import_restore_point(url, dest, force=force, in_memory=True).finish()
    else:
        restorepoint.import_restore_point(url, dest, force=force)
    print("imported", flush=True)
    time.sleep(linger)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
