"""What every verb shares: errors to exit codes (in this one place), --json output, key=value
options, the progress bar, and escaping: every line printed goes through ``printable``,
because what a restore point or a store holds (terms, trainer names, paths, feature names,
listed names) is anyone's, and a terminal acts on the control characters in it."""

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

from .._text import printable
from ..errors import RestorePointError, UsageError

T = TypeVar("T")

#: A bug, not a documented failure: never expected, reported as one line all the same.
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
#: The reader of stdout went away (``restorepoint list ... | head -1``): what a shell reports for
#: a program that SIGPIPE ended, as git is, with nothing on stderr.
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE


class StdoutClosed(BaseException):
    """A write to stdout found no reader. A BaseException, so that no ``except Exception`` on
    the way takes it for the verb's own failure: ``run`` and the entry point end quietly."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every publisher discards cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def out(text: str) -> None:
    """``text`` on stdout as it is (the caller escapes what it took from outside), flushed: the
    one way output is written, so that a closed stdout is noticed in one place."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed from None


def say(line: str) -> None:
    """One line of output on stdout, escaped: the way every verb prints data."""
    out(printable(line) + "\n")


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on), escaped like every other line."""
    sys.stderr.write(f"restorepoint: warning: {printable(message.replace(chr(10), ' '))}\n")
    sys.stderr.flush()


def print_json(data: Any) -> None:
    # json.dumps escapes the C0 controls, but leaves DEL, the C1 controls, bidi overrides and
    # the like as they are: as \u escapes they are the same JSON, and harmless on a terminal.
    text = json.dumps(data, sort_keys=True, ensure_ascii=False)
    if not text.isprintable():
        text = "".join(char if char.isprintable() else _json_escape(char) for char in text)
    out(text + "\n")


def error_line(message: str, *details: str) -> None:
    """``restorepoint: error: MESSAGE`` on stderr, then one indented line for each detail,
    all escaped: the one way an error reaches the terminal."""
    sys.stderr.write(f"restorepoint: error: {printable(message.replace(chr(10), ' '))}\n")
    for detail in details:
        sys.stderr.write(f"restorepoint:   {printable(detail)}\n")
    sys.stderr.flush()


def fail(exc: RestorePointError, as_json: bool) -> NoReturn:
    """One line on stderr (and the error as data on stdout with --json), then the exit code.
    A gate refusal adds one line for every mismatch: field, expected, found."""
    error_line(str(exc), *(getattr(exc, "details", None) or ()))
    if as_json:
        _json_last({"ok": False, "error": exc.to_dict()})
    raise typer.Exit(exc.exit_code)


def quiet_exit() -> NoReturn:
    """End the command for a closed stdout, as git does: nothing on stderr, the exit status a
    SIGPIPE gives. What is still buffered for stdout goes to /dev/null, so that the flush at
    interpreter shutdown cannot fail again (the Python docs' advice for SIGPIPE; the signal
    itself stays ignored, as Python sets it, because a store's socket may raise it too)."""
    stdout_to_devnull()
    raise typer.Exit(EXIT_STDOUT_CLOSED)


def stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null: what is left in its buffer is dropped quietly."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no real stdout (embedded)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def stdout_file() -> tuple[int, int] | None:
    """Which file stdout's descriptor is (device, inode), to tell later whether it changed."""
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (embedded)
        return None
    return st.st_dev, st.st_ino


def stdout_gone(before: tuple[int, int] | None) -> bool:
    """Whether stdout lost its reader, for a failure that reached us as something else than
    our own write's: its pipe or socket says so (POLLERR, POLLHUP), or someone has pointed it
    at /dev/null since ``before`` (rich does, then exits 1, when it prints click's help)."""
    import select

    now = stdout_file()
    if now is not None and now != before:
        st = os.stat(os.devnull)
        if now == (st.st_dev, st.st_ino):
            return True
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout, or no poll() here
        return False


def _json_last(data: Any) -> None:
    """The error as data on stdout after the stderr line; a closed stdout loses only that, and
    the exit code stays the error's."""
    try:
        print_json(data)
    except StdoutClosed:
        stdout_to_devnull()


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
    except StdoutClosed:
        quiet_exit()
    except Terminated:
        sys.stderr.write("restorepoint: terminated; nothing was published\n")
        raise typer.Exit(128 + signal.SIGTERM) from None
    except KeyboardInterrupt:
        sys.stderr.write("restorepoint: interrupted; nothing was published\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        if os.environ.get("RESTOREPOINT_DEBUG"):
            traceback.print_exc()
        detail = printable(f"{type(exc).__name__}: {exc}".replace("\n", " "))
        sys.stderr.write(
            f"restorepoint: internal error (a bug; set RESTOREPOINT_DEBUG=1 for details): "
            f"{detail}\n"
        )
        if as_json:
            _json_last(
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
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    # rich's own byte columns count in kB and MB (powers of 1000); every summary line here
    # is in KiB and MiB (human_bytes). One unit system: the bar's columns use human_bytes too.
    class Bytes(ProgressColumn):
        def render(self, task: Task) -> Text:
            total = "?" if task.total is None else human_bytes(int(task.total))
            return Text(f"{human_bytes(int(task.completed))}/{total}", style="progress.download")

    class Speed(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            shown = "?" if speed is None else f"{human_bytes(int(speed))}/s"
            return Text(shown, style="progress.data.speed")

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        Bytes(),
        Speed(),
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
