"""What a ``transformers.Trainer`` run is, as a restore point records it and a resume compares
it (docs/adapters.md, "Hugging Face Trainer"): the trainer and its terms, the config
(TrainingArguments and the model's config) with its operational keys, the cache keys (the
dataset's fingerprint, or a digest the caller gives), the run and the store.

Nothing here imports transformers: the CLI's local view (``restorepoint local-view --adapter
transformers``) reads the installed versions from the package metadata.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ...errors import MissingExtra, UsageError
from ...format import Trainer
from ...ops import Expectations
from ...runtime.contract import STORE_ENV
from ...runtime.detect import TORCH_TERMS_SOURCE, torch_terms
from .._expect import run_id, trainer_view
from ..base import TrainerInfo

__all__ = [
    "DATASET_KEY",
    "OPERATIONAL_KEYS",
    "TRANSFORMERS_HINTS",
    "cache_keys_of",
    "local_view",
    "run_id",
    "store_from_env",
    "trainer_config",
    "trainer_info",
]

log = logging.getLogger("restorepoint.transformers")

#: The cache key a dataset's fingerprint (or the digest given for it) is recorded under.
DATASET_KEY = "dataset"

#: TrainingArguments fields (``args.NAME``) and model config fields (``model.NAME``) that say
#: where and how a run is logged, saved and reported, never what it trains: left out of the
#: identity, so that changing one never refuses a resume and never moves the run. Pass
#: ``operational=`` to replace the list (``OPERATIONAL_KEYS + ("args.eval_steps",)`` to add).
OPERATIONAL_KEYS: tuple[str, ...] = tuple(
    [
        f"args.{name}"
        for name in (
            # where it writes, and where it resumes from
            "output_dir", "overwrite_output_dir", "resume_from_checkpoint",
            # logging and reporting
            "logging_dir", "logging_strategy", "logging_steps", "logging_first_step",
            "logging_nan_inf_filter", "log_level", "log_level_replica", "log_on_each_node",
            "disable_tqdm", "report_to", "run_name", "project", "trackio_space_id",
            "trackio_bucket_id", "trackio_static_space_id", "skip_memory_metrics",
            "include_num_input_tokens_seen",
            # saving (restorepoint's retention is the callback's keep_last / keep_best)
            "save_strategy", "save_steps", "save_total_limit", "save_on_each_node",
            "save_safetensors", "save_only_model", "enable_jit_checkpoint",
            # the Hub
            "push_to_hub", "hub_token", "hub_model_id", "hub_strategy", "hub_private_repo",
            "hub_always_push", "hub_revision",
            # this process and machine
            "local_rank", "ddp_timeout", "dataloader_num_workers", "dataloader_pin_memory",
            "dataloader_persistent_workers", "dataloader_prefetch_factor",
            "do_train", "do_eval", "do_predict",
        )
    ]
    + [
        # the loading path and the writer's version (the trainer and its terms record it),
        # and the cache flag the Trainer sets from args.use_cache
        "model._name_or_path",
        "model.transformers_version",
        "model.use_cache",
    ]
)  # fmt: skip

#: What a refusal says to give, in this adapter's words.
TRANSFORMERS_HINTS = {
    "trainer": "the restore point was not made by transformers.Trainer",
    "terms": "give terms=",
    "cache_root": "give cache_root= or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give dataset= or cache_keys=",
    "config": "give args= and model=",
}


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def trainer_info() -> TrainerInfo:
    """``transformers=VERSION``; terms: torch's and CUDA's (``torch_terms``), transformers
    and accelerate (when installed)."""
    transformers = _version("transformers")
    if transformers is None:
        raise MissingExtra("transformers", "transformers", "the transformers adapter")
    terms = {**torch_terms(), "transformers": transformers}
    accelerate = _version("accelerate")
    if accelerate is not None:
        terms["accelerate"] = accelerate
    return TrainerInfo("transformers", transformers, terms)


def trainer_config(args: Any, model: Any = None) -> dict[str, Any]:
    """The config a Trainer run records: ``{"args": TrainingArguments.to_dict(), "model":
    the model's config.to_dict()}`` (``model`` a PreTrainedModel, a PretrainedConfig, or a
    mapping; None: no model part). Write it to a JSON file for ``restorepoint local-view
    --adapter transformers --config FILE`` and ``check``."""
    if isinstance(args, Mapping):
        args_dict = dict(args)
    elif hasattr(args, "to_dict"):
        args_dict = args.to_dict()
    else:
        raise UsageError("args= must be a TrainingArguments (or its to_dict())")
    config: dict[str, Any] = {"args": args_dict}
    if model is not None:
        model_config = getattr(model, "config", model)
        if isinstance(model_config, Mapping):
            config["model"] = dict(model_config)
        elif hasattr(model_config, "to_dict"):
            config["model"] = model_config.to_dict()
        else:
            raise UsageError("model= must be a PreTrainedModel, its config, or a mapping")
    # As their own to_json_string() writes them (what args.json holds): integer keys
    # (id2label) become strings, and anything else that is not JSON its str().
    return dict(json.loads(json.dumps(config, default=str)))


def cache_keys_of(
    dataset: Any = None, cache_keys: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The cache keys: ``cache_keys`` as given, and ``dataset`` as the key ``dataset``: its
    fingerprint (``datasets.Dataset._fingerprint``), or the string given (a digest of the
    data that the caller computed)."""
    keys = dict(cache_keys or {})
    if dataset is None:
        return keys
    if isinstance(dataset, str):
        fingerprint: Any = dataset
    else:
        fingerprint = getattr(dataset, "_fingerprint", None)
    if not isinstance(fingerprint, str) or not fingerprint:
        raise UsageError(
            "dataset= has no fingerprint (a datasets.Dataset has one): pass a digest of the "
            "data as a string, or cache_keys="
        )
    keys[DATASET_KEY] = fingerprint
    return keys


def local_view(
    config: Mapping[str, Any] | None,
    cache_keys: Mapping[str, str] | None,
    cache_root: str | None,
    terms: Mapping[str, str] | None = None,
) -> Expectations:
    """What a Trainer run here expects of a restore point: the installed transformers, the
    terms detected here and those given, the cache root and cache keys it packs with (none
    unless given), and its config."""
    info = trainer_info()
    return trainer_view(
        Trainer(info.name, info.version),
        info.terms,
        detected="the installed transformers",
        terms_source=f"{TORCH_TERMS_SOURCE}, transformers, accelerate",
        config=config,
        config_source="args= and model=",
        cache_keys=cache_keys,
        cache_keys_source="dataset= / cache_keys=",
        cache_root=cache_root,
        given_terms=terms,
    )


def store_from_env(store: str | None) -> str | None:
    """``store``, else the supervisor's ``$RESTOREPOINT_STORE`` (``restorepoint run``): a
    Trainer run always names itself (its config), so the variable is always usable."""
    if store is not None:
        return store
    return os.environ.get(STORE_ENV) or None


def operational_keys(operational: Sequence[str] | None) -> tuple[str, ...]:
    return OPERATIONAL_KEYS if operational is None else tuple(operational)
