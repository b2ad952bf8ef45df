"""The sbatch template (docs/slurm.md explains every line)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ..errors import UsageError

__all__ = ["render"]

_TEMPLATE = """\
#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --requeue
#SBATCH --signal=B:USR1@{lead}
#SBATCH --open-mode=append
{sbatch_lines}
# The restorepoint Slurm contract (docs/slurm.md):
# - --requeue makes the job eligible for requeue; --signal=B:USR1@{lead} sends the batch shell
#   USR1 {lead} s before the time limit (and at preemption, with preempt_send_user_signal);
# - the batch shell ignores TERM, so the step's handler owns preemption;
# - the batch shell forwards USR1 to the step as {stop_signal}, the trainer's stop request: it
#   snapshots, publishes its restore point and exits {resumable};
# - on exit {resumable} a job still running requeues itself, at most {max_resubmits} times
#   (reaching the time limit never requeues by itself); on requeue SLURM_RESTART_COUNT is 1, 2, ...
#   A ResumableRun takes the same bound from RESTOREPOINT_MAX_RESUBMITS: one count, one limit;
# - every process that stops by the contract leaves a marker in RESTOREPOINT_STOP_DIR: a step
#   that failed (torchrun exits 1 when a worker exits {resumable}) while every process of the
#   node stopped by the contract is taken as exit {resumable}.
set -u
max_resubmits={max_resubmits}
restarts="${{SLURM_RESTART_COUNT:-0}}"
export RESTOREPOINT_MAX_RESUBMITS="$max_resubmits"
own_stop_dir=""
if [ -z "${{RESTOREPOINT_STOP_DIR:-}}" ]; then
    own_stop_dir="${{TMPDIR:-/tmp}}/restorepoint-stop-$SLURM_JOB_ID"
fi
stop_dir="${{RESTOREPOINT_STOP_DIR:-$own_stop_dir}}"
export RESTOREPOINT_STOP_DIR="$stop_dir"
mkdir -p "$stop_dir"
rm -f "$stop_dir"/stopped-*-of-*.json "$stop_dir"/refused-*-of-*.json
# Every process of this node left its marker: local ranks 0 to N-1 of one N (contract.py).
stopped_by_contract() {{
    local world="" n=0 f name rank w
    for f in "$stop_dir"/stopped-*-of-*.json; do
        [ -e "$f" ] || return 1
        name="${{f##*/}}"
        rank="${{name#stopped-}}"
        rank="${{rank%%-of-*}}"
        w="${{name##*-of-}}"
        w="${{w%.json}}"
        case "$rank$w" in *[!0-9]*) return 1 ;; esac
        [ -n "$world" ] || world="$w"
        [ "$w" = "$world" ] && [ "$rank" -lt "$world" ] || return 1
        n=$((n + 1))
    done
    [ -n "$world" ] && [ "$n" -eq "$world" ]
}}
trap '' TERM
child=""
forward() {{
    if [ -n "$child" ]; then
        kill -s {stop_signal} "$child" 2>/dev/null || true
    fi
}}
trap forward USR1
echo "restorepoint: job $SLURM_JOB_ID start, restart count $restarts" >&2
srun --kill-on-bad-exit=1 {command} &
child=$!
# wait returns early whenever a trapped signal arrives: wait until the step is really gone,
# then once more for its status (bash keeps it): a step that exited just after the signal
# interrupted a wait would otherwise leave that wait's 128+N as the exit code.
while kill -0 "$child" 2>/dev/null; do
    wait "$child"
done
wait "$child"
code=$?
echo "restorepoint: step exited $code" >&2
if [ "$code" -ne 0 ] && [ "$code" -ne {resumable} ] && stopped_by_contract; then
    echo "restorepoint: every process stopped by the contract: exit {resumable}" >&2
    code={resumable}
fi
rm -f "$stop_dir"/stopped-*-of-*.json "$stop_dir"/refused-*-of-*.json
if [ -n "$own_stop_dir" ]; then
    rmdir "$own_stop_dir" 2>/dev/null || true
fi
if [ "$code" -eq {resumable} ]; then
    # Requeue only a job that is still running. scancel, scontrol requeue and the end of a
    # preemption's GraceTime TERM the step too, and the trainer answers TERM with 42: the job
    # is then already COMPLETING, and a requeue here would undo a cancel (Slurm requeues a
    # preempted job itself under PreemptMode=REQUEUE).
    state="$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*')"
    if [ -n "$state" ] && [ "$state" != "JobState=RUNNING" ]; then
        echo "restorepoint: resumable exit, but the job is ${{state#JobState=}}: no requeue" >&2
        exit "$code"
    fi
    if [ "$restarts" -lt "$max_resubmits" ]; then
        echo "restorepoint: resumable exit: requeue $((restarts + 1)) of $max_resubmits" >&2
        if scontrol requeue "$SLURM_JOB_ID"; then
            exit 0
        fi
        # Not requeued (the job is not requeueable, say): the job must not end COMPLETED.
        echo "restorepoint: scontrol requeue failed" >&2
        exit "$code"
    fi
    echo "restorepoint: resumable exit, but the resubmit limit ($max_resubmits) is reached" >&2
fi
exit "$code"
"""


def render(  # noqa: PLR0913 - the template's documented options, keyword-only
    command: Sequence[str],
    *,
    job_name: str = "restorepoint",
    lead: int = 600,
    max_resubmits: int = 3,
    stop_signal: str = "USR2",
    sbatch: Mapping[str, str] | None = None,
) -> str:
    """The sbatch script for ``command`` (the trainer's argv)."""
    if not command:
        raise UsageError("give the trainer's command after --")
    if lead < 1 or max_resubmits < 0:
        raise UsageError("--lead must be positive and --max-resubmits non-negative")
    signal_name = stop_signal.upper().removeprefix("SIG")
    if signal_name not in {"USR1", "USR2", "TERM", "INT"}:
        raise UsageError(f"--stop-signal must be USR1, USR2, TERM or INT, not {stop_signal!r}")
    lines = []
    for key, value in (sbatch or {}).items():
        if not key or any(c.isspace() for c in key) or "\n" in value:
            raise UsageError(f"bad sbatch option {key!r}")
        lines.append(f"#SBATCH --{key}={value}" if value else f"#SBATCH --{key}")
    return _TEMPLATE.format(
        job_name=job_name,
        lead=lead,
        max_resubmits=max_resubmits,
        stop_signal=signal_name,
        resumable=42,
        sbatch_lines="\n".join(lines),
        command=shlex.join(command),
    )
