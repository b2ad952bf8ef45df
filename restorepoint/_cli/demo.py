"""restorepoint demo: the README's main command, a real preempt-and-resume.

1. Train a small MLP uninterrupted (the reference).
2. Train it again in a child process; at a random step send the child a real SIGTERM. It
   snapshots at the next effective-batch boundary, publishes a restore point into a local store
   and exits with 42.
3. On "another machine" (a fresh directory) import the newest restore point through the gate.
4. Resume there to the end, and compare the final weights and optimizer state with the
   reference, bit for bit. Exit 1 if they differ.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .._text import printable
from ..errors import MissingExtra, UsageError
from ._common import out, print_json, run


def _child(
    root: Path, out: Path, store: Path | None, log: Path, step_delay: float = 0.0
) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "restorepoint.testing.trainer", "--root", str(root),
           "--out", str(out)]  # fmt: skip
    if store is not None:
        cmd += ["--store", str(store) + "/"]
    if step_delay:
        cmd += ["--step-delay", str(step_delay)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=os.environ.copy()
    )


def _finish(proc: subprocess.Popen[str], what: str, log: Path) -> int:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass
    code = proc.wait()
    from ..runtime.contract import EXIT_RESUMABLE

    if code not in (0, EXIT_RESUMABLE):
        raise UsageError(f"the {what} training run failed with exit {code}: {_last_line(log)}")
    return code


def _last_line(log: Path) -> str:
    """A child's last line of stderr: its log may be in a temporary directory that is gone
    once the error is printed, so the error quotes it rather than naming the file."""
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
    return tail[0]


def demo_command(  # noqa: PLR0915 - the demo's four steps in order, as the README tells them
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the demo's files (default: a temp dir).")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Pick the preemption step with this seed.")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Train, preempt with a real signal, import elsewhere, resume, and compare bit for bit."""

    def body() -> None:  # noqa: PLR0915 - the demo's four steps in order, as the README tells them
        try:
            import torch
        except ImportError as exc:
            raise MissingExtra("torch", "torch", "the demo") from exc
        from ..format import Trainer
        from ..ops import Expectations, latest
        from ..ops.resume import resume_import
        from ..runtime.contract import EXIT_RESUMABLE, RunDirectory
        from ..runtime.detect import torch_terms
        from ..testing.trainer import CONFIG, TRAINER

        with tempfile.TemporaryDirectory(prefix="restorepoint-demo-") as tmp:
            base = workdir or Path(tmp)
            if workdir is not None and workdir.exists() and any(workdir.iterdir()):
                raise UsageError(f"--workdir {workdir} is not empty")
            base.mkdir(parents=True, exist_ok=True)
            store = base / "store"

            def say(line: str) -> None:
                if not json_:
                    out(line + "\n")

            say("1/4 training the reference run, uninterrupted ...")
            ref = _child(
                base / "reference" / "runs", base / "reference.pt", None, base / "reference.log"
            )
            _finish(ref, "reference", base / "reference.log")

            rng = random.Random(seed)  # noqa: S311 - picks a step, not a secret
            per_epoch = CONFIG["data"]["samples"] // (
                CONFIG["data"]["batch_size"] * CONFIG["data"]["accumulate"]
            )
            total = per_epoch * CONFIG["epochs"]
            target = rng.randint(3, total - 3)
            say(f"2/4 training on machine A; a SIGTERM will arrive after step {target} ...")
            a_root = base / "machine-a" / "runs"
            # A step takes milliseconds and the child does not wait for us to read its output:
            # on a busy machine it could finish before a late SIGTERM arrives (exit 0, not 42).
            # A short pause per step keeps it within reach of the signal.
            child = _child(a_root, base / "unused.pt", store, base / "machine-a.log", 0.01)
            assert child.stdout is not None
            sent_at = None
            for line in child.stdout:
                if line.startswith("step ") and int(line.split()[1]) >= target and sent_at is None:
                    child.send_signal(signal.SIGTERM)
                    sent_at = time.perf_counter()
            code = child.wait()
            if code != EXIT_RESUMABLE:
                raise UsageError(
                    f"machine A exited {code}, not 42: {_last_line(base / 'machine-a.log')}"
                )
            (run_dir,) = list(a_root.iterdir())
            directory = RunDirectory(run_dir)
            events = list(directory.events())
            snap = next(e for e in events if e["event"] == "snapshot")
            upload = next(e for e in events if e["event"] == "uploaded")
            status = directory.status()

            say("3/4 importing the restore point on machine B, through the gate ...")
            entry = latest(str(store) + "/", run=run_dir.name)
            b_run = base / "machine-b" / "runs" / run_dir.name
            started = time.perf_counter()
            # Machine B's view of itself, as the trainer's own ResumableRun would have it.
            here = Expectations(
                trainer=Trainer(*TRAINER),
                terms=torch_terms(),
                cache_keys={},
                cache_root=None,
                config=json.loads(json.dumps(CONFIG)),
            )
            imported = resume_import(entry.url, b_run / "checkpoints", views=[here])
            import_s = time.perf_counter() - started

            say("4/4 resuming on machine B to the end ...")
            resumed = _child(
                base / "machine-b" / "runs", base / "resumed.pt", None, base / "machine-b.log"
            )
            _finish(resumed, "resumed", base / "machine-b.log")

            from ..runtime.safe_load import safe_load

            # The trainers' own outputs, but still read through the one weights-only loader.
            a = safe_load(base / "reference.pt")
            b = safe_load(base / "resumed.pt")
            same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]) and (
                _equal_state(a["optimizer"], b["optimizer"], torch)
            )
            # Without --workdir the store goes with the temporary directory: its path would
            # name a file that no longer exists once this prints.
            kept = entry.url if workdir is not None else None
            result = {
                "bitwise_identical": same,
                "import_seconds": round(import_s, 4),
                "imported_files": len(imported.files),
                "ok": same,
                "pack_seconds": upload["seconds"],
                "preempted_at_step": status["step"],
                "restore_point": kept,
                "signal_sent_after_step": target,
                "snapshot_pause_seconds": snap["pause_s"],
                "steps_total": total,
            }
            if json_:
                print_json(result)
            else:
                where = printable(kept) if kept else "deleted with the demo's temporary files"
                where += "" if kept else " (--workdir DIR keeps them)"
                out(
                    f"preempted at step {status['step']} of {total} (SIGTERM after step "
                    f"{target}; exit 42)\n"
                    f"snapshot pause {snap['pause_s'] * 1000:.1f} ms, pack and publish "
                    f"{upload['seconds'] * 1000:.1f} ms, import "
                    f"{import_s * 1000:.1f} ms\n"
                    f"restore point {where}\n"
                    f"final weights and optimizer state bitwise identical to the "
                    f"uninterrupted run: {'yes' if same else 'NO'}\n"
                )
            if not same:
                raise typer.Exit(1)

    run(json_, body)


def _equal_state(a: Any, b: Any, torch: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_equal_state(a[k], b[k], torch) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_equal_state(x, y, torch) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)
