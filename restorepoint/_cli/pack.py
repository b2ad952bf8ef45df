"""restorepoint pack SOURCE DEST"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._text import plural, printable
from ..errors import UsageError
from ._common import (
    error_line,
    human_bytes,
    parse_pairs,
    print_json,
    progress_bar,
    run,
    say,
    show_progress,
)
from ._expect import command_line_view

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..trust import PublicKey


def pack_command(  # noqa: PLR0915 - the pack verb's option combinations, each refused or honoured here
    source: Annotated[Path, typer.Argument(help="Checkpoint directory or file.")],
    dest: Annotated[str, typer.Argument(help="URL of the restore point (path, s3://, gs://).")],
    step: Annotated[
        int | None,
        typer.Option(min=0, help="Global training step of the checkpoint (or from --adapter)."),
    ] = None,
    epoch: Annotated[int | None, typer.Option(min=0, help="Epoch of the position.")] = None,
    batch: Annotated[
        int | None,
        typer.Option(min=0, help="Effective batches of EPOCH fully committed (needs --epoch)."),
    ] = None,
    trainer: Annotated[str | None, typer.Option(help="Trainer as NAME=VERSION.")] = None,
    config: Annotated[
        Path | None, typer.Option(help="Training config: JSON, YAML or TOML.")
    ] = None,
    operational: Annotated[
        list[str] | None,
        typer.Option(help="Dotted config key left out of the identity (repeatable)."),
    ] = None,
    key: Annotated[list[str] | None, typer.Option(help="Cache key K=V (repeatable).")] = None,
    term: Annotated[
        list[str] | None, typer.Option(help="Version term K=V that must match on import.")
    ] = None,
    cache_root: Annotated[str | None, typer.Option(help="Cache root of the run.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Data directory: its digest is a cache key (data, or the adapter's)."),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run", help="Run id (default: derived from the config identity)."),
    ] = None,
    keep_last: Annotated[
        int | None,
        typer.Option(min=1, help="DEST is a store: then prune the run to its N newest."),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric", help="A metric NAME=VALUE the restore point records (repeatable)."
        ),
    ] = None,
    keep_best: Annotated[
        int | None,
        typer.Option(
            min=1, help="DEST is a store: the prune also keeps the run's N best (--best-metric)."
        ),
    ] = None,
    best_metric: Annotated[
        str | None, typer.Option(help="The metric --keep-best ranks by.")
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="min (the default: lower is better) or max.")
    ] = None,
    codec: Annotated[
        str,
        typer.Option(
            help="auto: each chunk as is, zstd or byte planes, whichever is smallest (needs a "
            "reader with planes/1); zstd: every chunk compressed whole; none: stored as is."
        ),
    ] = "auto",
    level: Annotated[
        int,
        typer.Option(
            min=-7,
            max=22,
            help="zstd level of what is compressed whole; 0 stores the payload uncompressed.",
        ),
    ] = 1,
    object_sha256: Annotated[
        bool,
        typer.Option(
            "--object-sha256",
            help="Also print the whole object's sha256 (a second pass over every stored byte).",
        ),
    ] = False,
    sign: Annotated[
        list[Path] | None,
        typer.Option("--sign", help="Sign with this Ed25519 private key (repeatable)."),
    ] = None,
    encrypt_to: Annotated[
        list[Path] | None,
        typer.Option(
            "--encrypt-to", help="Encrypt the payload to this X25519 public key (repeatable)."
        ),
    ] = None,
    adapter: Annotated[
        str | None,
        typer.Option(help="Fill trainer, step and payload from this adapter (see `adapters`)."),
    ] = None,
    adapter_option: Annotated[
        list[str] | None, typer.Option(help="An adapter option K=V (repeatable).")
    ] = None,
    handoff: Annotated[
        Path | None,
        typer.Option(help="Also write a handoff file (JSON) for `import --expect` elsewhere."),
    ] = None,
    incremental: Annotated[
        bool | None,
        typer.Option(
            "--incremental/--full",
            help="--incremental: reference the chunks the run's newest restore point in the "
            "store holds instead of uploading them again (format 1.2, delta/1); --full: every "
            "byte, in the format older readers read (1.0). Neither: incremental into a store "
            "DEST unless encrypted, full elsewhere.",
            show_default=False,
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            help="Seconds from now within which the store must answer (a stop's time left): "
            "no retry waits past it.",
        ),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Pack a checkpoint into a restore point, published atomically at DEST."""
    # The deadline counts from the command's start, the time it takes to read options included.
    until = None if deadline is None else time.monotonic() + deadline

    def body() -> None:  # noqa: PLR0912, PLR0915 - the pack verb's option combinations, each refused or honoured here
        from ..format import Position
        from ..ops import load_config
        from ..ops.publish import HeadSpec, PackOptions, publish
        from ..ops.store import KeepBest
        from ..storage import store_deadline

        if batch is not None and epoch is None:
            raise UsageError("--batch needs --epoch")
        if deadline is not None and not deadline > 0:
            raise UsageError(f"--deadline {deadline:g}: give a number of seconds above 0")
        best = KeepBest.of(keep_best, best_metric, mode, "--best-metric")
        metrics = parse_metrics(metric)
        config_data = load_config(config) if config is not None else None
        options = command_line_view(trainer, term, key, cache_root, config_data, data)
        operational_keys = list(operational or [])
        include = None
        source_dir = source
        if adapter is not None:
            from ..adapters.base import load_adapter

            chosen = load_adapter(adapter, **parse_pairs(adapter_option, "--adapter-option"))
            snap = chosen.newest_snapshot(source)
            if snap is None:
                raise UsageError(f"{source}: the {adapter} adapter finds no committed snapshot")
            # The head is this machine's local view, so that the same view elsewhere passes
            # the gate; the options override what the adapter detects.
            view = chosen.local_view(config=config_data, data=data, cache_root=cache_root)
            options = view.merged(command_line_view(trainer, term, key, cache_root, None, None))
            # The trainer's own operational keys (its snapshot interval) never move the run.
            operational_keys += getattr(chosen, "operational_keys", ())
            source_dir, include = snap.root, list(snap.files)
            default_position: Position | None = snap.position
        else:
            default_position = None
        if step is not None:
            position = Position(step=step, epoch=epoch, batch=batch)
        elif default_position is not None:
            position = default_position
        else:
            raise UsageError("--step is required (or --adapter, which knows the step)")
        head = HeadSpec.from_view(options, position, operational_keys=operational_keys, run=run_id)
        if metrics:
            head = head.at(head.manifest.position, metrics)
        pack_options = PackOptions(
            level=level,
            codec=codec,
            object_sha256=object_sha256,
            sign=_signing_keys(sign),
            encrypt_to=_encryption_keys(encrypt_to),
            incremental=incremental,
        )
        with (
            store_deadline(until) if until is not None else contextlib.nullcontext(),
            progress_bar(show_progress(json_), "packing") as (on_start, advance),
        ):
            done = publish(
                source_dir, dest, head, pack_options, include=include, keep_last=keep_last,
                keep_best=best, handoff=handoff, progress=advance, on_start=on_start,
            )  # fmt: skip
        result = done.pack
        if not json_:
            say(
                f"packed {plural(result.files, 'file')}, {human_bytes(result.bytes)} -> "
                f"{human_bytes(result.size)} in {result.seconds:.2f} s"
            )
            if result.incremental is not None:
                say(f"reused {human_bytes(result.reused)} ({printable(result.incremental)})")
            say(f"digest {result.digest}")
            if result.sha256 is not None:
                say(f"sha256 {result.sha256}")
            say(result.url)
            for url in done.pruned.deleted if done.pruned is not None else ():
                say(f"deleted {url}")
        if done.prune_error is not None:
            exc = done.prune_error
            error_line(f"published {result.url}, but the prune failed: {exc}")
            if json_:
                print_json(done.to_dict())
            raise typer.Exit(exc.exit_code)
        if json_:
            print_json(done.to_dict())

    run(json_, body)


def _signing_keys(paths: list[Path] | None) -> tuple[Ed25519PrivateKey, ...]:
    if not paths:
        return ()  # and cryptography stays unloaded (25 ms of start-up)
    from ..trust import load_signing_key

    return tuple(load_signing_key(p) for p in paths)


def _encryption_keys(paths: list[Path] | None) -> tuple[PublicKey, ...]:
    if not paths:
        return ()
    from ..trust import load_public

    return tuple(load_public(p, "encryption") for p in paths)


def parse_metrics(pairs: list[str] | None) -> dict[str, int | float]:
    """``NAME=VALUE`` options as metrics: an integer stays one, anything else is a float; the
    head's own check (spec 4.3) refuses a bad name, a non-finite value, or too many."""
    out: dict[str, int | float] = {}
    for pair in pairs or []:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--metric wants NAME=VALUE, not {printable(pair)}")
        if name in out:
            raise UsageError(f"--metric {printable(name)} is given twice")
        try:
            out[name] = int(text)
        except ValueError:
            try:
                out[name] = float(text)
            except ValueError:
                raise UsageError(f"--metric {printable(name)}: not a number") from None
    return out
