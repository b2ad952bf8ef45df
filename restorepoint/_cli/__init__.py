"""The command line: a typer app (``_app``), one module per verb; errors become exit codes in
``_common``. The entry point answers ``--version`` before it imports typer or any verb."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors are one line and exit 2, like every other failure."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        from .._version import __version__

        try:
            sys.stdout.write(f"restorepoint {__version__}\n")
            sys.stdout.flush()
        except BrokenPipeError:  # a closed stdout: quiet, as every verb (_common.quiet_exit)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(128 + 13)  # SIGPIPE's status; the signal module is not loaded for this
        sys.exit(0)
    _tune_allocator()
    from ._app import main as app_main

    app_main(args)


def _tune_allocator() -> None:
    """The CLI's pack and verify take a fresh 4 MiB buffer per chunk: malloc keeps what they
    free (``_posix.keep_freed_memory``)."""
    from .._posix import keep_freed_memory

    keep_freed_memory()
