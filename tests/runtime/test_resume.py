"""Resume equivalence: a run preempted at any step and resumed in fresh objects ends bit for bit
where an uninterrupted run ends, having fed the model the same samples in the same order and
drawn the same random numbers.

The preemption steps are drawn with a seed (RESTOREPOINT_TEST_SEED, printed), always with the
first and last step and both sides of an epoch boundary among them."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from restorepoint.format import Position  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402

SEED = int(os.environ.get("RESTOREPOINT_TEST_SEED", "20260611"))
PER_EPOCH = tv.steps_per_epoch()
TOTAL = tv.total_steps()


def preemption_steps() -> list[int]:
    fixed = {1, PER_EPOCH, PER_EPOCH + 1, TOTAL}
    rng = random.Random(SEED)
    others = rng.sample(sorted(set(range(2, TOTAL)) - fixed), 10 - len(fixed))
    return sorted(fixed | set(others))


STEPS = preemption_steps()
print(f"preemption steps {STEPS} (RESTOREPOINT_TEST_SEED={SEED})")
# Every other case stops with a real SIGTERM, and every other pair resumes on "another
# machine": the run directory deleted, the state imported from the store.
CASES = [
    (step, "signal" if i % 2 else "request", "store" if (i // 2) % 2 else "run dir")
    for i, step in enumerate(STEPS)
]


def expected_position(step: int) -> Position:
    """Where a run preempted after committing ``step`` resumes: the epoch it was in, with its
    committed batches counted (an epoch's last batch leaves the epoch-end work still to do)."""
    epoch = (step - 1) // PER_EPOCH
    return Position(step, epoch, step - epoch * PER_EPOCH)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tv.Outcome:
    out = tv.train(tmp_path_factory.mktemp("reference"))
    assert out.code == 0 and out.state is not None
    return out


def test_reference_run_shuffles_every_epoch_and_sees_each_sample_once(
    reference: tv.Outcome,
) -> None:
    n = tv.CONFIG["data"]["samples"]
    epochs = [reference.seen[i * n : (i + 1) * n] for i in range(tv.CONFIG["epochs"])]
    assert len(reference.seen) == n * tv.CONFIG["epochs"]
    for order in epochs:
        assert sorted(order) == list(range(n))
    assert len({tuple(order) for order in epochs}) == len(epochs)
    assert epochs[0] != list(range(n))
    assert len(reference.draws) == TOTAL
    assert reference.run is not None and reference.run.step == TOTAL


def test_cases_cover_the_edges() -> None:
    assert {1, PER_EPOCH, PER_EPOCH + 1, TOTAL} <= set(STEPS)
    assert len(STEPS) == 10
    assert {how for _, how, _ in CASES} == {"signal", "request"}
    assert {via for _, _, via in CASES} == {"store", "run dir"}


@pytest.mark.parametrize(("step", "how", "via"), CASES, ids=[f"{s}-{h}-{v}" for s, h, v in CASES])
def test_preempted_and_resumed_equals_uninterrupted(
    tmp_path: Path, reference: tv.Outcome, step: int, how: str, via: str
) -> None:
    print(f"RESTOREPOINT_TEST_SEED={SEED} picked the preemption steps {STEPS}")
    root = tmp_path / "runs"
    store = f"{tmp_path / 'store'}/" if via == "store" else None
    # Periodic snapshots in the store case: the newest restore point must win, and snapshots
    # must not disturb training.
    config = tv.config_with(**{"train.snapshot_every": 4 if store else 0})
    first = tv.train(root, config=config, store=store, stop_at=step, stop_how=how)
    assert first.code == 42, f"seed {SEED}"
    assert first.run is not None and first.state is None
    assert first.run.position == expected_position(step)
    run_dir = first.run.run_dir
    assert (run_dir / "checkpoints" / "last.pt").exists()
    if store:
        shutil.rmtree(run_dir)

    second = tv.train(root, config=config, store=store)
    assert second.code == 0
    assert second.run is not None and second.run.run_dir == run_dir
    assert second.position == expected_position(step)
    assert second.run.resumed_from == expected_position(step)
    resumed = [e for e in tv.events(run_dir) if e["event"] == "resumed"]
    assert [Position(e["step"], e["epoch"], e["batch"]) for e in resumed] == [second.position]
    assert resumed[0]["source"] == ("store" if store else "run directory")

    assert second.state is not None and reference.state is not None
    tv.assert_same_state(reference.state, second.state)
    # Never a batch replayed nor skipped: the same samples in the same order.
    assert Counter(first.seen + second.seen) == Counter(reference.seen)
    assert first.seen + second.seen == reference.seen
    # The global RNGs continue where they stopped: the first numbers drawn after resume are
    # those the uninterrupted run drew after committing that step.
    assert second.draws[0] == reference.draws[step - 1]
    assert first.draws + second.draws == reference.draws
    assert first.epoch_draws + second.epoch_draws == reference.epoch_draws


def test_tracked_state_changes_during_the_run(reference: tv.Outcome) -> None:
    """The comparison above means something: each tracked object's state moves away from its
    initial value (the scaler grows, the scheduler decays, Adam counts steps)."""
    assert reference.state is not None
    fresh = {k: v.state_dict() for k, v in tv.build(tv.CONFIG, tv.CONFIG["seed"]).items()}
    assert reference.state["scaler"]["scale"] != fresh["scaler"]["scale"]
    assert reference.state["scheduler"]["last_epoch"] == TOTAL
    assert reference.state["optimizer"]["param_groups"][0]["lr"] < tv.CONFIG["optimizer"]["lr"]
    steps = {int(s["step"]) for s in reference.state["optimizer"]["state"].values()}
    assert steps == {TOTAL}
    with pytest.raises(AssertionError):
        tv.assert_same_state(reference.state["model"], fresh["model"])


def test_preempted_twice_resumes_twice(tmp_path: Path, reference: tv.Outcome) -> None:
    root = tmp_path / "runs"
    first = tv.train(root, stop_at=3)
    second = tv.train(root, stop_at=PER_EPOCH + 2, stop_how="signal")
    third = tv.train(root)
    assert (first.code, second.code, third.code) == (42, 42, 0)
    assert second.position == expected_position(3)
    assert third.position == expected_position(PER_EPOCH + 2)
    assert third.state is not None and reference.state is not None
    tv.assert_same_state(reference.state, third.state)
    assert first.seen + second.seen + third.seen == reference.seen
    assert first.draws + second.draws + third.draws == reference.draws
    assert third.run is not None
    status = json.loads((third.run.run_dir / "run_status.json").read_text())
    assert (status["status"], status["resubmit_count"], status["step"]) == ("completed", 2, TOTAL)
