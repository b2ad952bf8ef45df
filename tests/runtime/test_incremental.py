"""ResumableRun publishes incremental restore points into a store by default (spec section 28):
a model with a frozen backbone publishes only what training changed, each restore point
verifies through its references, keep-last never deletes a base of what it keeps, and a run
resumes bit for bit from an incremental one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

import restorepoint  # noqa: E402
from restorepoint.ops.store import list_store  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

CONFIG = {"seed": 0, "optimizer": {"lr": 0.1}}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    net[0].requires_grad_(False)  # the frozen backbone: 4 MiB of the 4.03 MiB of weights
    return net


def _train(
    root: Path, store: str, net: Any, opt: Any, *, steps: int, keep_last: int | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """``steps`` real steps, a restore point after each, waited for: the run and its uploads."""
    with ResumableRun(
        CONFIG, root=root, store=store, snapshot_every=1, keep_last=keep_last,
        final_snapshot=False,
    ) as run:  # fmt: skip
        run.track(model=net, optimizer=opt)
        run.resume()
        for _ in range(steps):
            loss = net(torch.randn(4, net[0].in_features)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.commit()
            run.wait()
        return run.run_id, [u for u in run.uploads if u["ok"]]


def test_a_frozen_backbone_is_uploaded_once(tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    net = model()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    # No incremental= given: incremental is the default into a store.
    run_id, uploads = _train(tmp_path / "a", store, net, opt, steps=3, keep_last=1)
    assert len(uploads) == 3
    # Its optimizer steps 1% of the state: the first restore point names its chunks.
    assert uploads[0]["incremental"]["reason"] == "no earlier restore point of the run"
    sizes = {e.step: e.size for e in list_store(store, run=run_id)}
    # keep-last 1 keeps step 3 and the first, whose frozen backbone step 3 references.
    assert sorted(sizes) == [1, 3]
    assert sizes[3] < 0.1 * sizes[1]
    assert [b.name.split("/")[1].split("-")[0] for b in _bases(store, run_id, 3)] == [f"{1:016d}"]
    newest = restorepoint.latest(store, run=run_id, verify_it=True)
    assert newest.step == 3
    # Another machine resumes from it: every tensor as it was.
    again = model()
    with ResumableRun(
        CONFIG, root=tmp_path / "b", store=store, snapshot_every=1, final_snapshot=False,
        incremental=True,
    ) as second:  # fmt: skip
        second.track(model=again)
        second.resume()
        assert second.step == 3
    for a, b in zip(net.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_what_training_steps_is_told_by_the_tracked_optimizers() -> None:
    """The bytes a step changes (what the publisher expects to reuse where the store holds
    nothing of the run, spec 28.4): the tracked modules' parameters that a tracked optimizer
    steps, and the optimizers' state; frozen parameters, parameters no optimizer holds,
    buffers and other objects count as kept, and without an optimizer nothing is known."""
    from restorepoint.runtime.state import expected_reuse, stepped_bytes

    net = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 8)
    )
    net[0].requires_grad_(False)
    head = [p for p in net[2].parameters()]
    head_bytes = sum(p.numel() * 4 for p in head)
    assert stepped_bytes({"model": net}) is None
    # A frozen parameter in the optimizer is not stepped; BatchNorm's are held by none.
    opt = torch.optim.Adam([*head, net[0].weight], lr=1e-3)
    assert stepped_bytes({"model": net, "optimizer": opt}) == head_bytes
    # After a step, Adam's two moments (and its step counts) change too.
    net(torch.randn(4, 64)).square().mean().backward()
    opt.step()
    moments = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert moments >= 2 * head_bytes
    tracked = {"model": net, "again": net, "optimizer": opt, "scheduler": object()}
    assert stepped_bytes(tracked) == head_bytes + moments  # a shared module counted once
    # The share its publisher expects the next restore point to reuse, what Rest.expect takes.
    assert expected_reuse(None, 100) is None and expected_reuse(10, 0) is None
    assert expected_reuse(25, 100) == 0.75 and expected_reuse(300, 100) == 0.0


def _bases(store: str, run: str, step: int) -> tuple[Any, ...]:
    (entry,) = [e for e in list_store(store, run=run) if e.step == step]
    return restorepoint.read_manifest(f"{store}{entry.name}").bases or ()


def test_a_full_fine_tune_says_it_reused_nothing_and_rests(tmp_path: Path) -> None:
    # Every parameter trains with Adam: nothing of a restore point is left in the next. The
    # runtime's publisher knows it from what its optimizer steps, and rests from the run's
    # first restore point (spec 28.4): that one and the next REST name no chunks, so no
    # per-chunk sha256 is paid for.
    from restorepoint.format.delta import DELTA_FEATURE
    from restorepoint.ops._increment import REST

    store = f"{tmp_path}/store/"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 8))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    run_id, uploads = _train(tmp_path / "a", store, net, opt, steps=4)
    reasons = [u["incremental"]["reason"] for u in uploads]
    assert reasons[0] == (
        "no earlier restore point of the run, and its publisher expects it to reuse less "
        "than 25% of its bytes"
    )
    assert reasons[1:] == [
        f"the run's state changed too much at a recent publish ({left} more)"
        for left in (REST, REST - 1, REST - 2)
    ]
    assert all(u["incremental"]["reused"] == 0 for u in uploads)
    entries = {e.step: e.name for e in list_store(store, run=run_id)}
    features = [
        restorepoint.read_manifest(f"{store}{entries[s]}").required_features for s in (1, 2, 3, 4)
    ]
    assert all(DELTA_FEATURE not in f for f in features)
    again = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 8))
    again_opt = torch.optim.Adam(again.parameters(), lr=1e-3)
    with ResumableRun(
        CONFIG, root=tmp_path / "b", store=store, snapshot_every=1, final_snapshot=False
    ) as second:
        second.track(model=again, optimizer=again_opt)
        second.resume()
        assert second.step == 4
    for a, b in zip(net.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    want, got = opt.state_dict(), again_opt.state_dict()
    assert want["param_groups"] == got["param_groups"]
    assert want["state"].keys() == got["state"].keys()
    for key, moments in want["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, got["state"][key][name]), (key, name)
