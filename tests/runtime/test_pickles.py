"""No pickle from a restore point runs code or takes the machine's memory, on every resume
path (spec section 24): the runtime's own snapshots hold no pickle (tests/runtime/
test_snapshot_file.py); an older snapshot or a Lightning checkpoint made with
``torch.save({"objects": RunsCode()})``, or shaped by hand to slip through a weights-only load
(tests/runtime/_hostile.py), is refused with UnsafeCheckpoint before anything of it is built:
in process through the legacy loader, Lightning's resume and a multi-rank shared file (each
shape, with the peak RSS under the scan's cap), and once each through the CLI (the runtime's
store resume, ``run --resume-from``, ``run --auto-resume``, ``import --exec``); the command it
carries never runs (its marker file is never created); training never starts. A trust policy
refuses unsigned restore points on the same paths, and a legitimate resume still works."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from clirun import cli
from crafted import (
    CONFIG,
    IDENTITY,
    RUN,
    RunsCode,
    clean_env,
    evil_snapshot,
    pack_demo,
    preempted_checkpoint,
    trainer_command,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import restorepoint
from restorepoint import IntegrityError, UnsafeCheckpoint
from restorepoint.runtime.safe_load import (
    LEGACY_GLOBALS,
    MAX_PICKLE_ALLOCATION,
    check_loadable,
    safe_load,
    weights_only_loads,
)
from restorepoint.runtime.state import STATE_FORMAT, save_state
from restorepoint.torch import load_snapshot

from . import _hostile


@pytest.fixture(scope="module")
def legit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real snapshot of the demo trainer at step 5."""
    return preempted_checkpoint(tmp_path_factory.mktemp("legit"))


def test_safe_load_refuses_a_code_running_pickle_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"objects": RunsCode(marker)}, path)
    with pytest.raises(UnsafeCheckpoint) as info:
        safe_load(path)
    assert "posix.system" in str(info.value)
    assert info.value.exit_code == 1
    with pytest.raises(UnsafeCheckpoint):
        check_loadable(path)
    assert not marker.exists()


@pytest.mark.parametrize("user_said", [None, "1"])
def test_inside_weights_only_loads_no_torch_load_runs_code_whatever_it_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_said: str | None
) -> None:
    """For a library that loads pickles its own way (Accelerate's ``weights_only=False``):
    inside the block every torch.load is weights-only, tensors and plain data still load, and
    the environment is as it was afterwards, a user's TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    included."""
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    if user_said is None:
        monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    else:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", user_said)
    before = dict(os.environ)
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"state": RunsCode(marker)}, evil)
    fine = tmp_path / "fine.pt"
    torch.save({"w": torch.arange(4.0), "step": [3, "ok"]}, fine)
    with weights_only_loads():
        with pytest.raises(pickle.UnpicklingError):
            torch.load(evil, weights_only=False)
        loaded = torch.load(fine, weights_only=False)
    assert not marker.exists()
    assert torch.equal(loaded["w"], torch.arange(4.0))
    assert loaded["step"] == [3, "ok"]
    assert dict(os.environ) == before


def test_safe_load_takes_what_the_runtime_saves(tmp_path: Path) -> None:
    """The allowlist: tensors, plain data, and numpy's RNG state; nothing else is needed."""
    state = {
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        "numpy": np.random.get_state(),
        "position": {"step": 1, "epoch": 0, "batch": 1},
        "objects": {"model": torch.nn.Linear(2, 2).state_dict()},
    }
    path = tmp_path / "ok.pt"
    torch.save(state, path)
    loaded = safe_load(path)
    np.random.set_state(loaded["numpy"])
    random.setstate(loaded["rng"]["python"])
    assert loaded["position"] == state["position"]


def test_an_object_array_is_not_on_the_allowlist(tmp_path: Path) -> None:
    path = tmp_path / "objects.pt"
    torch.save({"a": np.array([1, "x"], dtype=object)}, path)
    with pytest.raises(UnsafeCheckpoint):
        safe_load(path)


# -- the hostile shapes, in process ---------------------------------------------------------


def _legacy(path: Path, make: Callable[[Path], Path], marker: Path) -> None:
    """An older snapshot, read as a resume reads it (the public one-call loader too)."""
    make(path / "last.pt")
    with pytest.raises(UnsafeCheckpoint):
        safe_load(path / "last.pt")
    load_snapshot(path / "last.pt")


def _lightning(path: Path, make: Callable[[Path], Path], marker: Path) -> None:
    from restorepoint.adapters.lightning import LAST, resume_checkpoint

    make(path / LAST)
    resume_checkpoint(path)


def _multi_rank(path: Path, make: Callable[[Path], Path], marker: Path) -> None:
    """A sound rank file (snapshot format) naming a shared file that is a hostile pickle."""
    shared = "shared-0123456789abcdef.pt"
    make(path / shared)
    state = {"format": STATE_FORMAT, "identity": IDENTITY, "objects": {}, "position": {},
             "run": RUN, "shared": {"file": shared, "objects": ["model"]}}  # fmt: skip
    save_state(state, path / "last.rank1.pt", path)
    load_snapshot(path / "last.rank1.pt")


def _runs_code(marker: Path) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        torch.save({"objects": RunsCode(marker)}, path)
        return path

    return make


@pytest.mark.parametrize("load", [_legacy, _lightning, _multi_rank])
@pytest.mark.parametrize("shape", [*_hostile.SHAPES, "runs-code"])
def test_each_hostile_shape_is_refused_before_anything_is_built(
    tmp_path: Path, shape: str, load: Callable[[Path, Callable[[Path], Path], Path], None]
) -> None:
    marker = tmp_path / "ran"
    make = _runs_code(marker) if shape == "runs-code" else _hostile.shape(shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(UnsafeCheckpoint) as info:
        load(tmp_path, make, marker)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < MAX_PICKLE_ALLOCATION
    assert info.value.exit_code == 1
    assert "\n" not in str(info.value)
    assert not marker.exists()


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
    st.sampled_from(["u4", "O", "latin1", "cpu", "storage", "<", "|"]),
)  # fmt: skip
_ARGS = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple)),
    max_leaves=10,
).map(lambda v: v if isinstance(v, tuple) else (v,))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(LEGACY_GLOBALS), args=_ARGS, state=st.none() | _ARGS)
def test_fuzzed_arguments_of_every_admitted_global_never_get_past_the_checks(
    tmp_path_factory: pytest.TempPathFactory, name: str, args: tuple[object, ...],
    state: tuple[object, ...] | None,
) -> None:  # fmt: skip
    """Whatever arguments (and BUILD state) a checkpoint gives an admitted global, the load
    refuses it (UnsafeCheckpoint, IntegrityError) or returns plain data; never another error,
    never more memory than the cap."""
    module, _, attr = name.rpartition(".")
    body = _hostile.glob(module, attr) + _hostile.value(args) + _hostile.REDUCE
    if state is not None:
        # The state's memo indices repeat the arguments': each GET names its own PUT.
        body += _hostile.value(state) + _hostile.BUILD
    path = tmp_path_factory.mktemp("fuzz") / "f.pt"
    _hostile.write(path, _hostile.pickle_of(body))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        loaded = safe_load(path)
    except (UnsafeCheckpoint, IntegrityError):
        pass
    else:
        assert isinstance(loaded, dict)
    assert (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < MAX_PICKLE_ALLOCATION
    )


def test_garbage_is_an_integrity_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(restorepoint.IntegrityError):
        safe_load(path)
    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    path.write_bytes(buffer.getvalue()[:40])
    with pytest.raises(restorepoint.IntegrityError):
        safe_load(path)


# -- every resume path ----------------------------------------------------------------------


def evil_store(tmp_path: Path, marker: Path, shape: str | None = None) -> tuple[str, str]:
    """A store whose only restore point of the demo run holds a code-running last.pt (or one
    of the hostile ``shape``), packed with the demo trainer's own trainer, terms, config and
    run: only the pickle is hostile."""
    store = f"{tmp_path / 'store'}/"
    source = evil_snapshot(tmp_path / "evil", marker)
    if shape is not None:
        _hostile.shape(shape)(source / "last.pt")
    result = pack_demo(source, store)
    return store, result.url


def test_the_runtime_store_resume_refuses_it(tmp_path: Path) -> None:
    marker, started = tmp_path / "ran", tmp_path / "started"
    store, _ = evil_store(tmp_path, marker)
    proc = subprocess.run(
        trainer_command(tmp_path / "runs", tmp_path / "out.pt", "--store", store,
                        "--marker", str(started), "--quiet"),
        capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "UnsafeCheckpoint" in proc.stderr
    assert "posix.system" in proc.stderr
    assert not marker.exists()
    assert not started.exists()


def test_a_supervisors_import_is_refused_before_training(tmp_path: Path) -> None:
    marker, started = tmp_path / "ran", tmp_path / "started"
    _, url = evil_store(tmp_path, marker)
    proc = cli(
        "run", "--store", f"{tmp_path / 'other'}/", "--resume-from", url, "--",
        *trainer_command(tmp_path / "runs", tmp_path / "out.pt", "--marker", str(started)),
        env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    refused = [line for line in proc.stderr.splitlines() if line.startswith("restorepoint: error")]
    assert len(refused) == 1 and "refused to load: it asks for posix.system" in refused[0]
    assert not marker.exists()
    assert not started.exists()


def test_auto_resume_refuses_a_bytearray_bomb_before_training(tmp_path: Path) -> None:
    marker, started = tmp_path / "ran", tmp_path / "started"
    store, _ = evil_store(tmp_path, marker, "bytearray-bomb")
    proc = cli(
        "run", "--store", store, "--auto-resume", "--run", RUN, "--",
        *trainer_command(tmp_path / "runs", tmp_path / "out.pt", "--marker", str(started)),
        env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    refused = [line for line in proc.stderr.splitlines() if line.startswith("restorepoint: error")]
    assert len(refused) == 1 and "builtins.bytearray" in refused[0], proc.stderr
    assert not started.exists()


def test_import_exec_refuses_it_before_training(tmp_path: Path) -> None:
    marker, started = tmp_path / "ran", tmp_path / "started"
    _, url = evil_store(tmp_path, marker, "uint32-object-field")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    runs = tmp_path / "runs"
    # Unpacked as the run directory's checkpoints/, the trainer resumes by itself from there.
    proc = cli(
        "import", url, str(runs / RUN / "checkpoints"), "--adapter", "torch", "--exec",
        "--trainer", "restorepoint-demo-mlp=1", "--config", str(config), "--",
        *trainer_command(runs, tmp_path / "out.pt", "--marker", str(started)),
        env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    # The trainer's one line (UnsafeCheckpoint, exit 1), no traceback.
    (line,) = proc.stderr.splitlines()
    assert "refused to load" in line and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not started.exists()


def test_lightning_resume_refuses_it_from_the_store_and_from_last_ckpt(tmp_path: Path) -> None:
    from restorepoint.adapters.lightning import LAST, _trainer_info, resume_checkpoint

    marker = tmp_path / "ran"
    source = tmp_path / "evil"
    source.mkdir()
    torch.save({"state_dict": {}, "callbacks": RunsCode(marker)}, source / LAST)
    info = _trainer_info()
    store = f"{tmp_path / 'store'}/"
    restorepoint.pack(
        source, store, position=4, trainer=(info.name, info.version), terms=dict(info.terms),
        run="lit-run",
    )  # fmt: skip
    ckpts = tmp_path / "ckpts"
    with pytest.raises(UnsafeCheckpoint):
        resume_checkpoint(ckpts, store=store, run="lit-run")
    assert not marker.exists()
    assert not (ckpts / LAST).exists()  # never given the name a requeued job resumes from
    ckpts.mkdir(exist_ok=True)
    (ckpts / LAST).write_bytes((source / LAST).read_bytes())
    with pytest.raises(UnsafeCheckpoint):
        resume_checkpoint(ckpts)
    assert not marker.exists()


# -- the trust policy -----------------------------------------------------------------------


def test_a_fleet_trust_policy_refuses_unsigned_restore_points_on_resume(
    tmp_path: Path, legit: Path
) -> None:
    assert cli("keygen", str(tmp_path / "signer")).returncode == 0
    unsigned, signed = f"{tmp_path / 'unsigned'}/", f"{tmp_path / 'signed'}/"
    step = json.loads((legit / "position.json").read_text())["step"]
    at = restorepoint.Position(step, 0, step)
    pack_demo(legit, unsigned, position=at)
    key = restorepoint.trust.load_signing_key(tmp_path / "signer")
    pack_demo(legit, signed, position=at, sign=[key])
    fleet = clean_env(RESTOREPOINT_TRUST=str(tmp_path / "signer.pub"))

    def resume(store: str, tag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            trainer_command(tmp_path / f"runs-{tag}", tmp_path / f"out-{tag}.pt", "--store",
                            store, "--marker", str(tmp_path / f"started-{tag}"), "--quiet",
                            "--epochs", "1"),
            capture_output=True, text=True, timeout=120, env=fleet, check=False,
        )  # fmt: skip

    refused = resume(unsigned, "unsigned")
    assert refused.returncode == 1
    assert "SignatureError" in refused.stderr
    assert not (tmp_path / "started-unsigned").exists()
    done = resume(signed, "signed")
    assert done.returncode == 0, done.stderr
    assert f"resumed from checkpoint: global step {step}" in done.stderr
    assert (tmp_path / "started-signed").read_text() == f"training from step {step}\n"


def test_run_trust_options_refuse_an_unsigned_resume(tmp_path: Path, legit: Path) -> None:
    assert cli("keygen", str(tmp_path / "signer")).returncode == 0
    step = json.loads((legit / "position.json").read_text())["step"]
    at = restorepoint.Position(step, 0, step)
    result = pack_demo(legit, f"{tmp_path / 'store'}/", position=at)
    started = tmp_path / "started"
    proc = cli(
        "run", "--store", f"{tmp_path / 'out'}/", "--resume-from", result.url,
        "--trust", str(tmp_path / "signer.pub"), "--require-signature", "--",
        *trainer_command(tmp_path / "runs", tmp_path / "out.pt", "--marker", str(started)),
        env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 1
    assert "SignatureError" not in proc.stderr or "Traceback" not in proc.stderr
    assert "signature" in proc.stderr.splitlines()[-1]
    assert not started.exists()
