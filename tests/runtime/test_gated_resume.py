"""Every resume is gated by what this machine is (spec section 16, the strict rule), on the
runtime's paths with a real ResumableRun trainer process (restorepoint.testing.trainer): its
store resume, and a supervisor's ``run --resume-from`` / ``--auto-resume``.

One real snapshot of the demo trainer is packed again with one field changed at a time (the
trainer's version, the torch term, a CUDA term, the cache root, the cache keys of its data,
the config's learning rate); each is refused with every mismatch listed and the trainer never
trains (its marker file is never written); the unchanged one resumes to the uninterrupted
run's final state, bit for bit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from clirun import cli
from crafted import (
    CONFIG,
    OPERATIONAL,
    RUN,
    clean_env,
    pack_demo,
    preempted_checkpoint,
    trainer_command,
)

import restorepoint
from restorepoint.format import config_identity
from restorepoint.ops.local_view import data_digest
from restorepoint.runtime.detect import torch_terms
from restorepoint.runtime.run import run_id_for


@pytest.fixture(scope="module")
def legit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, restorepoint.Position]:
    """A real snapshot of the demo trainer (one epoch), and its position."""
    checkpoints = preempted_checkpoint(tmp_path_factory.mktemp("legit"))
    pos = json.loads((checkpoints / "position.json").read_text())
    return checkpoints, restorepoint.Position(pos["step"], pos["epoch"], pos["batch"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted one-epoch run's final state."""
    work = tmp_path_factory.mktemp("reference")
    done = subprocess.run(
        trainer_command(work / "runs", work / "final.pt", "--epochs", "1", "--quiet"),
        capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(torch.load(work / "final.pt", weights_only=True))


def same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def trainer(work: Path, *extra: str) -> list[str]:
    return trainer_command(
        work / "runs", work / "final.pt", "--epochs", "1", "--quiet",
        "--marker", str(work / "started"), *extra,
    )  # fmt: skip


def run_trainer(work: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        trainer(work, *extra), capture_output=True, text=True, timeout=120,
        env=env or clean_env(), check=False,
    )  # fmt: skip


#: One field changed at a time, with the mismatch fields the gate must list.
VARIANTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "trainer-version": ({"trainer": ("restorepoint-demo-mlp", "2")}, ["trainer"]),
    "torch-term": ({"terms": {**torch_terms(), "torch": "1.0.0"}}, ["terms.torch"]),
    "cuda-term": ({"terms": {**torch_terms(), "cuda": "9.0"}}, ["terms.cuda"]),
    "cache-root": ({"cache_root": "/elsewhere/cache"}, ["cache_root"]),
    "all-four": (
        {
            "trainer": ("othertrainer", "0.1"),
            "terms": {"torch": "1.0.0", "cuda": "9.0"},
            "cache_root": "/elsewhere/cache",
        },
        ["trainer", "terms.cuda", "terms.torch", "cache_root"],
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_store_resume_refuses_a_restore_point_of_another_machine(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position], variant: str
) -> None:
    changes, fields = VARIANTS[variant]
    checkpoints, at = legit
    store = f"{tmp_path / 'store'}/"
    pack_demo(checkpoints, store, position=at, **changes)
    proc = run_trainer(tmp_path, "--store", store)
    assert proc.returncode == 1, proc.stderr
    assert "IncompatibleRestorePoint" in proc.stderr
    for field in fields:
        assert field in proc.stderr
    assert not (tmp_path / "started").exists()


def test_the_store_resume_with_everything_matching_is_bitwise_equal(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position], reference: dict[str, Any]
) -> None:
    checkpoints, at = legit
    store = f"{tmp_path / 'store'}/"
    pack_demo(checkpoints, store, position=at)
    proc = run_trainer(tmp_path, "--store", store)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from checkpoint: global step {at.step}" in proc.stderr
    assert (tmp_path / "started").read_text() == f"training from step {at.step}\n"
    assert same_state(dict(torch.load(tmp_path / "final.pt", weights_only=True)), reference)


def test_a_changed_input_file_changes_the_cache_key_and_is_refused(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position], reference: dict[str, Any]
) -> None:
    checkpoints, at = legit
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    for i in range(3):
        (data / "images" / f"{i}.png").write_bytes(bytes([i]) * 100)
    store = f"{tmp_path / 'store'}/"
    pack_demo(checkpoints, store, position=at, cache_keys={"data": data_digest(data)})
    same = run_trainer(tmp_path / "same", "--store", store, "--data", str(data))
    assert same.returncode == 0, same.stderr
    assert same_state(
        dict(torch.load(tmp_path / "same" / "final.pt", weights_only=True)), reference
    )
    (data / "images" / "1.png").write_bytes(b"another image")
    changed = run_trainer(tmp_path / "changed", "--store", store, "--data", str(data))
    assert changed.returncode == 1
    assert "cache_keys.data" in changed.stderr
    assert not (tmp_path / "changed" / "started").exists()


def test_a_changed_learning_rate_is_refused_by_name(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    """Another learning rate is another identity, so another run: a restore point of the old
    config put under the new run's name is refused by the config, key by key."""
    checkpoints, at = legit
    changed = json.loads(json.dumps(CONFIG))
    changed["optimizer"]["lr"] = 0.02
    new_run = run_id_for(config_identity(changed, OPERATIONAL), changed["seed"])
    assert new_run != RUN
    store = f"{tmp_path / 'store'}/"
    pack_demo(checkpoints, store, position=at, run=new_run)
    proc = run_trainer(tmp_path, "--store", store, "--lr", "0.02")
    assert proc.returncode == 1
    assert "config.optimizer.lr: here 0.02" in proc.stderr
    assert not (tmp_path / "started").exists()


def test_the_newest_refused_names_the_older_that_would_pass_and_accept_older_takes_it(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    checkpoints, at = legit
    store = f"{tmp_path / 'store'}/"
    pack_demo(checkpoints, store, position=at)
    newer = restorepoint.Position(at.step + 3, at.epoch, (at.batch or 0) + 3)
    pack_demo(checkpoints, store, position=newer, terms={**torch_terms(), "cuda": "9.0"})
    refused = run_trainer(tmp_path / "a", "--store", store)
    assert refused.returncode == 1
    assert f"older restore points of run {RUN} that would pass here: step {at.step}" in (
        refused.stderr
    )
    assert not (tmp_path / "a" / "started").exists()
    taken = run_trainer(tmp_path / "b", "--store", store, "--accept-older")
    assert taken.returncode == 0, taken.stderr
    assert (tmp_path / "b" / "started").read_text() == f"training from step {at.step}\n"


# -- the supervisor ----------------------------------------------------------------------------


def supervise(tmp_path: Path, *options: str, trainer_args: tuple[str, ...] = ()) -> Any:
    telemetry = tmp_path / "telemetry.jsonl"
    return cli(
        "run", "--store", f"{tmp_path / 'published'}/", "--telemetry", str(telemetry),
        *options, "--", *trainer(tmp_path, *trainer_args),
        env=clean_env(),
    )  # fmt: skip


def refusals(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "telemetry.jsonl"
    docs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [d for d in docs if d["event"] == "resume_refused"]


def test_run_resume_from_a_foreign_restore_point_is_refused_before_the_trainer_starts(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    checkpoints, at = legit
    foreign = pack_demo(
        checkpoints, str(tmp_path / "foreign.rp"), position=at,
        trainer=("othertrainer", "0.1"), terms={"torch": "1.0.0", "cuda": "9.0"},
    )  # fmt: skip
    proc = supervise(tmp_path, "--resume-from", foreign.url)
    assert proc.returncode == 3, proc.stderr
    details = [ln for ln in proc.stderr.splitlines() if ln.startswith("restorepoint:   ")]
    assert [ln.split(":")[1].strip() for ln in details] == ["terms.cuda", "terms.torch"]
    assert "here (absent) (detected: torch and CUDA versions), in the restore point 9.0" in (
        proc.stderr
    )
    # Never started: no run directory, no marker.
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "started").exists()
    (refusal,) = refusals(tmp_path)
    assert refusal["fields"] == "terms.cuda,terms.torch"


def test_run_resume_from_another_config_is_refused_by_the_trainer_with_exit_3(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    """The supervisor cannot know a ResumableRun's config: the trainer compares it, before it
    trains, and ends with exit 3 (which nothing requeues)."""
    checkpoints, at = legit
    rp = pack_demo(checkpoints, str(tmp_path / "rp.rp"), position=at)
    proc = supervise(tmp_path, "--resume-from", rp.url, trainer_args=("--lr", "0.02"))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "config.optimizer.lr: here 0.02 (ResumableRun(config)), in the restore point 0.01" in (
        proc.stderr
    )
    assert not (tmp_path / "started").exists()
    (refusal,) = refusals(tmp_path)
    assert refusal["fields"] == "config.optimizer.lr"
    # The refusal names the restore point by its URL, not the supervisor's private import.
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("restorepoint: error:")]
    assert rp.url in line and "restorepoint-ready-" not in proc.stderr


def test_run_resume_from_is_applied_whatever_auto_resume_says(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position], reference: dict[str, Any]
) -> None:
    """auto_resume=False governs finding the newest; an import handed over is applied."""
    checkpoints, at = legit
    rp = pack_demo(checkpoints, str(tmp_path / "rp.rp"), position=at)
    proc = supervise(tmp_path, "--resume-from", rp.url, trainer_args=("--no-auto-resume",))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "started").read_text() == f"training from step {at.step}\n"
    run_dir = tmp_path / "runs" / RUN
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (resumed,) = [e for e in events if e["event"] == "resumed"]
    assert (resumed["step"], resumed["source"]) == (at.step, "supervisor import")
    status = json.loads((run_dir / "run_status.json").read_text())
    # The snapshot's resubmit count came with it (the demo's snapshot was preempted once).
    assert status["status"] == "completed" and status["resubmit_count"] >= 1
    assert same_state(dict(torch.load(tmp_path / "final.pt", weights_only=True)), reference)


def test_a_run_directory_of_another_config_is_exit_3_with_one_line(tmp_path: Path) -> None:
    """A run directory that holds another config's run (here: another learning rate's,
    planted under this run's id), under restorepoint run and alone: exit 3, the refusal and
    its differences on stderr, no traceback, the directory untouched."""
    other = tmp_path / "other"
    done = run_trainer(other, "--lr", "0.02")
    assert done.returncode == 0, done.stderr
    (planted,) = (other / "runs").iterdir()
    target = tmp_path / "runs" / RUN
    target.parent.mkdir()
    planted.rename(target)
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    for proc in (supervise(tmp_path), run_trainer(tmp_path)):
        assert proc.returncode == 3, proc.stderr
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.splitlines()
        errors = [ln for ln in lines if ln.startswith("restorepoint: error:")]
        assert len(errors) == 1 and "refusing to attach" in errors[0], proc.stderr
        assert "optimizer.lr: expected 0.01, found 0.02" in proc.stderr
        assert not (tmp_path / "started").exists()
        assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before


def test_run_resume_from_a_matching_restore_point_resumes_bitwise_equal(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position], reference: dict[str, Any]
) -> None:
    checkpoints, at = legit
    rp = pack_demo(checkpoints, str(tmp_path / "rp.rp"), position=at)
    proc = supervise(tmp_path, "--resume-from", rp.url)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "started").read_text() == f"training from step {at.step}\n"
    assert same_state(dict(torch.load(tmp_path / "final.pt", weights_only=True)), reference)


def test_run_auto_resume_refuses_the_newest_and_accept_older_resumes_the_older(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    checkpoints, at = legit
    store = f"{tmp_path / 'published'}/"
    pack_demo(checkpoints, store, position=at)
    newer = restorepoint.Position(at.step + 2, at.epoch, (at.batch or 0) + 2)
    pack_demo(checkpoints, store, position=newer, terms={**torch_terms(), "torch": "1.0.0"})
    refused = supervise(tmp_path / "a", "--store", store, "--auto-resume", "--run", RUN)
    assert refused.returncode == 3
    assert "that would pass here: step" in refused.stderr
    assert not (tmp_path / "a" / "started").exists()
    taken = supervise(
        tmp_path / "b", "--store", store, "--auto-resume", "--run", RUN, "--accept-older"
    )
    assert taken.returncode == 0, taken.stderr
    assert (tmp_path / "b" / "started").read_text() == f"training from step {at.step}\n"


def test_run_no_gate_needs_force_and_warns(
    tmp_path: Path, legit: tuple[Path, restorepoint.Position]
) -> None:
    checkpoints, at = legit
    rp = pack_demo(checkpoints, str(tmp_path / "rp.rp"), position=at)
    proc = supervise(tmp_path, "--resume-from", rp.url, "--no-gate")
    assert proc.returncode == 2
    assert "add --force" in proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = supervise(tmp_path, "--resume-from", rp.url, "--no-gate", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "warning: --no-gate --force: the resume is not gated" in proc.stderr
