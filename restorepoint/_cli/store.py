"""restorepoint list STORE, latest STORE, prune STORE; and --latest for the reading verbs."""

from __future__ import annotations

from typing import Annotated

import typer

from .._text import plural
from ..errors import UsageError
from ._common import human_bytes, print_json, run, say
from ._trust import IdentityOpt, TrustOpt, build_trust

RunOpt = Annotated[str | None, typer.Option("--run", help="Only this run's restore points.")]
LatestOpt = Annotated[
    bool,
    typer.Option("--latest", help="URL is a store: use its newest restore point (of --run)."),
]


def target(url: str, use_latest: bool, run_id: str | None) -> str:
    """The restore point a reading verb works on: URL itself, or the store's newest."""
    if use_latest:
        from ..ops.store import latest

        return latest(url, run=run_id).url
    if run_id is not None:
        raise UsageError("--run goes with --latest (or with list, latest and prune)")
    return url


def list_command(
    store: Annotated[str, typer.Argument(help="Store URL (a prefix).")],
    run_id: RunOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The restore points in a store, newest first (per run)."""

    def body() -> None:
        from ..ops.store import list_store

        entries = list_store(store, run=run_id)
        if json_:
            print_json(
                {"ok": True, "restore_points": [e.to_dict() for e in entries], "store": store}
            )
            return
        for e in entries:
            info = e.to_dict()
            say(
                f"{e.run}  step {e.step:>10}  {info['created']}  {human_bytes(e.size):>10}  {e.url}"
            )

    run(json_, body)


def latest_command(
    store: Annotated[str, typer.Argument(help="Store URL (a prefix).")],
    run_id: RunOpt = None,
    verify_it: Annotated[
        bool, typer.Option("--verify", help="The newest restore point that verifies.")
    ] = False,
    trusted: TrustOpt = None,
    identity: IdentityOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The URL of the newest complete restore point (of --run); with --verify, the newest
    that verifies end to end."""

    def body() -> None:
        from ..ops.store import latest

        entry = latest(
            store, run=run_id, verify_it=verify_it, trust=build_trust(trusted, identity=identity)
        )
        if json_:
            print_json({"ok": True, **entry.to_dict()})
        else:
            say(entry.url)

    run(json_, body)


def prune_command(
    store: Annotated[str, typer.Argument(help="Store URL (a prefix).")],
    keep_last: Annotated[
        int | None, typer.Option(min=1, help="Keep the N newest restore points of each run.")
    ] = None,
    keep_every: Annotated[
        int | None,
        typer.Option(min=1, help="Also keep the newest of every STEPS-step interval."),
    ] = None,
    keep_within: Annotated[
        str | None,
        typer.Option(help="Also keep those created within DURATION of the run's newest (6h, 7d)."),
    ] = None,
    keep_best: Annotated[
        int | None,
        typer.Option(min=1, help="Also keep the N best of each run by --metric."),
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="The metric --keep-best ranks by (restore points without it: never best)."
        ),
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="min (the default: lower is better) or max.")
    ] = None,
    run_id: RunOpt = None,
    grace: Annotated[
        str | None,
        typer.Option(
            help="Leave leftovers of uploads younger than this alone (longer than any upload; "
            "default 24h)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go and why the rest stays.")
    ] = False,
    trusted: TrustOpt = None,
    identity: IdentityOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Delete the restore points no retention rule keeps (never a run's newest, nor the
    newest that verifies, nor anything newer, nor what a live run resumed from), and leftovers
    of interrupted uploads."""

    def body() -> None:
        from ..ops.store import DEFAULT_GRACE_S, prune

        report = prune(
            store,
            keep_last=keep_last,
            keep_every=keep_every,
            keep_within=keep_within,
            keep_best=keep_best,
            metric=metric,
            mode=mode,
            run=run_id,
            dry_run=dry_run,
            grace=DEFAULT_GRACE_S if grace is None else grace,
            trust=build_trust(trusted, identity=identity),
        )
        if json_:
            print_json(report.to_dict())
            return
        verb = "would delete" if dry_run else "deleted"
        for plan in report.runs:
            for entry, reasons in plan.keep:
                say(f"keep    {entry.url}  ({'; '.join(reasons)})")
            for entry in plan.delete:
                say(f"{'delete' if dry_run else 'deleted'} {entry.url}")
        for leftover in report.leftovers:
            say(f"{'delete' if dry_run else 'deleted'} {leftover}  (leftover)")
        total = sum(len(p.delete) for p in report.runs)
        say(
            f"{verb} {plural(total, 'restore point')} and "
            f"{plural(len(report.leftovers), 'leftover')}"
        )

    run(json_, body)
