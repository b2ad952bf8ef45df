"""restorepoint fsck STORE: check a whole store (spec 19.8)."""

from __future__ import annotations

from typing import Annotated

import typer

from .._text import plural
from ._common import error_line, print_json, run, say
from ._trust import IdentityOpt, TrustOpt, build_trust

#: Exit code of a check that found defects: an integrity failure (spec 23), as for verify.
EXIT_DEFECTS = 1

_LABELS = {
    "damaged": "damaged",
    "missing_part": "missing part",
    "dangling_reference": "dangling ref",
    "orphan_part": "orphan part",
    "leftover": "leftover",
    "upload": "open upload",
    "stray": "stray",
}


def fsck_command(
    store: Annotated[str, typer.Argument(help="Store URL (a prefix).")],
    read_data: Annotated[
        bool,
        typer.Option("--read-data", help="Also read every payload and check its digests."),
    ] = False,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Remove what prune would: leftovers, orphan parts and open uploads past --grace.",
        ),
    ] = False,
    grace: Annotated[
        str | None,
        typer.Option(
            help="Leftovers, orphan parts and uploads younger than this may be live: reported, "
            "not defects, never removed (default 24h)."
        ),
    ] = None,
    trusted: TrustOpt = None,
    identity: IdentityOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check a whole store: every restore point (head and index; --read-data: payloads too),
    parts no commit names, commits missing a part, leftovers, open uploads and objects that
    are not restore points. Exit 0 clean, 1 defects found, 4 the store cannot be read."""

    def body() -> None:
        from ..ops.fsck import KINDS, fsck
        from ..ops.store import DEFAULT_GRACE_S

        report = fsck(
            store,
            read_data=read_data,
            repair=repair,
            grace=DEFAULT_GRACE_S if grace is None else grace,
            trust=build_trust(trusted, identity=identity),
        )
        defects = report.defects
        if json_:
            print_json(report.to_dict())
        else:
            repaired = report.repaired_findings()
            for finding in report.findings:
                state = "pending " if finding.pending else "defect  "
                if finding.cleanup_name in repaired:
                    state = "repaired"
                say(f"{state}  {_LABELS[finding.kind]:<12}  {finding.url}  ({finding.detail})")
            counts = report.counts()
            say(f"{'found':<16}{'count':>8}")
            say(f"{'restore points':<16}{report.restore_points:>8}  ({report.sound} sound)")
            for kind in KINDS:
                say(f"{_LABELS[kind]:<16}{counts[kind]:>8}")
            pending = sum(f.pending for f in report.findings)
            say(f"{'pending':<16}{pending:>8}  (younger than --grace: not defects)")
            if report.repaired is not None:
                say(f"{'repaired':<16}{len(report.repaired):>8}")
            if not defects:
                say(
                    f"clean: {plural(report.restore_points, 'restore point')}, "
                    f"{plural(report.objects, 'object')} listed"
                )
        if defects:
            error_line(f"the store holds {plural(len(defects), 'defect')}: {report.store}")
            raise typer.Exit(EXIT_DEFECTS)

    run(json_, body)
