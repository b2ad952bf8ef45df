"""restorepoint verify URL"""

from __future__ import annotations

from typing import Annotated

import typer

from .._text import plural
from ._common import human_bytes, print_json, progress_bar, run, say, show_progress
from ._trust import IdentityOpt, RequireOpt, TrustOpt, build_trust
from .store import LatestOpt, RunOpt, target


def verify_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point.")],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    trusted: TrustOpt = None,
    require_signature: RequireOpt = False,
    identity: IdentityOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Verify a restore point end to end: structure, manifest, every payload digest."""

    def body() -> None:
        from ..ops import verify

        with progress_bar(show_progress(json_), "verifying") as (on_start, advance):
            report = verify(
                target(url, use_latest, run_id),
                progress=advance,
                on_start=on_start,
                trust=build_trust(trusted, require=require_signature, identity=identity),
            )
        if json_:
            print_json(report.to_dict())
        else:
            say(
                f"ok: {plural(report.files, 'file')}, {human_bytes(report.bytes)} verified "
                f"in {report.seconds:.2f} s (step {report.manifest.position.step})"
            )
            if report.signed_by:
                trusted_by = ", ".join(report.trusted_by) or "no trusted key"
                say(f"signed by {', '.join(report.signed_by)} (trusted: {trusted_by})")
            say(f"digest {report.digest}")

    run(json_, body)
