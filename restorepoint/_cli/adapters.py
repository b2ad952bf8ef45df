"""restorepoint adapters"""

from __future__ import annotations

from typing import Annotated

import typer

from ._common import print_json, run, say


def adapters_command(
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The installed trainer adapters (entry-point group restorepoint.adapters)."""

    def body() -> None:
        from ..adapters.base import available_adapters

        infos = available_adapters()
        if json_:
            print_json({"adapters": [i.to_dict() for i in infos], "ok": True})
            return
        width = max((len(info.name) for info in infos), default=0)
        for info in infos:
            state = "" if info.available else f"  (unavailable: {info.problem})"
            say(f"{info.name:<{width}} {info.description}{state}")

    run(json_, body)
