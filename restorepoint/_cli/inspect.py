"""restorepoint inspect URL"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .._text import printable
from ._common import human_bytes, print_json, run, say
from .store import LatestOpt, RunOpt, target

if TYPE_CHECKING:
    from ..format import Manifest


def inspect_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point.")],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    head: Annotated[
        bool, typer.Option("--head", help="Read only the bounded prefix (identity, position).")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a restore point's manifest without reading its payload."""

    def body() -> None:
        from ..ops import read_manifest

        chosen = target(url, use_latest, run_id)
        manifest = read_manifest(chosen, head_only=head)
        if json_:
            print_json({"manifest": manifest.to_dict(), "ok": True, "url": chosen})
        else:
            for line in render(manifest):
                say(line)

    run(json_, body)


def _pairs(mapping: object) -> str:
    assert isinstance(mapping, dict)
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items())) or "-"


def render(m: Manifest) -> list[str]:
    """The manifest as lines for a terminal, every value from the restore point escaped (a
    value holding a newline stays on its line)."""
    pos = m.position
    where = f"step {pos.step}"
    if pos.epoch is not None:
        where += f", epoch {pos.epoch}"
    if pos.batch is not None:
        where += f", batch {pos.batch}"
    if m.config is None:
        config = "-"
    else:
        ops = ", ".join(m.operational_keys) or "none"
        config = f"identity {m.config_identity} (operational: {ops})"
    rows = [
        ("restore point", m.id),
        ("format", m.format_version),
        ("created", m.created),
        ("producer", f"{m.producer.name} {m.producer.version}"),
        ("trainer", f"{m.trainer.name} {m.trainer.version}" if m.trainer else "-"),
        ("position", where),
        ("config", config),
        ("cache root", m.cache_root or "-"),
        ("cache keys", _pairs(dict(m.cache_keys))),
        ("terms", _pairs(dict(m.terms))),
    ]
    lines = [f"{name:<14}{printable(value)}" for name, value in rows]
    if m.payload is not None:
        stored = sum(e.stored_size for e in m.payload)
        lines.append(
            f"{'payload':<14}{m.file_count} files, {human_bytes(m.total_size)} "
            f"({human_bytes(stored)} stored)"
        )
        for e in m.payload:
            lines.append(f"  {e.sha256[:16]}  {e.size:>14}  {e.codec.name:<5} {printable(e.path)}")
    return lines
