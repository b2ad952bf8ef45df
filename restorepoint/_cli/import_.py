"""restorepoint import URL DEST, and restorepoint check URL"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from ._common import human_bytes, print_json, progress_bar, run, say, show_progress, warn
from ._expect import (
    AdapterOpt,
    AdapterOptionOpt,
    CacheRootOpt,
    ConfigOpt,
    DataOpt,
    ExpectFile,
    KeyOpt,
    TermOpt,
    TrainerOpt,
    build_views,
    chosen_adapter,
    require_some,
)
from ._trust import IdentityOpt, RequireOpt, TrustOpt, build_trust
from .store import LatestOpt, RunOpt, target

CommandArg = Annotated[
    list[str] | None,
    typer.Argument(help="After --: the trainer's command line (the adapter reads and extends it)."),
]


def import_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point.")],
    dest: Annotated[Path, typer.Argument(help="Local directory to unpack into.")],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    check_keys: Annotated[
        bool,
        typer.Option(
            "--check-keys",
            help="Refuse unless every field the restore point records matches a value known here.",
        ),
    ] = False,
    expect: ExpectFile = None,
    trainer: TrainerOpt = None,
    term: TermOpt = None,
    key: KeyOpt = None,
    cache_root: CacheRootOpt = None,
    config: ConfigOpt = None,
    data: DataOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a non-empty DEST atomically.")
    ] = False,
    trusted: TrustOpt = None,
    require_signature: RequireOpt = False,
    identity: IdentityOpt = None,
    adapter: AdapterOpt = None,
    adapter_option: AdapterOptionOpt = None,
    exec_: Annotated[
        bool,
        typer.Option("--exec", help="With --adapter: run the resume command (always gated)."),
    ] = False,
    no_gate: Annotated[
        bool,
        typer.Option("--no-gate", help="Forensics only: import without any gate (warns)."),
    ] = False,
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            min=0,
            help="A multi-part restore point: import only the shared part and this rank's.",
        ),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option(
            "--world-size",
            min=1,
            help="The world this import resumes: another than the restore point's is refused "
            "(exit 3) unless its state reshards.",
        ),
    ] = None,
    base: CommandArg = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check a restore point against this machine, then verify and unpack it into DEST."""

    def body() -> None:  # noqa: PLR0912 - the import verb's option combinations, each refused or honoured here
        from ..ops import import_restore_point

        if exec_ and adapter is None:
            raise UsageError("--exec needs --adapter")
        chosen = chosen_adapter(adapter, adapter_option)
        strict = check_keys or exec_
        if no_gate:
            if strict:
                raise UsageError("--no-gate is for forensics: not with --check-keys or --exec")
            views = []
            warn("--no-gate: nothing is checked against this machine (forensics only)")
        else:
            views = build_views(
                adapter=chosen, expect_file=expect, trainer=trainer, term=term, key=key,
                cache_root=cache_root, config=config, data=data, command=base or [],
            )  # fmt: skip
            if check_keys:
                require_some(views)
        with progress_bar(show_progress(json_), "importing") as (on_start, advance):
            result = import_restore_point(
                target(url, use_latest, run_id),
                dest,
                expect=views,
                strict=strict,
                force=force,
                progress=advance,
                on_start=on_start,
                trust=build_trust(trusted, require=require_signature, identity=identity),
                rank=rank,
                world_size=world_size,
            )
        if not result.gated and not no_gate:
            warn(
                "nothing was checked: the import is not gated (give --check-keys with "
                "--adapter, --expect or expected values)"
            )
        command = None
        if chosen is not None:
            command = chosen.resume_command(Path(result.dest), result.manifest, base or [])
        if json_:
            out = result.to_dict()
            if command is not None:
                out["resume_command"] = command
            print_json(out)
        if command is not None and exec_:
            # Become the trainer: signals (a preemption's SIGTERM) reach it directly, and its
            # exit code (42) is the command's.
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                os.execvp(command[0], command)  # noqa: S606 - the adapter's own command
            except OSError as exc:
                raise UsageError(f"cannot run {command[0]!r}: {exc.strerror}") from None
        if json_:
            return
        pos = result.manifest.position
        where = f"step {pos.step}" + (f", epoch {pos.epoch}" if pos.epoch is not None else "")
        where += f", batch {pos.batch}" if pos.batch is not None else ""
        say(
            f"imported {where}: {len(result.files)} files, {human_bytes(result.bytes)} "
            f"verified into {result.dest} in {result.seconds:.2f} s"
        )
        if command is not None:
            say(shlex.join(command))

    run(json_, body)


def check_command(
    url: Annotated[str, typer.Argument(help="URL of the restore point.")],
    use_latest: LatestOpt = False,
    run_id: RunOpt = None,
    expect: ExpectFile = None,
    trainer: TrainerOpt = None,
    term: TermOpt = None,
    key: KeyOpt = None,
    cache_root: CacheRootOpt = None,
    config: ConfigOpt = None,
    data: DataOpt = None,
    adapter: AdapterOpt = None,
    adapter_option: AdapterOptionOpt = None,
    trusted: TrustOpt = None,
    require_signature: RequireOpt = False,
    base: CommandArg = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The import gate alone: can this restore point be resumed here? Exit 0 or 3. Every field
    it records must match a value known here (detected by --adapter, or given)."""

    def body() -> None:
        from ..ops import check

        views = build_views(
            adapter=chosen_adapter(adapter, adapter_option), expect_file=expect,
            trainer=trainer, term=term, key=key, cache_root=cache_root, config=config,
            data=data, command=base or [],
        )  # fmt: skip
        result = check(
            target(url, use_latest, run_id),
            views,
            strict=True,
            trust=build_trust(trusted, require=require_signature),
        )
        if json_:
            print_json(result.to_dict())
        else:
            say(f"compatible: step {result.manifest.position.step} ({result.url})")

    run(json_, body)
