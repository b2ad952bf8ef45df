"""The options that build this machine's views for the gate (check, import, run, local-view):
an adapter's local view (``--adapter``, with ``--config``, ``--data``, ``--cache-root``), the
command line's values on top of it, and a handoff file (``--expect``), which must agree too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import UsageError
from ._common import parse_pairs, parse_trainer

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..ops.gate import Expectations

ExpectFile = Annotated[
    Path | None,
    typer.Option(
        "--expect",
        help="Handoff file (JSON): expectations it must meet too; options override it.",
    ),
]
TrainerOpt = Annotated[str | None, typer.Option("--trainer", help="Expected trainer NAME=VERSION.")]
TermOpt = Annotated[
    list[str] | None, typer.Option("--term", help="Expected version term K=V (repeatable).")
]
KeyOpt = Annotated[
    list[str] | None, typer.Option("--key", help="Expected cache key K=V (repeatable).")
]
CacheRootOpt = Annotated[
    str | None, typer.Option("--cache-root", help="This machine's cache root.")
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", help="The job's config (JSON, YAML or TOML): its identity must match."
    ),
]
DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data", help="The data directory: its digest is a cache key (data, or the adapter's)."
    ),
]
AdapterOpt = Annotated[
    str | None,
    typer.Option(
        "--adapter", help="Trainer adapter whose local view is detected (see `adapters`)."
    ),
]
AdapterOptionOpt = Annotated[
    list[str] | None, typer.Option("--adapter-option", help="An adapter option K=V (repeatable).")
]


def command_line_view(
    trainer: str | None,
    term: list[str] | None,
    key: list[str] | None,
    cache_root: str | None,
    config: dict[str, Any] | None,
    data: Path | None,
) -> Expectations:
    """What the options say, each field named by its option."""
    from ..format import Trainer
    from ..ops.gate import UNSET, Expectations
    from ..ops.local_view import DATA_KEY, data_digest

    parsed = parse_trainer(trainer)
    keys: dict[str, str] | None = parse_pairs(key, "--key") if key else None
    sources = {}
    if data is not None:
        keys = {DATA_KEY: data_digest(data), **(keys or {})}
        sources["cache_keys"] = "--data" + (", --key" if key else "")
    elif key:
        sources["cache_keys"] = "--key"
    if trainer is not None:
        sources["trainer"] = "--trainer"
    if term:
        sources["terms"] = "--term"
    if cache_root is not None:
        sources["cache_root"] = "--cache-root"
    if config is not None:
        sources["config"] = "--config"
    return Expectations(
        trainer=Trainer(*parsed) if parsed is not None else UNSET,
        terms=parse_pairs(term, "--term") if term else UNSET,
        cache_keys=keys if keys is not None else UNSET,
        cache_root=cache_root if cache_root is not None else UNSET,
        config=config if config is not None else UNSET,
        sources=sources,
    )


def chosen_adapter(name: str | None, options: list[str] | None) -> Adapter | None:
    if name is None:
        if options:
            raise UsageError("--adapter-option needs --adapter")
        return None
    from ..adapters.base import load_adapter

    return load_adapter(name, **parse_pairs(options, "--adapter-option"))


def build_views(
    *,
    adapter: Adapter | None,
    expect_file: Path | None,
    trainer: str | None,
    term: list[str] | None,
    key: list[str] | None,
    cache_root: str | None,
    config: Path | None,
    data: Path | None,
    command: Sequence[str] = (),
) -> list[Expectations]:
    """This machine's views: the adapter's local view with the options on top (the options
    override detection), and the handoff file with the options on top. The restore point must
    meet both; a field known to neither is unknown here. Without an adapter, the options are
    the view (or override the handoff's)."""
    from ..ops import load_config
    from ..ops.handoff import load_expectations

    config_data = load_config(config) if config is not None else None
    options = command_line_view(trainer, term, key, cache_root, config_data, None)
    views = []
    if adapter is not None:
        detected = adapter.local_view(
            config=config_data, data=data, cache_root=cache_root, command=command
        )
        views.append(detected.merged(options))
    else:
        # No detection: the options are this machine's view, or what overrides the handoff.
        options = command_line_view(trainer, term, key, cache_root, config_data, data)
    if expect_file is not None:
        handoff = load_expectations(expect_file).from_source("--expect")
        views.append(handoff.merged(options))
    return views or [options]


def require_some(views: Sequence[Expectations], what: str = "--check-keys") -> None:
    if all(v.empty for v in views):
        raise UsageError(
            f"{what} needs at least one expectation (--adapter, --expect, --trainer, --term, "
            "--key, --data, --cache-root or --config)"
        )
