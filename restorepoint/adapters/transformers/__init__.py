"""Hugging Face ``transformers.Trainer``: a callback that publishes every checkpoint and ends
a stop with exit 42, and the resume that never picks a half-written checkpoint
(docs/adapters.md, "Hugging Face Trainer").

    callback = RestorePointCallback(store="s3://bucket/runs/", keep_last=2, dataset=train_ds)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume_checkpoint(
        args.output_dir, store="s3://bucket/runs/", args=args, model=model, dataset=train_ds))

``adapter.TransformersAdapter`` (the adapter ``transformers`` of the CLI) and the helpers in
``_view`` need no transformers import; the callback and the resume do.
"""

from __future__ import annotations

from typing import Any

from ..._lazy import load as _load
from ..._lazy import names as _names
from ._view import DATASET_KEY, OPERATIONAL_KEYS, TRANSFORMERS_HINTS, trainer_config
from .adapter import TransformersAdapter

__all__ = [
    "DATASET_KEY",
    "OPERATIONAL_KEYS",
    "TRANSFORMERS_HINTS",
    "RestorePointCallback",
    "Stopped",
    "TransformersAdapter",
    "resume_checkpoint",
    "trainer_config",
]

#: Loaded on first use: they import transformers (seconds), which the CLI's adapter does not
#: need.
_LAZY = {
    "RestorePointCallback": "callback",
    "Stopped": "callback",
    "resume_checkpoint": "resume",
}


def __getattr__(name: str) -> Any:
    return _load(name, _LAZY, globals())


def __dir__() -> list[str]:
    return _names(globals())
