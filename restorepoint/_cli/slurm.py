"""restorepoint slurm-template -- TRAINER ARGS..."""

from __future__ import annotations

from typing import Annotated

import typer

from ._common import out, parse_pairs, run


def slurm_template_command(
    trainer: Annotated[list[str], typer.Argument(help="The trainer's command line, after --.")],
    job_name: Annotated[str, typer.Option(help="#SBATCH --job-name.")] = "restorepoint",
    lead: Annotated[
        int, typer.Option(help="Seconds of warning before the time limit (--signal=B:USR1@LEAD).")
    ] = 600,
    max_resubmits: Annotated[int, typer.Option(help="Requeue at most this many times.")] = 3,
    stop_signal: Annotated[
        str, typer.Option(help="The trainer's stop request the batch shell forwards USR1 as.")
    ] = "USR2",
    sbatch: Annotated[
        list[str] | None, typer.Option(help="Another #SBATCH option K=V (repeatable).")
    ] = None,
) -> None:
    """Print an sbatch script that implements the requeue-on-42 contract (docs/slurm.md)."""

    def body() -> None:
        from ..slurm import render

        out(
            render(
                trainer,
                job_name=job_name,
                lead=lead,
                max_resubmits=max_resubmits,
                stop_signal=stop_signal,
                sbatch=parse_pairs(sbatch, "--sbatch"),
            )
        )

    run(False, body)
