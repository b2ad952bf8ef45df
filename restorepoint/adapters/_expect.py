"""What every in-process trainer adapter (Lightning, the Hugging Face Trainer, Accelerate)
expects of a restore point, and the run it packs under: one owner, so that the three local
views say the same things in the same words."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import UsageError
from ..format import Trainer
from ..ops import Expectations, describe
from ..ops.local_view import cache_root_from_env
from ..runtime.contract import STORE_ENV

__all__ = ["run_id", "store_from_env", "trainer_view"]

log = logging.getLogger("restorepoint.adapters")


def trainer_view(  # noqa: PLR0913 - each field of the view and where it came from
    trainer: Trainer,
    terms: Mapping[str, str],
    *,
    detected: str,
    terms_source: str,
    config: Mapping[str, Any] | None,
    config_source: str = "config=",
    cache_keys: Mapping[str, str] | None,
    cache_keys_source: str = "cache_keys=",
    cache_root: str | None,
    given_terms: Mapping[str, str] | None = None,
) -> Expectations:
    """The local view of a trainer run here: ``trainer`` (``detected`` says how it was
    found), the terms detected here (``terms``, from ``terms_source``) and those given, the
    cache keys and cache root it packs with (none unless given; the root also from
    ``$RESTOREPOINT_CACHE_ROOT``), and its config."""
    root = cache_root if cache_root is not None else cache_root_from_env()
    values: dict[str, Any] = {
        "trainer": trainer,
        "terms": {**dict(terms), **dict(given_terms or {})},
        "cache_keys": dict(cache_keys or {}),
        "cache_root": root,
    }
    sources = {
        "trainer": f"detected: {detected}",
        "terms": terms_source + (", terms=" if given_terms else ""),
        "cache_keys": cache_keys_source if cache_keys else "cache_keys= (none given)",
        "cache_root": "cache_root="
        if cache_root is not None
        else ("RESTOREPOINT_CACHE_ROOT" if root is not None else "cache_root= (none given)"),
    }
    if config is not None:
        values["config"] = dict(config)
        sources["config"] = config_source
    return Expectations(**values, sources=sources)


def run_id(run: str | None, config: Mapping[str, Any] | None, operational: Iterable[str]) -> str:
    """The run a restore point is packed under, as pack derives it (``cfg-`` and the config
    identity when only a config is given); describe validates both on the way."""
    head = describe(position=0, config=config, operational_keys=operational, run=run)
    if head.run is None:
        raise UsageError("a store needs a run: give run= or config=")
    return head.run


def store_from_env(
    store: str | None, run: str | None, config: Mapping[str, Any] | None
) -> str | None:
    """``store``, else the supervisor's ``$RESTOREPOINT_STORE`` (``restorepoint run``) when the
    run can be named (``run=`` or ``config=``); without either that store is not used."""
    if store is not None:
        return store
    env = os.environ.get(STORE_ENV) or None
    if env is not None and run is None and config is None:
        log.warning("%s is set, but neither run= nor config= names the run: not used", STORE_ENV)
        return None
    return env
