"""The command line: a typer app, one module per verb; errors become exit codes in _common."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .._version import __version__
from ._common import EXIT_INTERRUPTED
from ._trust import keygen_command
from .adapters import adapters_command
from .demo import demo_command
from .import_ import check_command, import_command
from .inspect import inspect_command
from .local_view import local_view_command
from .pack import pack_command
from .run import run_command, snapshot_command
from .slurm import slurm_template_command
from .store import latest_command, list_command, prune_command
from .verify import verify_command

__all__ = ["app", "main"]

app = typer.Typer(
    name="restorepoint",
    help="Versioned, verified restore points for ML training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"restorepoint {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Versioned, verified restore points for ML training."""


app.command("pack")(pack_command)
app.command("verify")(verify_command)
app.command("inspect")(inspect_command)
app.command("import")(import_command)
app.command("check")(check_command)
app.command("local-view")(local_view_command)
app.command("list")(list_command)
app.command("latest")(latest_command)
app.command("prune")(prune_command)
app.command("keygen")(keygen_command)
app.command("adapters")(adapters_command)
app.command("run", context_settings={"allow_interspersed_args": False})(run_command)
app.command("snapshot")(snapshot_command)
app.command("slurm-template", context_settings={"allow_interspersed_args": False})(
    slurm_template_command
)
app.command("demo")(demo_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors are one line and exit 2, like every other failure."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="restorepoint", standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("restorepoint: interrupted\n")
        code = EXIT_INTERRUPTED
    except typer.TyperException as exc:
        format_message = getattr(exc, "format_message", None)
        message = format_message() if callable(format_message) else str(exc)
        message = " ".join(str(message).split())
        code = getattr(exc, "exit_code", 2)
        if message:  # empty when click has already printed the help (no arguments at all)
            sys.stderr.write(f"restorepoint: usage error: {message} (see restorepoint --help)\n")
    except KeyboardInterrupt:
        sys.stderr.write("restorepoint: interrupted\n")
        code = EXIT_INTERRUPTED
    sys.stdout.flush()
    sys.exit(code if isinstance(code, int) else 0)
