"""ResumableRun(incremental=True) on moto's S3 (spec section 28): a frozen-backbone fine-tune
(90% of the parameters frozen) uploads at most 12% of what the same run uploads with full
restore points, at every restore point after the first, and another machine resumes from the
newest bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")

from restorepoint import read_manifest  # noqa: E402
from restorepoint.ops.store import list_store  # noqa: E402
from restorepoint.torch import ResumableRun  # noqa: E402

pytestmark = pytest.mark.s3

CONFIG = {"seed": 0, "optimizer": {"lr": 0.01}}
WIDTH = 512  # each Linear: 1 MiB of float32 weights
POINTS = 4


def frozen_backbone() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(10)))
    net[:9].requires_grad_(False)  # nine frozen layers, one trained: 90%
    return net, torch.optim.SGD(net[9].parameters(), lr=0.01)


def train(root: Path, store: str, options: dict[str, Any], incremental: bool) -> Any:
    net, opt = frozen_backbone()
    data = torch.Generator().manual_seed(1)
    with ResumableRun(
        CONFIG, root=root, store=store, storage_options=options, snapshot_every=1,
        final_snapshot=False, incremental=incremental,
    ) as run:  # fmt: skip
        run.track(model=net, optimizer=opt)
        run.resume()
        for _ in range(POINTS):
            x = torch.randn(8, WIDTH, generator=data)
            loss = net(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.commit()
            run.wait()
        assert [u["ok"] for u in run.uploads] == [True] * POINTS
        return run.run_id, net


def test_a_frozen_backbone_uploads_at_most_12_percent_on_s3_and_resumes_bit_for_bit(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    options = s3_storage_options
    trained = frozen_backbone()[0]
    frozen = sum(p.numel() for p in trained[:9].parameters())
    assert frozen / sum(p.numel() for p in trained.parameters()) == pytest.approx(0.9)
    inc_store, full_store = f"s3://{s3_bucket}/inc/", f"s3://{s3_bucket}/full/"
    run_id, net = train(tmp_path / "inc", inc_store, options, incremental=True)
    train(tmp_path / "full", full_store, options, incremental=False)

    inc = {e.step: e for e in list_store(inc_store, run=run_id, storage_options=options)}
    full = {e.step: e.size for e in list_store(full_store, run=run_id, storage_options=options)}
    assert sorted(inc) == sorted(full) == list(range(1, POINTS + 1))
    first = inc[1]
    assert read_manifest(first.url, storage_options=options).bases == ()
    ratios = {step: round(inc[step].size / full[step], 4) for step in range(2, POINTS + 1)}
    print(f"bytes per incremental restore point / a full one: {ratios}")
    for step, ratio in ratios.items():
        assert ratio <= 0.12, (step, ratio)
        manifest = read_manifest(inc[step].url, storage_options=options)
        assert [b.name for b in manifest.bases or ()] == [first.name]

    # Another machine resumes from the newest: every tensor, the optimizer's too, as it was.
    again, opt = frozen_backbone()
    with ResumableRun(
        CONFIG, root=tmp_path / "b", store=inc_store, storage_options=options,
        snapshot_every=1, final_snapshot=False, incremental=True,
    ) as second:  # fmt: skip
        second.track(model=again, optimizer=opt)
        assert second.resume().step == POINTS
    want, got = net.state_dict(), again.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
