"""A real transformers.Trainer job for the tests (test_transformers*.py): a 2-layer GPT-2 built
from a config (no download), a synthetic dataset, the RestorePointCallback, and
resume_checkpoint. Run as a script it trains (resuming first) and prints ``step N`` at each
step's end; the tests import ``make_trainer`` to train in-process."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

from restorepoint.adapters.transformers import RestorePointCallback, resume_checkpoint

SEQ = 8
#: The run id the job publishes under (named: a changed config then finds the run's restore
#: points and is refused, rather than being a run of its own).
RUN = "tiny-gpt2"
ROWS = 48


def dataset(seed: int = 1) -> datasets.Dataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (ROWS, SEQ), generator=g).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=32, n_positions=SEQ, n_embd=8, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


class Steps(TrainerCallback):  # type: ignore[misc]
    """Prints ``step N`` at each step's end (the tests wait for it), sleeping ``delay`` first
    so that a signal can land in the middle of training."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.delay)
        print(f"step {state.global_step}", flush=True)


def make_trainer(
    out: Path,
    *,
    store: str | None = None,
    storage_options: dict[str, Any] | None = None,
    lr: float = 5e-3,
    max_steps: int = 12,
    save_steps: int = 3,
    delay: float = 0.0,
    data: datasets.Dataset | None = None,
    callbacks: list[Any] | None = None,
    rp: RestorePointCallback | None = None,
    trainer_options: dict[str, Any] | None = None,
    net: GPT2LMHeadModel | None = None,
    **extra: Any,
) -> tuple[Trainer, RestorePointCallback, dict[str, Any]]:
    """The Trainer of this job, its callback, and the keywords resume_checkpoint takes
    (``extra``: more TrainingArguments; ``trainer_options``: more Trainer keywords; ``net``:
    another model than ``model()``)."""
    hf_logging.set_verbosity_error()
    data = data if data is not None else dataset()
    args = TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4,
        learning_rate=lr, save_steps=save_steps, report_to=[], use_cpu=True, seed=0,
        data_seed=0, disable_tqdm=True, **{"logging_steps": 1, **extra},
    )  # fmt: skip
    net = net if net is not None else model()
    rp = rp or RestorePointCallback(
        store, run=RUN, dataset=data, storage_options=storage_options, wait_each=True
    )
    trainer = Trainer(
        model=net,
        args=args,
        train_dataset=data,
        callbacks=[rp, *(callbacks or [Steps(delay)])],
        **(trainer_options or {}),
    )
    return trainer, rp, {"args": args, "model": net, "dataset": data, "run": RUN}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--store")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.0)
    ns = parser.parse_args()
    # One intra-op thread, as the in-process runs of the tests: a sum over another number of
    # threads rounds differently, and the comparisons are bit for bit.
    torch.set_num_threads(1)
    trainer, _rp, keys = make_trainer(
        ns.out, store=ns.store, lr=ns.lr, max_steps=ns.max_steps, delay=ns.delay
    )
    resume = resume_checkpoint(ns.out, ns.store, **keys)
    print(f"resume {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
