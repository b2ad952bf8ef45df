"""The expectation options that import and check share, and how they become Expectations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from ..format import Trainer
from ..ops import load_config
from ..ops.gate import UNSET, Expectations, load_expectations
from ._common import parse_pairs, parse_trainer

ExpectFile = Annotated[
    Path | None,
    typer.Option(
        "--expect", help="Handoff file (JSON) with the expectations; options override it."
    ),
]
TrainerOpt = Annotated[str | None, typer.Option("--trainer", help="Expected trainer NAME=VERSION.")]
TermOpt = Annotated[
    list[str] | None, typer.Option("--term", help="Expected version term K=V (repeatable).")
]
KeyOpt = Annotated[
    list[str] | None, typer.Option("--key", help="Expected cache key K=V (repeatable).")
]
CacheRootOpt = Annotated[str | None, typer.Option("--cache-root", help="Expected cache root.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="Config whose identity must match (JSON, YAML or TOML)."),
]


def build_expectations(
    expect_file: Path | None,
    trainer: str | None,
    term: list[str] | None,
    key: list[str] | None,
    cache_root: str | None,
    config: Path | None,
) -> Expectations:
    """The file's expectations with the command line's on top (terms and keys name by name)."""
    base = load_expectations(expect_file) if expect_file is not None else Expectations()
    parsed = parse_trainer(trainer)
    overrides = Expectations(
        trainer=Trainer(*parsed) if parsed is not None else UNSET,
        terms=parse_pairs(term, "--term") if term else UNSET,
        cache_keys=parse_pairs(key, "--key") if key else UNSET,
        cache_root=cache_root if cache_root is not None else UNSET,
        config=load_config(config) if config is not None else UNSET,
    )
    return base.merged(overrides)


def require_some(expect: Expectations, check_keys: bool) -> None:
    if check_keys and expect.empty:
        raise UsageError(
            "--check-keys needs at least one expectation (--expect, --trainer, --term, --key, "
            "--cache-root or --config)"
        )
