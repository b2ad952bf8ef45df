"""restorepoint local-view: what this machine would expect of a restore point, and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import UsageError
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
    from ..adapters.base import Adapter
    from ..ops.gate import Expectations


def describe_view(view: Expectations, operational: Sequence[str]) -> list[dict[str, Any]]:
    """Each gate field: known (its value and where it came from) or unknown here. A config is
    shown by the identity the gate compares (``gate.compared_identity``), computed with
    ``operational``: the keys a restore point declares, or those a pack here would."""
    from ..format import Trainer
    from ..ops.gate import FIELDS, compared_identity

    out: list[dict[str, Any]] = []
    for name in FIELDS:
        if not view.knows(name):
            out.append({"field": name, "known": False})
            continue
        extra: dict[str, Any] = {}
        if name == "config":
            config = view.config
            if isinstance(config, Mapping):
                value: Any = compared_identity(config, operational)
                extra = {"operational_keys": list(operational)}
            else:  # a handoff's identity, as it was computed where it was written
                value = view.config_identity
            shown_as = "config_identity"
        else:
            shown_as = name
            value = getattr(view, name)
            if isinstance(value, Trainer):
                value = f"{value.name}={value.version}"
            elif isinstance(value, Mapping):
                value = dict(value)
        out.append(
            {"field": shown_as, "known": True, "source": view.source(name), "value": value} | extra
        )
    return out


def _operational(
    given: list[str] | None, adapter: Adapter | None, against: str | None
) -> tuple[list[str], str]:
    """The operational keys the config identity is computed with, and where they came from:
    the restore point's (``--against``, its head only), else those a pack here would record
    (``--operational`` and the adapter's own, as ``pack --adapter`` adds them)."""
    if against is not None:
        if given:
            raise UsageError("--operational: with --against the restore point's keys are used")
        from ..ops import read_manifest

        return list(read_manifest(against, head_only=True).operational_keys), f"of {against}"
    keys = [*(given or []), *getattr(adapter, "operational_keys", ())]
    return keys, "as a pack here records them"


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
    operational: Annotated[
        list[str] | None,
        typer.Option(help="Dotted config key left out of the identity, as pack's (repeatable)."),
    ] = None,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            metavar="URL",
            help="A restore point: show the config identity with its operational keys, "
            "as the gate computes it (reads the head only).",
        ),
    ] = None,
    base: CommandArg = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """What this machine expects of a restore point it resumes: each gate field, its value
    and where it came from (detected by --adapter, given, or from --expect)."""

    def body() -> None:
        chosen = chosen_adapter(adapter, adapter_option)
        keys, keys_from = _operational(operational, chosen, against)
        views = build_views(
            adapter=chosen, expect_file=expect,
            trainer=trainer, term=term, key=key, cache_root=cache_root, config=config,
            data=data, command=base or [],
        )  # fmt: skip
        described = [describe_view(v, keys) for v in views]
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
                source = item["source"] or "given"
                if "operational_keys" in item:
                    named = ", ".join(item["operational_keys"]) or "none"
                    source += f"; operational keys {keys_from}: {named}"
                say(f"  {item['field']:<16} {shown}  [{source}]")

    run(json_, body)
