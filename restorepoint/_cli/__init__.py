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
    """glibc's malloc hands every freed block above 128 KiB back to the kernel and faults it in
    again on the next allocation: with a fresh 4 MiB buffer per chunk, pack and verify took
    about 40,000 page faults for a 131 MiB checkpoint. Blocks of up to 32 MiB from the heap,
    kept there after a free, halve that (docs/performance.md). Only in the CLI's own process:
    the library does not change its caller's allocator; a MALLOC_* setting of the user's wins."""
    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc; musl has none
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum on 64-bit
    mallopt(m_trim_threshold, 256 << 20)
