"""restorepoint inspect URL"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._text import plural, printable
from ._common import human_bytes, print_json, run, say
from .store import LatestOpt, RunOpt, target

if TYPE_CHECKING:
    from ..format import Manifest
    from ..ops import VerifyReport


def inspect_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point.")],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    head: Annotated[
        bool, typer.Option("--head", help="Read only the bounded prefix (identity, position).")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a restore point's manifest, signatures and parts without reading its payload."""

    def body() -> None:
        from ..ops import read_manifest
        from ..ops.verify import inspect_restore_point

        chosen = target(url, use_latest, run_id)
        if head:
            manifest, report = read_manifest(chosen, head_only=True), None
        else:
            report = inspect_restore_point(chosen)
            manifest = report.manifest
        if json_:
            print_json(describe(chosen, manifest, report))
        else:
            for line in render(manifest, report):
                say(line)

    run(json_, body)


def describe(url: str, manifest: Manifest, report: VerifyReport | None) -> dict[str, Any]:
    """``--json``: the manifest as the schema has it, and what was read besides it (None with
    ``--head``, which reads neither the signature block nor the parts): the key ids whose
    signatures are valid, the payload files in all (a commit's are in its parts), each part."""
    out: dict[str, Any] = {"manifest": manifest.to_dict(), "ok": True, "url": url}
    if report is None:
        return out | {"files": None, "parts": None, "signed_by": None}
    parts = [
        {
            "bytes": p.manifest.total_size,
            "files": p.files,
            "name": p.url.rsplit("/", 1)[-1],
            "rank": p.manifest.part.rank if p.manifest.part else None,
            "url": p.url,
        }
        for p in report.parts
    ]
    return out | {"files": report.files, "parts": parts, "signed_by": list(report.signed_by)}


def _pairs(mapping: object) -> str:
    assert isinstance(mapping, dict)
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items())) or "-"


def _recipients(m: Manifest) -> str:
    if m.encryption is None:
        return "none (the payload is plain)"
    keys = [str(r.get("keyid")) for r in m.encryption.get("recipients", ())]
    return f"{m.encryption.get('scheme')} to {plural(len(keys), 'recipient')}: {', '.join(keys)}"


def _signatures(report: VerifyReport | None) -> str:
    if report is None:
        return "not read (--head reads the head only)"
    if not report.signed_by:
        return "none"
    return (
        f"valid, by {', '.join(report.signed_by)} "
        "(whether trusted: restorepoint verify --trust KEY.pub)"
    )


def render(m: Manifest, report: VerifyReport | None = None) -> list[str]:
    """The manifest as lines for a terminal, every value from the restore point escaped (a
    value holding a newline stays on its line). ``report``: what was read besides the head
    (signatures, a commit's parts); None with ``--head``."""
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
        *([("metrics", _pairs(dict(m.metrics)))] if m.metrics else []),
        ("config", config),
        ("cache root", m.cache_root or "-"),
        ("cache keys", _pairs(dict(m.cache_keys))),
        ("terms", _pairs(dict(m.terms))),
        ("features", ", ".join(m.required_features) or "none required"),
        ("encryption", _recipients(m)),
        ("signatures", _signatures(report)),
    ]
    if m.part is not None:
        rank = "shared" if m.part.rank is None else f"rank {m.part.rank}"
        rows.append(("part of", f"commit {m.part.commit} ({rank}, world size {m.part.world_size})"))
    lines = [f"{name:<14}{printable(value)}" for name, value in rows]
    lines += _parts(m, report)
    entries = m.payload
    if report is not None and report.parts:
        entries = tuple(e for p in report.parts for e in p.manifest.payload or ())
    if entries is not None:
        total = sum(e.size for e in entries)
        stored = sum(e.stored_size for e in entries)
        lines.append(
            f"{'payload':<14}{plural(len(entries), 'file')}, {human_bytes(total)} "
            f"({human_bytes(stored)} stored)" + (" in its parts" if m.parts else "")
        )
        for e in entries:
            lines.append(f"  {e.sha256[:16]}  {e.size:>14}  {e.codec.name:<5} {printable(e.path)}")
    return lines


def _parts(m: Manifest, report: VerifyReport | None) -> list[str]:
    """A commit's parts: as its head names them, and with ``report`` what each holds."""
    if m.parts is None:
        return []
    reshards = "reshardable" if m.parts.reshardable else "not reshardable"
    lines = [
        f"{'parts':<14}{plural(len(m.parts.objects), 'part')} for world size "
        f"{m.parts.world_size} ({reshards})"
    ]
    held = {p.manifest.id: p for p in report.parts} if report is not None else {}
    for ref in m.parts.objects:
        rank = "shared" if ref.rank is None else f"rank {ref.rank}"
        read = held.get(ref.id)
        what = f"{plural(read.files, 'file')}, " if read is not None else ""
        lines.append(
            f"  {ref.name:<14} {rank:<9} {what}{human_bytes(ref.size)} object, "
            f"digest {ref.digest[:16]}"
        )
    return lines
