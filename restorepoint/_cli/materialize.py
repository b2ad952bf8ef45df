"""restorepoint materialize URL DEST"""

from __future__ import annotations

from typing import Annotated

import typer

from ._common import human_bytes, print_json, run, say
from .store import LatestOpt, RunOpt, target


def materialize_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point (or a store, --latest).")],
    dest: Annotated[
        str, typer.Argument(help="Where the copy goes: a URL, or a store (ending in /).")
    ],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Write a self-contained copy of an incremental restore point: every chunk read through
    its references, checked, and written again; the copy names no base."""

    def body() -> None:
        from ..ops.materialize import materialize

        result = materialize(target(url, use_latest, run_id), dest)
        if json_:
            print_json(result.to_dict())
        else:
            say(f"materialized {human_bytes(result.bytes)} -> {human_bytes(result.size)}")
            say(f"digest {result.digest}")
            say(result.dest)

    run(json_, body)
