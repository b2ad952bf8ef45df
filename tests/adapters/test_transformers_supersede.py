"""The Hugging Face callback's stop while a periodic checkpoint's publish is in flight (runtime/
_inflight.py), with a real Trainer publishing to moto's S3 server through a bandwidth cap:
where the time left holds the stop's publish but not both, the periodic one is abandoned
(``pack_superseded``) and the stop's checkpoint lands; the store holds nothing of the one
given up."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

from restorepoint import list_store
from restorepoint.adapters.transformers import RestorePointCallback
from restorepoint.ops import PackOptions

from .hf_job import RUN, dataset, make_trainer

pytestmark = pytest.mark.s3


def _large() -> GPT2LMHeadModel:
    """About 150 MiB of checkpoint (weights and AdamW's moments): far more than what the
    pipeline and the S3 upload hold in hand at a publish's end, which is past abandoning."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=32, n_positions=16, n_embd=512, n_layer=4, n_head=4, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def test_a_stop_abandons_the_periodic_publish_in_flight_where_only_its_own_lands(
    tmp_path: Path, s3_bucket: str, s3_capped: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    options = s3_capped(48 << 20)
    store = f"s3://{s3_bucket}/hf-supersede/"
    data = dataset()
    rp = RestorePointCallback(store, run=RUN, dataset=data, storage_options=options)

    class Stop(TrainerCallback):  # type: ignore[misc]
        """checkpoint-2 published whole (its time is the estimate); at step 4's end, once
        checkpoint-4's publish has begun, the stop (taken at step 5's end), with an
        ``upload_timeout`` of two publishes and the margin (the stop's fits even at half
        again its time, both do not)."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                assert rp.wait(120)
            if state.global_step == 4:
                (packed,) = [e for e in rp.events if e["event"] == "packed"]
                rp.upload_timeout = 2.0 * packed["seconds"] + PackOptions().deadline_margin
                os.kill(os.getpid(), signal.SIGTERM)

    trainer, rp, _ = make_trainer(
        tmp_path / "out", store=store, storage_options=options, max_steps=12, save_steps=2,
        data=data, net=_large(), rp=rp, callbacks=[Stop()],
    )  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == 42
    (superseded,) = [e for e in rp.events if e["event"] == "pack_superseded"]
    assert (superseded["step"], superseded["by"]) == (4, 5)
    assert not [e for e in rp.events if e["event"] == "pack_failed"]
    (stop,) = [e for e in rp.events if e["event"] == "stopped"]
    assert stop["published"] is True
    assert "checkpoint-5 published to s3://" in capfd.readouterr().err
    steps = sorted(e.step for e in list_store(store, storage_options=options))
    assert steps == [2, 5]
