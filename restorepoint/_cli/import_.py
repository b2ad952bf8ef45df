"""restorepoint import URL DEST, and restorepoint check URL"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._text import plural
from ..errors import UsageError
from ._common import (
    human_bytes,
    print_json,
    progress_bar,
    run,
    say,
    show_progress,
    warn,
)
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

if TYPE_CHECKING:
    from ..ops import VerifyReport
    from ..trust import Trust

#: What a check without --verify says: the gate passed on the head, and no more was read.
HEAD_ONLY = "compatible (head only; --verify checks the payload)"

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
            f"imported {where}: {plural(len(result.files), 'file')}, {human_bytes(result.bytes)} "
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
    verify_: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="After the gate, verify the whole restore point (every payload digest), "
            "with verify's exit codes.",
        ),
    ] = False,
    identity: IdentityOpt = None,
    base: CommandArg = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The import gate alone: can this restore point be resumed here? Exit 0 or 3. Every field
    it records must match a value known here (detected by --adapter, or given). It reads the
    head only; --verify then reads and checks the whole restore point too."""

    def body() -> None:
        from ..ops import check

        if identity is not None and not verify_:
            raise UsageError("--identity opens the payload: it goes with --verify")
        views = build_views(
            adapter=chosen_adapter(adapter, adapter_option), expect_file=expect,
            trainer=trainer, term=term, key=key, cache_root=cache_root, config=config,
            data=data, command=base or [],
        )  # fmt: skip
        trust = build_trust(trusted, require=require_signature, identity=identity)
        result = check(target(url, use_latest, run_id), views, strict=True, trust=trust)
        step = result.manifest.position.step
        if not verify_:
            if json_:
                print_json(result.to_dict() | {"checked": "head"})
            else:
                say(f"{HEAD_ONLY}: step {step} at {result.url}")
            return
        report = _verify_checked(result.url, result.manifest.id, trust, json_)
        if json_:
            print_json(result.to_dict() | {"checked": "all", "verify": report.to_dict()})
        else:
            say(
                f"compatible and verified: step {step} at {result.url}, "
                f"{plural(report.files, 'file')}, {human_bytes(report.bytes)}"
            )

    run(json_, body)


def _verify_checked(url: str, checked_id: str, trust: Trust, json_: bool) -> VerifyReport:
    """``verify`` of the restore point the gate passed: the same URL, and the same restore
    point (an object replaced between the two reads is a retryable failure, not a pass)."""
    from ..errors import StorageUnavailable
    from ..ops import verify

    with progress_bar(show_progress(json_), "verifying") as (on_start, advance):
        report = verify(url, progress=advance, on_start=on_start, trust=trust)
    if report.manifest.id != checked_id:
        raise StorageUnavailable(
            "the restore point changed between the gate and the verify; run check again",
            url=url,
            expected=checked_id,
            found=report.manifest.id,
        )
    return report
