"""The transformers adapter (docs/adapters.md, "Hugging Face Trainer") with a real
transformers.Trainer on the CPU: a 2-layer GPT-2 built from a config (no download), a
synthetic dataset (hf_job.py).

One trained run (12 steps, a checkpoint every 3) is shared by the tests that only resume from
it. Every in-process Trainer run goes through ``trained``/``train``, which put back what the
Trainer changes for the whole process (the RNGs it seeds) and check that the callback left
nothing behind (signal handlers, the store deadline)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import numpy as np
import torch
from clirun import cli
from crafted import RunsCode
from transformers.utils import logging as hf_logging

from restorepoint import IncompatibleRestorePoint, list_store, read_manifest, verify
from restorepoint.adapters.base import Adapter, load_adapter
from restorepoint.adapters.transformers import (
    RestorePointCallback,
    TransformersAdapter,
    resume_checkpoint,
    trainer_config,
)
from restorepoint.adapters.transformers._checkpoint import RECORD
from restorepoint.runtime.contract import READY_ENV, leave_stop_deadline
from restorepoint.storage import _retry
from restorepoint.testing.adapter import AdapterConformance

from .hf_job import Steps, dataset, make_trainer

JOB = Path(__file__).with_name("hf_job.py")
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def workers() -> set[int | None]:
    """The snapshot worker threads alive now (an earlier test's abandoned upload may still
    be finishing on its own: only a new one is the callback's)."""
    return {t.ident for t in threading.enumerate() if t.name == "rp-snapshots"}


class Process:
    """What the Trainer changes for the whole process, put back after: the RNGs it seeds, the
    environment (torch's inductor cache variable), accelerate's process-wide state."""

    def __enter__(self) -> Process:
        self.env = dict(os.environ)
        self.handlers = {s: signal.getsignal(s) for s in HANDLED}
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.threads = torch.get_num_threads()
        self.workers = workers()
        # One intra-op thread whatever an earlier test left (the job script does the same):
        # a sum over another number of threads rounds differently.
        torch.set_num_threads(1)
        self.verbosity = hf_logging.get_verbosity()
        return self

    def __exit__(self, *exc: object) -> None:
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        torch.set_num_threads(self.threads)
        hf_logging.set_verbosity(self.verbosity)
        os.environ.clear()
        os.environ.update(self.env)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)

    def check_left_alone(self) -> None:
        """Nothing of the callback's outlives its run: handlers, worker, store deadline."""
        assert {s: signal.getsignal(s) for s in HANDLED} == self.handlers
        assert _retry._deadline[0] is None
        assert workers() <= self.workers


def train(out: Path, resume: str | None = None, **options: Any) -> tuple[Any, Any]:
    with Process() as process:
        trainer, rp, _ = make_trainer(out, **options)
        trainer.train(resume_from_checkpoint=resume)
        process.check_left_alone()
    assert not list(out.glob(".restorepoint-*")), "a staging directory was left behind"
    return trainer, rp


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, torch.Tensor]]:
    """One run of 12 steps (checkpoints 3, 6, 9, 12, each published into a store on disk):
    its output directory, the store, and its final weights."""
    root = tmp_path_factory.mktemp("trained")
    store = f"{root / 'store'}/"
    trainer, rp = train(root / "out", store=store)
    assert [e["step"] for e in rp.events if e["event"] == "packed"] == [3, 6, 9, 12]
    return root / "out", store, weights(trainer)


def keys_for(out: Path, **options: Any) -> dict[str, Any]:
    with Process():
        return make_trainer(out, **options)[2]


# -- the stop contract, end to end ------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.slow
def test_sigterm_exit_42_and_a_resume_from_s3_is_bit_for_bit(
    tmp_path: Path,
    s3_bucket: str,
    s3_env: dict[str, str],
    s3_storage_options: dict[str, Any],
    trained: tuple[Path, str, dict[str, torch.Tensor]],
) -> None:
    """SIGTERM at a random step: the checkpoint at the next step's end is published to S3 and
    verified, exit 42 with the runtime's stop line; a fresh output directory resumes from the
    store and ends with the weights of the uninterrupted run, bit for bit."""
    at = random.randint(2, 9)
    store = f"s3://{s3_bucket}/runs/"
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(tmp_path / "a"), "--store", store, "--delay", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **s3_env},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == f"step {at}":
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 42, f"SIGTERM at step {at}: {err}"
    stops = [line for line in err.splitlines() if line.startswith("restorepoint: stop")]
    assert len(stops) == 1, err
    step = int(stops[0].split(" at step ")[1].split(":")[0])
    assert at <= step <= at + 1, stops[0]  # the next step boundary
    assert stops[0].startswith(
        f"restorepoint: stop (SIGTERM) at step {step}: checkpoint-{step} published to {store}"
    )
    assert stops[0].endswith("and verified; exiting 42 (resumable)")
    entries = list_store(store, storage_options=s3_storage_options)
    assert entries[0].step == step
    manifest = read_manifest(entries[0].url, storage_options=s3_storage_options)
    assert manifest.trainer is not None and manifest.trainer.name == "transformers"
    assert {"torch", "transformers", "accelerate"} <= set(manifest.terms)
    assert "training_args.bin" not in {e.path for e in manifest.payload or ()}
    assert "args.output_dir" in manifest.operational_keys
    assert manifest.cache_keys == {"dataset": dataset()._fingerprint}

    fresh = tmp_path / "b"
    with Process():
        resume = resume_checkpoint(
            fresh, store, storage_options=s3_storage_options, **keys_for(fresh)
        )
    assert resume == str(fresh / f"checkpoint-{step}")
    assert (fresh / f"checkpoint-{step}" / RECORD).is_file()
    trainer, _ = train(fresh, resume, store=store, storage_options=s3_storage_options)
    resumed = weights(trainer)
    uninterrupted = trained[2]
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_sigusr2_in_process_stops_at_the_next_step(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """SIGUSR1 is a snapshot request: a save at the next step's end, and training goes on.
    SIGUSR2 (the template's forwarded warning) is a stop: at the next step's end the
    checkpoint is saved (no store: said so), ``Stopped`` (exit 42) leaves ``train``, and
    everything the callback installed is put back."""

    class Signal(Steps):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 1:
                os.kill(os.getpid(), signal.SIGUSR1)
            if state.global_step == 4:
                os.kill(os.getpid(), signal.SIGUSR2)

    with Process() as process:
        trainer, rp, _ = make_trainer(tmp_path, callbacks=[Signal()])
        with pytest.raises(SystemExit) as stopped:
            trainer.train()
        process.check_left_alone()
    assert stopped.value.code == 42
    err = capfd.readouterr().err
    assert (
        f"restorepoint: stop (SIGUSR2) at step 5: checkpoint-5 saved in {tmp_path} (no store); "
        "exiting 42 (resumable)"
    ) in err
    assert next(e for e in rp.events if e["event"] == "stopped")["saved"] is True
    # save_steps=3: checkpoint-2 is the snapshot request's, checkpoint-3 a periodic one.
    for step in (2, 3, 5):
        assert (tmp_path / f"checkpoint-{step}" / RECORD).is_file()


def test_a_stop_under_a_supervisor_aims_at_the_supervisors_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Under ``restorepoint run`` the supervisor leaves, before its SIGTERM, the time it waits
    for the restore point; the callback's stop takes it as its store deadline where it is
    sooner than upload_timeout (the stopped event says which), and publishes."""
    ready = tmp_path / "ready"
    ready.mkdir()
    monkeypatch.setenv(READY_ENV, str(ready))
    leave_stop_deadline(ready, time.time() + 30.0)

    class Stop(Steps):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    store = f"{tmp_path / 'store'}/"
    with Process():
        trainer, rp, _ = make_trainer(tmp_path / "out", store=store, callbacks=[Stop()])
        with pytest.raises(SystemExit) as stopped:
            trainer.train()
    assert stopped.value.code == 42
    event = next(e for e in rp.events if e["event"] == "stopped")
    assert event["deadline_from"] == "supervisor" and event["published"] is True
    assert list_store(store)[0].step == 3
    assert "restorepoint: stop (SIGTERM) at step 3" in capfd.readouterr().err


def test_a_stops_checkpoint_is_published_on_every_core_a_periodic_one_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training waits for the stop's publish whole, so it encodes on a thread per core (up to
    the pack's default); a periodic checkpoint's keeps the callback's one thread, which leaves
    the training thread a core."""
    from restorepoint.adapters.transformers import callback as hf_callback
    from restorepoint.ops._threads import default_threads

    threads: list[tuple[int, int | None]] = []
    real = hf_callback.publish

    def recorded(source: Any, dest: Any, head: Any, options: Any, **kw: Any) -> Any:
        threads.append((head.position.step, options.threads))
        return real(source, dest, head, options, **kw)

    monkeypatch.setattr(hf_callback, "publish", recorded)

    made: list[Any] = []

    class Stop(Steps):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 4:
                # checkpoint-3's publish done first: the stop's cannot replace it in the queue.
                assert made[0].wait(60)
                os.kill(os.getpid(), signal.SIGTERM)

    store = f"{tmp_path / 'store'}/"
    with Process():
        trainer, rp, _ = make_trainer(tmp_path / "out", store=store, callbacks=[Stop()])
        made.append(rp)
        with pytest.raises(SystemExit) as stopped:
            trainer.train()
    assert stopped.value.code == 42
    # save_steps=3: checkpoint-3 is a periodic one, checkpoint-5 the stop's.
    assert threads == [(3, 1), (5, default_threads())]
    assert sorted(e.step for e in list_store(store)) == [3, 5]


def test_with_save_strategy_best_a_stop_still_saves(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``save_strategy="best"`` saves only when an evaluation finds a better metric: at a
    stop, that step's evaluation is skipped, so the stop's checkpoint is saved whatever the
    metric would have said (here it never improves)."""

    class Signal(Steps):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 4:
                os.kill(os.getpid(), signal.SIGTERM)

    evaluation = {
        "eval_dataset": dataset(seed=3).select(range(4)),
        "compute_metrics": lambda _: {"score": 0.0},
    }
    with Process() as process:
        trainer, _, _ = make_trainer(
            tmp_path, callbacks=[Signal()], save_strategy="best", eval_strategy="steps",
            eval_steps=1, metric_for_best_model="score", trainer_options=evaluation,
        )  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            trainer.train()
        process.check_left_alone()
    assert stopped.value.code == 42
    assert "at step 5: checkpoint-5 saved in" in capfd.readouterr().err
    assert (tmp_path / "checkpoint-5" / RECORD).is_file()


# -- resume: complete checkpoints only, and the gate ----------------------------------------


def test_a_half_written_checkpoint_is_skipped(
    tmp_path: Path, trained: tuple[Path, str, dict[str, torch.Tensor]]
) -> None:
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    (out / "checkpoint-12" / "optimizer.pt").unlink()  # files removed
    model = out / "checkpoint-9" / "model.safetensors"  # one truncated
    model.write_bytes(model.read_bytes()[:100])
    (out / "checkpoint-15").mkdir()  # killed before its first file was complete
    (out / "checkpoint-15" / "config.json").write_text("{")
    # A record is read as hostile: a path out of the checkpoint is no file of it.
    hostile = json.loads((out / "checkpoint-6" / RECORD).read_text())
    hostile["head"]["position"]["step"] = 18
    hostile["files"] = {"../../etc/passwd\x1b[2J": [1, "0" * 64]}
    (out / "checkpoint-18").mkdir()
    (out / "checkpoint-18" / RECORD).write_text(json.dumps(hostile))
    with pytest.warns(UserWarning, match="skipping checkpoint-") as warned:
        resume = resume_checkpoint(out, **keys_for(out))
    assert resume == str(out / "checkpoint-6")
    said = [str(w.message) for w in warned]
    assert any(s.startswith("skipping checkpoint-15: no restorepoint.json") for s in said), said
    assert "skipping checkpoint-12: optimizer.pt is missing" in said
    assert any(s.startswith("skipping checkpoint-18: restorepoint.json lists a path") for s in said)
    assert not any("\x1b" in s for s in said), said
    assert "skipping checkpoint-9: model.safetensors has 100 bytes" in " ".join(said)
    # The store has newer complete ones: they win over the local checkpoint-6.
    with pytest.warns(UserWarning, match="skipping checkpoint-"):
        resume = resume_checkpoint(out, trained[1], **keys_for(out))
    assert resume == str(out / "checkpoint-12")
    assert json.loads((out / "checkpoint-12" / RECORD).read_text())["url"].endswith(".rp")


def test_a_changed_learning_rate_model_or_dataset_is_refused_naming_each_field(
    tmp_path: Path,
    trained: tuple[Path, str, dict[str, torch.Tensor]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    store = trained[1]
    keys = keys_for(out, lr=1e-3)
    with pytest.raises(SystemExit) as refused:
        resume_checkpoint(out, **keys)
    assert refused.value.code == 3
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith("restorepoint: error: ")
    assert "(config.args.learning_rate)" in err[0]
    assert "Traceback" not in "\n".join(err)
    # From the store too (a fresh directory), and the model and the dataset as well.
    fresh = tmp_path / "fresh"
    keys["model"].config.n_inner = 16
    keys["dataset"] = dataset(seed=2)
    with pytest.raises(IncompatibleRestorePoint) as exc:
        resume_checkpoint(fresh, store, exit_on_refusal=False, **keys)
    fields = {m["field"] for m in exc.value.mismatches}
    assert fields == {"config.args.learning_rate", "config.model.n_inner", "cache_keys.dataset"}
    assert not fresh.exists() or not any(fresh.iterdir())
    # Operational fields change nothing: another output dir, other save and log steps.
    keys = keys_for(out, save_steps=5, logging_steps=7, save_total_limit=1)
    assert resume_checkpoint(out, **keys) == str(out / "checkpoint-12")


def test_a_crafted_pickle_in_optimizer_pt_is_refused(
    tmp_path: Path,
    trained: tuple[Path, str, dict[str, torch.Tensor]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A restore point whose optimizer.pt would run code when loaded (its index matches:
    a hostile store) is refused before the Trainer loads it: one line, exit 1, nothing
    left in the output directory, the code never run."""
    from restorepoint.ops.publish import HeadSpec, publish

    marker = tmp_path / "ran"
    source = tmp_path / "evil"
    shutil.copytree(trained[0] / "checkpoint-12", source)
    (source / RECORD).unlink()
    (source / "training_args.bin").unlink()
    torch.save({"state": {}, "param_groups": [RunsCode(marker)]}, source / "optimizer.pt")
    head = read_manifest(list_store(trained[1])[0].url).head_dict()
    store = f"{tmp_path / 'store'}/"
    spec = HeadSpec(
        position=15, trainer=(head["trainer"]["name"], head["trainer"]["version"]),
        terms=head["terms"], config=head["config"],
        operational_keys=tuple(head["operational_keys"]), cache_keys=head["cache_keys"],
        run=head["run"],
    )  # fmt: skip
    publish(source, store, spec)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:
        resume_checkpoint(out, store, **keys_for(out))
    assert refused.value.code == 1
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert "optimizer.pt" in err[0]
    assert "os.system" in err[0] or "posix.system" in err[0]
    assert not marker.exists()
    assert not out.exists() or not any(out.iterdir())


def test_a_save_during_a_publish_replaces_the_waiting_one_and_nothing_is_left_behind(
    tmp_path: Path,
) -> None:
    """Without ``wait_each`` training never waits for a publish: a checkpoint saved while
    another is being published replaces the one still waiting (the runtime's coalescing). The
    newest is always published, a checkpoint has its record exactly when it was published
    (one never published is not complete, and a resume takes the newest that is), a record
    written late never makes the Trainer's rotation drop the newest checkpoint, and no
    staging directory outlives the run."""
    store = f"{tmp_path / 'store'}/"
    rp = RestorePointCallback(store, run="tiny-gpt2", dataset=dataset(), wait_each=False)
    # 0.1 s a step: the checkpoints' times spread over more than a second, so the Trainer's
    # rotation orders them by their directories' modification times.
    _, rp = train(tmp_path / "out", rp=rp, save_steps=1, save_total_limit=3, delay=0.1)
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert left == ["checkpoint-10", "checkpoint-11", "checkpoint-12"]
    packed = [e["step"] for e in rp.events if e["event"] == "packed"]
    assert packed[-1] == 12
    assert list_store(store)[0].step == 12
    for step in (10, 11, 12):
        assert (tmp_path / "out" / f"checkpoint-{step}" / RECORD).is_file() == (step in packed)


# -- keep-best beside save_total_limit ------------------------------------------------------


@pytest.mark.parametrize("frozen", [False, True])
def test_a_full_fine_tunes_first_restore_point_names_no_chunks(
    tmp_path: Path, frozen: bool
) -> None:
    # The callback tells its rest what the Trainer's optimizer steps (spec 28.4): a full
    # fine-tune (every parameter and AdamW's two moments change at every step) publishes its
    # first restore point, into a store that holds nothing of the run, naming no chunks, and
    # the next rests too; with all but the final layer norm frozen, the first names them.
    from transformers import GPT2Config, GPT2LMHeadModel

    from restorepoint.format.delta import DELTA_FEATURE

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256, n_positions=8, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    net = GPT2LMHeadModel(config)
    if frozen:
        net.requires_grad_(False)
        net.transformer.ln_f.requires_grad_(True)
    store = f"{tmp_path / 'store'}/"
    train(tmp_path / "out", store=store, net=net, max_steps=6, save_steps=3)
    entries = sorted(list_store(store), key=lambda e: e.step)
    assert [e.step for e in entries] == [3, 6]
    first, second = (read_manifest(e.url) for e in entries)
    assert (DELTA_FEATURE in first.required_features) is frozen
    if frozen:
        assert [b.name for b in second.bases or ()] == [entries[0].name]
    else:
        assert DELTA_FEATURE not in second.required_features


def test_keep_best_keeps_the_best_that_save_total_limit_rotates_away(tmp_path: Path) -> None:
    """save_total_limit=1 keeps the newest checkpoint on the disk; keep_last=1 with
    keep_best=1 keeps the newest and the best in the store, the best's metric in its head."""
    scores = iter([0.2, 0.9, 0.4, 0.3])
    store = f"{tmp_path / 'store'}/"
    handoff = tmp_path / "handoff.json"
    rp = RestorePointCallback(
        store, keep_last=1, keep_best=1, metric="eval_score", mode="max", dataset=dataset(),
        handoff=handoff,
    )  # fmt: skip
    evaluation = {
        "eval_dataset": dataset(seed=3).select(range(4)),
        "compute_metrics": lambda _: {"score": next(scores)},
    }
    train(
        tmp_path / "out", rp=rp, save_total_limit=1, eval_strategy="steps", eval_steps=3,
        trainer_options=evaluation,
    )  # fmt: skip
    local = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("check"))
    assert local == ["checkpoint-12"]
    entries = list_store(store)
    assert sorted(e.step for e in entries) == [6, 12]
    best = next(e for e in entries if e.step == 6)
    assert read_manifest(best.url).metrics == {"eval_score": 0.9}
    verify(best.url)
    # The handoff of the newest publish, which a resuming machine checks against.
    newest = next(e for e in entries if e.step == 12)
    assert json.loads(handoff.read_text())["id"] == read_manifest(newest.url).id
    assert cli("check", newest.url, "--expect", str(handoff)).returncode == 0


# -- the CLI: the adapter's local view gates as for other adapters -------------------------


def test_the_cli_gates_with_the_adapters_local_view(
    tmp_path: Path, trained: tuple[Path, str, dict[str, torch.Tensor]]
) -> None:
    keys = keys_for(tmp_path / "elsewhere")
    config = tmp_path / "args.json"
    config.write_text(json.dumps(trainer_config(keys["args"], keys["model"])))
    fingerprint = keys["dataset"]._fingerprint
    url = list_store(trained[1])[0].url
    view = cli("local-view", "--adapter", "transformers", "--config", str(config), "--json")
    assert view.returncode == 0, view.stderr
    fields = {f["field"]: f for f in json.loads(view.stdout)["views"][0]}
    assert fields["trainer"]["value"].startswith("transformers=")
    assert "args.output_dir" in fields["config_identity"]["operational_keys"]
    gate = ["--adapter", "transformers", "--config", str(config), "--key", f"dataset={fingerprint}"]
    assert cli("check", url, *gate).returncode == 0
    imported = cli("import", url, str(tmp_path / "imported"), "--check-keys", *gate)
    assert imported.returncode == 0, imported.stderr
    assert (tmp_path / "imported" / "trainer_state.json").is_file()
    changed = json.loads(config.read_text())
    changed["args"]["learning_rate"] = 1e-3
    config.write_text(json.dumps(changed))
    refused = cli("check", url, *gate)
    assert refused.returncode == 3
    assert "config.args.learning_rate" in refused.stderr
    adapter = TransformersAdapter()
    snapshot = adapter.newest_snapshot(trained[0])
    assert snapshot is not None
    assert snapshot.step == 12
    # The CLI's adapter never imports transformers itself (seconds): the package metadata
    # gives its version.
    probe = (
        "import sys; from restorepoint.adapters.base import load_adapter; "
        "load_adapter('transformers').local_view({}); print('transformers' in sys.modules)"
    )
    lazy = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert lazy.stdout.strip() == "False", lazy.stderr


@pytest.mark.slow
def test_restorepoint_run_auto_resume_hands_over_and_a_changed_lr_is_exit_3(
    tmp_path: Path, trained: tuple[Path, str, dict[str, torch.Tensor]]
) -> None:
    """Under ``restorepoint run --adapter transformers --auto-resume`` the supervisor imports
    the run's newest restore point and hands it over; the job gates it with its own view: a
    changed learning rate is exit 3 (the field named, nothing trained), the same config
    resumes from it (step 12 of 12: nothing left to train) and completes."""
    store = f"{tmp_path / 'store'}/"
    shutil.copytree(trained[1], store)
    supervise = [
        sys.executable, "-m", "restorepoint", "run", "--store", store, "--adapter",
        "transformers", "--auto-resume", "--run", "tiny-gpt2", "--",
        sys.executable, str(JOB),
    ]  # fmt: skip
    refused = subprocess.run(
        [*supervise, str(tmp_path / "a"), "--lr", "1e-3"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert "config.args.learning_rate" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert "step 1" not in refused.stdout.splitlines()
    resumed = subprocess.run(
        [*supervise, str(tmp_path / "b")], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resume {tmp_path / 'b' / 'checkpoint-12'}" in resumed.stdout.splitlines()
    assert (tmp_path / "b" / "checkpoint-12" / RECORD).is_file()


class TestTransformersAdapter(AdapterConformance):
    """The adapter conformance suite, on checkpoints a real Trainer saved."""

    @pytest.fixture
    def adapter(self) -> Adapter:
        return load_adapter("transformers")

    @pytest.fixture
    def produced(self, trained: tuple[Path, str, dict[str, torch.Tensor]]) -> Path:
        return trained[0]

    @pytest.fixture
    def expected_step(self) -> int:
        return 12
