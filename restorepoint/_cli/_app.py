"""The typer app: the root's options and every verb with an example of its use. Each verb's
module imports what the verb needs inside its function, so that ``--help`` loads none of it
(tests/cli/test_imports.py pins that)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from .._text import printable
from .._version import __version__
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_STDOUT_CLOSED,
    StdoutClosed,
    say,
    stdout_file,
    stdout_gone,
    stdout_to_devnull,
)
from ._trust import keygen_command
from .adapters import adapters_command
from .demo import demo_command
from .fsck import fsck_command
from .import_ import check_command, import_command
from .inspect import inspect_command
from .local_view import local_view_command
from .materialize import materialize_command
from .pack import pack_command
from .run import run_command
from .slurm import slurm_template_command
from .snapshot import snapshot_command
from .store import latest_command, list_command, prune_command
from .verify import verify_command

__all__ = ["EXAMPLES", "app", "main"]

app = typer.Typer(
    name="restorepoint",
    help="Versioned, verified restore points for ML training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        say(f"restorepoint {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Versioned, verified restore points for ML training."""


#: One example per verb, shown at the end of its --help. In this order they are one session, a
#: newcomer's (pack into a store, verify, inspect, import and check with the same config, ...):
#: tests/test_doc_examples.py runs them so, and tests/cli/test_imports.py parses each one.
EXAMPLES: dict[str, str] = {
    "pack": "restorepoint pack checkpoints/ s3://bucket/store/ --run exp1 --step 1200 "
    "--config train.yaml --keep-last 3",
    "verify": "restorepoint verify s3://bucket/store/ --latest --run exp1",
    "inspect": "restorepoint inspect s3://bucket/store/ --latest --run exp1 --head",
    "import": "restorepoint import s3://bucket/store/ restored/ --latest --run exp1 "
    "--config train.yaml --check-keys",
    "check": "restorepoint check s3://bucket/store/ --latest --run exp1 --config train.yaml",
    "local-view": "restorepoint local-view --adapter torch --config train.yaml --data data/",
    "list": "restorepoint list s3://bucket/store/ --run exp1",
    "latest": "restorepoint latest s3://bucket/store/ --run exp1 --verify",
    "prune": "restorepoint prune s3://bucket/store/ --run exp1 --keep-last 3 --dry-run",
    "fsck": "restorepoint fsck s3://bucket/store/ --read-data",
    "materialize": "restorepoint materialize s3://bucket/store/ --latest --run exp1 whole.rp",
    "keygen": "restorepoint keygen signer.key --for signing",
    "adapters": "restorepoint adapters --json",
    "run": "restorepoint run --watch aws --auto-resume --store s3://bucket/store/ "
    "-- python train.py --config train.yaml",
    "snapshot": "restorepoint snapshot runs/exp1 --wait 60",
    "slurm-template": "restorepoint slurm-template --job-name exp1 -- python train.py",
    "demo": "restorepoint demo",
}

_VERBS: dict[str, Callable[..., None]] = {
    "pack": pack_command,
    "verify": verify_command,
    "inspect": inspect_command,
    "import": import_command,
    "check": check_command,
    "local-view": local_view_command,
    "list": list_command,
    "latest": latest_command,
    "prune": prune_command,
    "fsck": fsck_command,
    "materialize": materialize_command,
    "keygen": keygen_command,
    "adapters": adapters_command,
    "run": run_command,
    "snapshot": snapshot_command,
    "slurm-template": slurm_template_command,
    "demo": demo_command,
}
#: Verbs whose trailing arguments are another program's command line (after --).
_PASS_THROUGH = {"run", "slurm-template"}

for _name, _function in _VERBS.items():
    app.command(
        _name,
        epilog=f"Example: {EXAMPLES[_name]}",
        context_settings={"allow_interspersed_args": False} if _name in _PASS_THROUGH else None,
    )(_function)


#: Libraries that restorepoint's storage calls into. Their failures reach us as exceptions,
#: which the CLI reports in one line; what they log besides (gcsfs logs a traceback of every
#: request it gives up on) is noise on the user's terminal, printed by logging's last-resort
#: handler because nothing is configured. RESTOREPOINT_DEBUG=1 shows it.
_QUIET = ("aiobotocore", "aiohttp", "botocore", "fsspec", "gcsfs", "google", "s3fs", "urllib3")


def _quiet_libraries() -> None:
    if os.environ.get("RESTOREPOINT_DEBUG"):
        return
    for name in _QUIET:
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors are one line and exit 2, like every other failure; a
    closed stdout is a quiet exit (``_common.quiet_exit``), here for what click prints itself
    (help, usage) and for the last flush."""
    _quiet_libraries()
    command = typer.main.get_command(app)
    stdout_before = stdout_file()
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
            sys.stderr.write(
                f"restorepoint: usage error: {printable(message)} (see restorepoint --help)\n"
            )
    except KeyboardInterrupt:
        sys.stderr.write("restorepoint: interrupted\n")
        code = EXIT_INTERRUPTED
    except (StdoutClosed, BrokenPipeError):  # outside every verb's run(): click's own output
        stdout_to_devnull()
        code = EXIT_STDOUT_CLOSED
    except SystemExit as exc:
        # click and rich end their own write to a closed stdout (help, usage) with exit 1.
        if exc.code != 1 or not stdout_gone(stdout_before):
            raise
        stdout_to_devnull()
        code = EXIT_STDOUT_CLOSED
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()
        code = code or EXIT_STDOUT_CLOSED
    sys.exit(code if isinstance(code, int) else 0)
