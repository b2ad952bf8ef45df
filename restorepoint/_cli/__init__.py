"""The command line: a typer app (``_app``), one module per verb; errors become exit codes in
``_common``. The entry point answers ``--version`` before it imports typer or any verb."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors are one line and exit 2, like every other failure."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        from .._version import __version__

        sys.stdout.write(f"restorepoint {__version__}\n")
        sys.stdout.flush()
        sys.exit(0)
    from ._app import main as app_main

    app_main(args)
