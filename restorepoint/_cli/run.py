"""restorepoint run -- TRAINER ARGS..., and restorepoint snapshot RUN_DIR"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..adapters.base import load_adapter
from ..errors import NotFound, UsageError
from ..preempt import AwsWatcher, GcpWatcher, Supervisor, Telemetry
from ..preempt.watchers import AWS_ENDPOINT, GCP_ENDPOINT, Watcher
from ._common import parse_pairs, print_json, run, say


def run_command(
    trainer: Annotated[list[str], typer.Argument(help="The trainer's command line, after --.")],
    store: Annotated[str, typer.Option(help="Store URL the restore points go to.")],
    adapter: Annotated[str | None, typer.Option(help="Trainer adapter (see `adapters`).")] = None,
    adapter_option: Annotated[
        list[str] | None, typer.Option(help="An adapter option K=V (repeatable).")
    ] = None,
    watch: Annotated[
        str, typer.Option(help="Reclaim notices to watch: aws, gcp or none.")
    ] = "none",
    metadata_url: Annotated[
        str | None, typer.Option(help="The metadata service's base URL (tests: an emulator).")
    ] = None,
    resume_from: Annotated[
        str | None, typer.Option(help="Import this restore point and resume from it.")
    ] = None,
    auto_resume: Annotated[
        bool, typer.Option("--auto-resume", help="Resume from the run's newest restore point.")
    ] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="The run id in the store.")] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="The trainer's output directory (external adapters).")
    ] = None,
    telemetry: Annotated[
        Path | None, typer.Option(help="Append counts and timings (JSON lines) to this file.")
    ] = None,
    margin: Annotated[float, typer.Option(help="Seconds kept in hand before a deadline.")] = 5.0,
) -> None:
    """Run a trainer under supervision: reclaim notices become published restore points; a
    trainer exit of 42 (resumable) is passed on."""

    def body() -> None:
        if resume_from and auto_resume:
            raise UsageError("--resume-from and --auto-resume exclude each other")
        logging.basicConfig(
            level=logging.INFO, format="restorepoint: %(message)s", stream=sys.stderr
        )
        watcher: Watcher | None
        if watch == "aws":
            watcher = AwsWatcher(metadata_url or AWS_ENDPOINT)
        elif watch == "gcp":
            watcher = GcpWatcher(metadata_url or GCP_ENDPOINT)
        elif watch == "none":
            watcher = None
        else:
            raise UsageError(f"--watch must be aws, gcp or none, not {watch!r}")
        chosen = (
            load_adapter(adapter, **parse_pairs(adapter_option, "--adapter-option"))
            if adapter
            else None
        )
        supervisor = Supervisor(
            command=trainer,
            store=store,
            adapter=chosen,
            watcher=watcher,
            resume_from=resume_from,
            auto_resume=auto_resume,
            run=run_id,
            workdir=workdir,
            telemetry=Telemetry(telemetry),
            margin_s=margin,
        )
        raise typer.Exit(supervisor.run_trainer())

    run(False, body)


def snapshot_command(
    run_dir: Annotated[Path, typer.Argument(help="The run directory of a running trainer.")],
    wait: Annotated[
        float, typer.Option(help="Wait up to this many seconds for the snapshot (0: do not).")
    ] = 0.0,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Ask a running trainer for a snapshot now, without stopping it."""

    def body() -> None:
        record = run_dir / "trainer.json"
        try:
            doc = json.loads(record.read_text())
            pid = int(doc["pid"])
        except FileNotFoundError:
            raise NotFound(
                "no running trainer reported in this run directory", url=str(run_dir)
            ) from None
        except (ValueError, KeyError, TypeError):
            raise UsageError("unreadable trainer.json", url=str(run_dir)) from None
        events = run_dir / "events.jsonl"
        before = events.stat().st_size if events.exists() else 0
        # trainer.json outlives a trainer that was killed (SIGKILL, OOM): its pid may be another
        # process's by now, and SIGUSR1 would kill that one.
        if _started_after(pid, record.stat().st_mtime):
            raise NotFound(
                f"the trainer (pid {pid}) is not running: that pid is another process's now",
                url=str(run_dir),
            )
        try:
            os.kill(pid, int(doc.get("snapshot_signal", signal.SIGUSR1)))
        except ProcessLookupError:
            raise NotFound(f"the trainer (pid {pid}) is not running", url=str(run_dir)) from None
        except PermissionError:
            raise NotFound(
                f"the trainer (pid {pid}) is not running: that pid is another user's process",
                url=str(run_dir),
            ) from None
        step = None
        if wait > 0:
            step = _wait_for_snapshot(events, before, wait)
            if step is None:
                raise UsageError(f"no snapshot within {wait:g} s", url=str(run_dir))
        if json_:
            print_json({"ok": True, "pid": pid, "step": step})
        else:
            say(
                f"snapshot requested from pid {pid}"
                + (f": taken at step {step}" if step is not None else "")
            )

    run(json_, body)


def _started_after(pid: int, moment: float) -> bool:
    """Whether process ``pid`` started well after ``moment``; False where /proc cannot tell.
    A minute of slack: the boot time is in whole seconds and a run directory on a network
    file system gets its mtime from the server's clock; a pid comes round again far later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        # Fields after the command name (which may hold spaces and parentheses): the start
        # time, in clock ticks since boot, is field 22 of the line, 20th after the name.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return started > moment + 60.0


def _wait_for_snapshot(events: Path, offset: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events.exists():
            with open(events, "rb") as f:
                f.seek(offset)
                for line in f.read().decode(errors="replace").splitlines():
                    try:
                        doc = json.loads(line)
                    except ValueError:
                        continue
                    if doc.get("event") == "snapshot":
                        return int(doc["step"])
        time.sleep(0.1)
    return None
