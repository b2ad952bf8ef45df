"""Restore points crafted for the gate and the pickle tests: the demo trainer's identity
(restorepoint.testing.trainer: what its ResumableRun's local view holds), and checkpoint files
that would run code when unpickled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import restorepoint
from restorepoint.format import config_identity
from restorepoint.runtime.detect import torch_terms
from restorepoint.runtime.run import run_id_for
from restorepoint.runtime.state import STATE_FORMAT
from restorepoint.testing.trainer import CONFIG, OPERATIONAL, TRAINER

IDENTITY = config_identity(CONFIG, OPERATIONAL)
RUN = run_id_for(IDENTITY, CONFIG["seed"])


class RunsCode:
    """Unpickled, it runs ``touch MARKER``: what an attacker puts into a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def evil_snapshot(directory: Path, marker: Path, *, name: str = "last.pt") -> Path:
    """A checkpoint directory shaped like a ResumableRun's (last.pt, position.json) whose
    last.pt carries a code-running object beside a plausible state."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "format": STATE_FORMAT,
        "identity": IDENTITY,
        "objects": {"model": RunsCode(marker)},
        "position": {"step": 3, "epoch": 0, "batch": 3},
    }
    torch.save(state, directory / name)
    (directory / "position.json").write_text(json.dumps(state["position"]) + "\n")
    return directory


def demo_head(**changes: Any) -> dict[str, Any]:
    """The pack options that give the demo trainer's head: its trainer, the terms detected
    here, its config and run; ``changes`` replace any of them."""
    head: dict[str, Any] = {
        "trainer": TRAINER,
        "terms": torch_terms(),
        "config": CONFIG,
        "operational_keys": OPERATIONAL,
        "run": RUN,
        "position": restorepoint.Position(3, 0, 3),
    }
    head.update(changes)
    return head


def pack_demo(source: Path, dest: str, **changes: Any) -> restorepoint.PackResult:
    """Pack ``source`` as the demo trainer's restore point (into a store when ``dest`` ends in
    "/")."""
    return restorepoint.pack(source, dest, **demo_head(**changes))


def trainer_command(root: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "restorepoint.testing.trainer", "--root", str(root),
            "--out", str(out), *extra]  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything of restorepoint's, submitit's or the cloud's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RESTOREPOINT_", "SUBMITIT_", "AWS_", "FSSPEC_"))
    }
    return {**env, **extra}


def sigterm_at_step(command: list[str], at_step: int) -> tuple[int, str]:
    """Run ``command`` (a trainer that prints ``step N`` lines), SIGTERM it once it prints
    ``step at_step``, and return its exit code and stderr."""
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.strip() == f"step {at_step}":
                child.send_signal(signal.SIGTERM)
                break
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, err


def preempted_checkpoint(workdir: Path, *, at_step: int = 5) -> Path:
    """A real snapshot of the demo trainer: run it, SIGTERM it at ``at_step``, and return its
    run directory's checkpoints/ (last.pt and position.json, exit 42)."""
    root = workdir / "runs"
    command = trainer_command(root, workdir / "final.pt", "--epochs", "1", "--step-delay", "0.02")
    code, err = sigterm_at_step(command, at_step)
    assert code == 42, err
    return root / RUN / "checkpoints"
