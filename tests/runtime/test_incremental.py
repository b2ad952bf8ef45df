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


def test_a_frozen_backbone_is_uploaded_once(tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    net = model()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    # No incremental= given: incremental is the default into a store.
    with ResumableRun(
        CONFIG, root=tmp_path / "a", store=store, snapshot_every=1, keep_last=1,
        final_snapshot=False,
    ) as run:  # fmt: skip
        run.track(model=net, optimizer=opt)
        run.resume()
        for _ in range(3):
            loss = net(torch.randn(4, 1024)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.commit()
            run.wait()
        run_id = run.run_id
        uploads = [u for u in run.uploads if u["ok"]]
    assert len(uploads) == 3
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


def _bases(store: str, run: str, step: int) -> tuple[Any, ...]:
    (entry,) = [e for e in list_store(store, run=run) if e.step == step]
    return restorepoint.read_manifest(f"{store}{entry.name}").bases or ()
