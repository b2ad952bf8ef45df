"""restorepoint local-view: what this machine would expect of a restore point, and why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._common import print_json, run, say
from ._expect import (
    AdapterOpt,
    AdapterOptionOpt,
    CacheRootOpt,
    ConfigOpt,
    DataOpt,
    ExpectFile,
    KeyOpt,
    TermOpt,
    TrainerOpt,
    build_views,
    chosen_adapter,
)
from .import_ import CommandArg

if TYPE_CHECKING:
    from ..ops.gate import Expectations


def describe_view(view: Expectations) -> list[dict[str, Any]]:
    """Each gate field: known (its value and where it came from) or unknown here. A config is
    shown by its identity (without operational keys: the gate computes it with the restore
    point's own)."""
    from ..format import Trainer, config_identity
    from ..ops.gate import FIELDS

    out: list[dict[str, Any]] = []
    for name in FIELDS:
        if not view.knows(name):
            out.append({"field": name, "known": False})
            continue
        if name == "config":
            config = view.config
            value: Any = (
                config_identity(config, ()) if isinstance(config, Mapping) else view.config_identity
            )
            shown_as = "config_identity"
        else:
            shown_as = name
            value = getattr(view, name)
            if isinstance(value, Trainer):
                value = f"{value.name}={value.version}"
            elif isinstance(value, Mapping):
                value = dict(value)
        out.append({"field": shown_as, "known": True, "source": view.source(name), "value": value})
    return out


def local_view_command(
    adapter: AdapterOpt = None,
    adapter_option: AdapterOptionOpt = None,
    config: ConfigOpt = None,
    data: DataOpt = None,
    cache_root: CacheRootOpt = None,
    trainer: TrainerOpt = None,
    term: TermOpt = None,
    key: KeyOpt = None,
    expect: ExpectFile = None,
    base: CommandArg = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """What this machine expects of a restore point it resumes: each gate field, its value
    and where it came from (detected by --adapter, given, or from --expect)."""

    def body() -> None:
        views = build_views(
            adapter=chosen_adapter(adapter, adapter_option), expect_file=expect,
            trainer=trainer, term=term, key=key, cache_root=cache_root, config=config,
            data=data, command=base or [],
        )  # fmt: skip
        described = [describe_view(v) for v in views]
        if json_:
            print_json({"ok": True, "views": described})
            return
        for i, fields in enumerate(described):
            if len(described) > 1:
                say("this machine:" if i == 0 else "the handoff file (--expect):")
            for item in fields:
                if not item["known"]:
                    say(f"  {item['field']:<16} unknown here")
                    continue
                value = item["value"]
                if isinstance(value, dict):
                    value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "(none)"
                shown = "(none)" if value is None else str(value)
                say(f"  {item['field']:<16} {shown}  [{item['source'] or 'given'}]")

    run(json_, body)
