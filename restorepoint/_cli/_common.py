"""What every verb shares: errors to exit codes (in this one place), --json output, key=value
options, and the progress bar."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn, TypeVar

import typer

from ..errors import RestorePointError, UsageError

T = TypeVar("T")

#: A bug, not a documented failure: never expected, reported as one line all the same.
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every publisher discards cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    sys.stderr.write(f"restorepoint: warning: {message}\n")
    sys.stderr.flush()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, sort_keys=True, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fail(exc: RestorePointError, as_json: bool) -> NoReturn:
    """One line on stderr (and the error as data on stdout with --json), then the exit code."""
    line = str(exc).replace("\n", " ")
    sys.stderr.write(f"restorepoint: error: {line}\n")
    # A gate refusal lists every mismatch, one a line: field, expected, found.
    for detail in getattr(exc, "details", None) or ():
        sys.stderr.write(f"restorepoint:   {detail}\n")
    sys.stderr.flush()
    if as_json:
        print_json({"ok": False, "error": exc.to_dict()})
    raise typer.Exit(exc.exit_code)


def run(as_json: bool, body: Callable[[], T]) -> T:
    """Run a verb's body and turn every failure into its exit code, without a traceback."""
    previous = signal.getsignal(signal.SIGTERM)
    with contextlib.suppress(ValueError):  # not in the main thread (tests): keep as is
        signal.signal(signal.SIGTERM, _on_term)
    try:
        return body()
    except RestorePointError as exc:
        fail(exc, as_json)
    except typer.Exit:
        raise
    except Terminated:
        sys.stderr.write("restorepoint: terminated; nothing was published\n")
        raise typer.Exit(128 + signal.SIGTERM) from None
    except KeyboardInterrupt:
        sys.stderr.write("restorepoint: interrupted; nothing was published\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        if os.environ.get("RESTOREPOINT_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(
            f"restorepoint: internal error (a bug; set RESTOREPOINT_DEBUG=1 for details): "
            f"{type(exc).__name__}: {exc}\n"
        )
        if as_json:
            print_json(
                {
                    "ok": False,
                    "error": {
                        "class": "InternalError",
                        "message": str(exc),
                        "exit_code": EXIT_INTERNAL,
                    },
                }
            )
        raise typer.Exit(EXIT_INTERNAL) from None
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)


def parse_pairs(values: list[str] | None, what: str) -> dict[str, str]:
    """``K=V`` options into a mapping; a malformed or repeated one is a usage error."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} must be KEY=VALUE, not {item!r}")
        if key in out:
            raise UsageError(f"{what} {key!r} given twice")
        out[key] = value
    return out


def parse_trainer(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    name, sep, version = value.partition("=")
    if not sep or not name:
        raise UsageError(f"--trainer must be NAME=VERSION, not {value!r}")
    return name, version


def show_progress(as_json: bool) -> bool:
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def progress_bar(
    enabled: bool, description: str
) -> Iterator[tuple[Callable[[int], None] | None, Callable[[int], None] | None]]:
    """(on_start, advance) callbacks driving a rich bar with bytes and speed, or (None, None)."""
    if not enabled:
        yield None, None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task(description, total=None)

    def on_start(total: int) -> None:
        progress.update(task, total=total)

    def advance(n: int) -> None:
        progress.advance(task, n)

    with progress:
        yield on_start, advance


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
