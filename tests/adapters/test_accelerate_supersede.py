"""The Accelerate helper's stop while its worker publishes a periodic state (runtime/
_inflight.py), with a real Accelerator on the CPU publishing to moto's S3 server through a
bandwidth cap: where the time left holds the stop's publish but not both, the periodic publish
is abandoned (``superseded`` in ``uploads``), the stop's state is saved over it once it has
stopped, and that state lands; the store holds nothing of the one given up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402

from restorepoint.adapters.accelerate import AccelerateRun  # noqa: E402
from restorepoint.ops import PackOptions, list_store  # noqa: E402

pytestmark = pytest.mark.s3


def test_a_stop_abandons_the_periodic_publish_in_flight_where_only_its_own_lands(
    tmp_path: Path, s3_bucket: str, s3_capped: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    options = s3_capped(48 << 20)
    store = f"s3://{s3_bucket}/accelerate-supersede/"
    AcceleratorState._reset_state(True)
    try:
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(0)
        # 144 MiB of state: far more than a publish's end holds in hand, past abandoning.
        model = torch.nn.Linear(4096, 3072)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)

        def step() -> None:
            accelerator.backward(model(torch.randn(4, 4096)).square().mean())
            optimizer.step()
            optimizer.zero_grad()

        run = AccelerateRun(
            accelerator, tmp_path / "a", store=store, run="acc", storage_options=options
        )
        with run as rp:
            step()
            rp.publish(step=1)
            assert rp.wait(120)
            (first,) = [u for u in rp.uploads if u["ok"]]
            # Two publishes' time: the stop's fits even at half again its estimate, both do not.
            rp.upload_timeout = 2.0 * first["seconds"] + PackOptions().deadline_margin
            step()
            rp.publish(step=2)  # handed to the worker: in flight
            time.sleep(0.3)
            rp.request_stop()
            assert rp.should_stop()
            with pytest.raises(SystemExit) as exited:
                rp.stop(step=3)
    finally:
        AcceleratorState._reset_state(True)
    assert exited.value.code == 42
    assert [(u["step"], u["ok"], u.get("superseded")) for u in rp.uploads] == [
        (1, True, None), (2, False, True), (3, True, None),
    ]  # fmt: skip
    assert sorted(e.step for e in list_store(store, storage_options=options)) == [1, 3]
    assert "at step 3: restore point published to s3://" in capsys.readouterr().err
