"""restorepoint snapshot RUN_DIR | --pid PID"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from ._common import print_json, run, say


def snapshot_command(
    run_dir: Annotated[
        Path | None,
        typer.Argument(help="The run directory (or an external trainer's --workdir)."),
    ] = None,
    pid: Annotated[
        int | None,
        typer.Option(help="Ask this process instead (a supervisor, or a ResumableRun)."),
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Wait up to this many seconds for the snapshot (0: do not).")
    ] = 0.0,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Ask a running trainer for a snapshot now, without stopping it. Only the snapshot
    signal is sent, and only to a live process of yours that catches it (exit 2 or 4, one
    line, nothing sent otherwise)."""

    def body() -> None:
        from ..runtime.snapshot_request import SnapshotTarget, request_snapshot

        if (run_dir is None) == (pid is None):
            raise UsageError("give a run directory or --pid, one of them")
        if pid is not None:
            if wait:
                raise UsageError("--wait needs the run directory, where snapshots are recorded")
            asked, step = request_snapshot(SnapshotTarget(pid))
        else:
            assert run_dir is not None
            asked, step = request_snapshot(run_dir, wait=wait)
        if json_:
            print_json({"ok": True, "pid": asked, "step": step})
        else:
            say(
                f"snapshot requested from pid {asked}"
                + (f": taken at step {step}" if step is not None else "")
            )

    run(json_, body)
