"""restorepoint run -- TRAINER ARGS..."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError
from ._common import run, warn
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
    command_line_view,
)
from ._trust import RequireOpt, TrustOpt, build_trust

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..ops.gate import Expectations
    from ..ops.publish import HeadSpec
    from ..preempt.watchers import Watcher


def run_command(
    trainer: Annotated[list[str], typer.Argument(help="The trainer's command line, after --.")],
    store: Annotated[str, typer.Option(help="Store URL the restore points go to.")],
    adapter: AdapterOpt = None,
    adapter_option: AdapterOptionOpt = None,
    watch: Annotated[
        str, typer.Option(help="Reclaim notices to watch: aws, gcp or none.")
    ] = "none",
    metadata_url: Annotated[
        str | None, typer.Option(help="The metadata service's base URL (tests: an emulator).")
    ] = None,
    resume_from: Annotated[
        str | None, typer.Option(help="Import this restore point and resume from it.")
    ] = None,
    auto_resume: Annotated[
        bool, typer.Option("--auto-resume", help="Resume from the run's newest restore point.")
    ] = False,
    accept_older: Annotated[
        bool,
        typer.Option(
            "--accept-older",
            help="When the run's newest restore point is refused, resume the newest that passes.",
        ),
    ] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="The run id in the store.")] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="The trainer's output directory (external adapters).")
    ] = None,
    every: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="External trainers: a snapshot every N steps (default: the config's interval).",
        ),
    ] = None,
    operational: Annotated[
        list[str] | None,
        typer.Option(help="Dotted config key left out of the identity (repeatable)."),
    ] = None,
    keep_last: Annotated[
        int,
        typer.Option(min=1, help="External trainers: keep the run's N newest restore points."),
    ] = 1,
    keep_best: Annotated[
        int | None,
        typer.Option(
            min=1, help="Also keep the run's N best by --metric (the trainer's publishes too)."
        ),
    ] = None,
    metric: Annotated[str | None, typer.Option(help="The metric --keep-best ranks by.")] = None,
    mode: Annotated[
        str | None, typer.Option(help="min (the default: lower is better) or max.")
    ] = None,
    keep_local: Annotated[
        int,
        typer.Option(min=0, help="External trainers: keep N local checkpoints (0: all)."),
    ] = 1,
    config: ConfigOpt = None,
    data: DataOpt = None,
    cache_root: CacheRootOpt = None,
    expect: ExpectFile = None,
    trainer_name: TrainerOpt = None,
    term: TermOpt = None,
    key: KeyOpt = None,
    trusted: TrustOpt = None,
    require_signature: RequireOpt = False,
    sign: Annotated[
        Path | None,
        typer.Option(help="Sign every restore point with this Ed25519 key (the trainer's too)."),
    ] = None,
    no_gate: Annotated[
        bool,
        typer.Option("--no-gate", help="Forensics only: resume without the gate (needs --force)."),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow --no-gate.")] = False,
    telemetry: Annotated[
        Path | None, typer.Option(help="Append counts and timings (JSON lines) to this file.")
    ] = None,
    margin: Annotated[float, typer.Option(help="Seconds kept in hand before a deadline.")] = 5.0,
    incremental: Annotated[
        bool | None,
        typer.Option(
            "--incremental/--full",
            help="--full: every restore point carries every byte, in the format older readers "
            "read (the trainer's too). Neither, or --incremental: each references the chunks "
            "the run's newest restore point holds (format 1.2) where it can.",
            show_default=False,
        ),
    ] = None,
    kill_after: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds from the SIGTERM that stops the trainer to a SIGKILL (default 25, "
            "below Slurm's KillWait of 30).",
        ),
    ] = 25.0,
) -> None:
    """Run a trainer under supervision: reclaim notices become published restore points; a
    trainer exit of 42 (resumable) is passed on. A resume is gated by what this machine is
    (exit 3, the trainer not started, when refused)."""

    def body() -> None:
        from ..ops.store import KeepBest
        from ..preempt import AwsWatcher, GcpWatcher, Supervisor, Telemetry
        from ..preempt.supervisor import publishes_itself
        from ..preempt.watchers import AWS_ENDPOINT, GCP_ENDPOINT

        best = KeepBest.of(keep_best, metric, mode)
        if resume_from and auto_resume:
            raise UsageError("--resume-from and --auto-resume exclude each other")
        if no_gate and not force:
            raise UsageError("--no-gate resumes without checking anything: add --force to mean it")
        logging.basicConfig(
            level=logging.INFO, format="restorepoint: %(message)s", stream=sys.stderr
        )
        watcher: Watcher | None
        if watch == "aws":
            watcher = AwsWatcher(metadata_url or AWS_ENDPOINT)
        elif watch == "gcp":
            watcher = GcpWatcher(metadata_url or GCP_ENDPOINT)
        elif watch == "none":
            watcher = None
        else:
            raise UsageError(f"--watch must be aws, gcp or none, not {watch!r}")
        chosen = chosen_adapter(adapter, adapter_option)
        command = list(trainer)
        head = None
        run = run_id
        if chosen is not None and not publishes_itself(chosen):
            if workdir is None:
                raise UsageError(
                    f"the {chosen.name} adapter leaves publishing to the supervisor, which "
                    "needs the trainer's output directory: give --workdir"
                )
            command, head = _external_run(
                chosen, command, config, data, cache_root, trainer_name, term, key,
                operational or [], every, run_id,
            )  # fmt: skip
            run = head.run
        views: list[Expectations] = []
        defer: frozenset[str] = frozenset()
        if resume_from or auto_resume:
            views, defer = _resume_views(
                chosen, command, expect, trainer_name, term, key, cache_root, config, data
            )
        if no_gate:
            warn("--no-gate --force: the resume is not gated (forensics only)")
        supervisor = Supervisor(
            command=command,
            store=store,
            adapter=chosen,
            watcher=watcher,
            resume_from=resume_from,
            auto_resume=auto_resume,
            run=run,
            workdir=workdir,
            telemetry=Telemetry(telemetry),
            margin_s=margin,
            views=views,
            defer=defer,
            gate=not no_gate,
            accept_older=accept_older,
            trust=build_trust(trusted, require=require_signature),
            signing_key=str(sign) if sign is not None else None,
            head=head,
            keep_last=keep_last,
            keep_best=best,
            keep_local=keep_local or None,
            kill_after_s=kill_after,
            incremental=incremental,
        )
        raise typer.Exit(_resumable_through_launcher(supervisor.run_trainer))

    run(False, body)


def _resumable_through_launcher(run_trainer: Callable[[], int]) -> int:
    """Run the trainer with a stop directory of its own (``$RESTOREPOINT_STOP_DIR``), and keep
    the resumable exit through a launcher: torchrun exits 1 when a worker exits 42, so a
    failure whose workers all ended by the stop contract (each left its marker) is exit 42
    (docs/slurm.md, "torchrun")."""
    import os
    import tempfile

    from ..runtime.contract import STOP_DIR_ENV, resumable_exit

    previous = os.environ.get(STOP_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="restorepoint-stop-") as stop_dir:
        os.environ[STOP_DIR_ENV] = stop_dir
        try:
            code = run_trainer()
        finally:
            if previous is None:
                os.environ.pop(STOP_DIR_ENV, None)
            else:
                os.environ[STOP_DIR_ENV] = previous
        mapped = resumable_exit(code, Path(stop_dir))
    if mapped != code:
        logging.getLogger("restorepoint.preempt").info(
            "the trainer's launcher exited %d, and every worker stopped by the contract: exit %d",
            code,
            mapped,
        )
    return mapped


def _external_run(
    adapter: Adapter,
    command: list[str],
    config: Path | None,
    data: Path | None,
    cache_root: str | None,
    trainer: str | None,
    term: list[str] | None,
    key: list[str] | None,
    operational: list[str],
    every: int | None,
    run_id: str | None,
) -> tuple[list[str], HeadSpec]:
    """An external trainer's command with its snapshot-steps flag, and the identity of every
    restore point the loop publishes: this machine's local view (the binary's version, its
    terms, the cache keys of the config and of the data the command names, the cache root),
    the options on top."""
    from ..adapters.external import ExternalAdapter
    from ..format import Position
    from ..ops import load_config
    from ..ops.publish import HeadSpec

    if not isinstance(adapter, ExternalAdapter):
        raise UsageError(f"the {adapter.name} adapter does not run external trainers")
    config_data = load_config(config) if config is not None else None
    interval = every
    if interval is None:
        interval = adapter.checkpoint_every(config_data) if config_data is not None else 0
    command = adapter.add_snapshot_steps(command, interval)
    view = adapter.local_view(config=config_data, data=data, cache_root=cache_root, command=command)
    view = view.merged(command_line_view(trainer, term, key, cache_root, None, None))
    head = HeadSpec.from_view(
        view,
        Position(0),
        operational_keys=[*adapter.operational_keys, *operational],
        run=run_id,
    )
    if head.run is None:
        raise UsageError("an external trainer's restore points need a run: give --run or --config")
    return command, head


def _resume_views(
    adapter: Adapter | None,
    command: list[str],
    expect: Path | None,
    trainer: str | None,
    term: list[str] | None,
    key: list[str] | None,
    cache_root: str | None,
    config: Path | None,
    data: Path | None,
) -> tuple[list[Expectations], frozenset[str]]:
    """This machine's views for a resume. A trainer that gates itself (a ResumableRun: no
    adapter, or the torch adapter) knows its trainer, config and cache keys better than the
    supervisor: the supervisor compares the torch terms it detects and what the options
    give, and defers the fields it does not know to the trainer, which compares everything
    before it trains. Any other trainer is gated here, in full, before it is started."""
    from ..ops.gate import FIELDS, Expectations
    from ..preempt.supervisor import publishes_itself

    if not publishes_itself(adapter):
        views = build_views(
            adapter=adapter, expect_file=expect, trainer=trainer, term=term, key=key,
            cache_root=cache_root, config=config, data=data, command=command,
        )  # fmt: skip
        return views, frozenset()
    views = build_views(
        adapter=None, expect_file=expect, trainer=trainer, term=term, key=key,
        cache_root=cache_root, config=config, data=data,
    )  # fmt: skip
    try:
        from ..runtime.detect import TORCH_TERMS_SOURCE, torch_terms

        detected = Expectations(terms=torch_terms(), sources={"terms": TORCH_TERMS_SOURCE})
        if adapter is not None:
            # A trainer adapter that publishes itself (lightning) detects its terms beyond
            # torch's: a restore point of that trainer records them.
            own = adapter.local_view(cache_root=cache_root)
            detected = Expectations(
                terms=own.terms, sources={"terms": own.source("terms") or TORCH_TERMS_SOURCE}
            )
        views[0] = detected.merged(views[0])
    except ImportError:
        pass  # no torch here: the trainer compares its terms itself
    known = {name for name in FIELDS if any(v.knows(name) for v in views)}
    return views, frozenset(set(FIELDS) - known)
