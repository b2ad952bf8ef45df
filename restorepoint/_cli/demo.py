"""restorepoint demo: the README's main command.

For now it shows the core on a sample checkpoint: pack it, verify it, inspect it, then prove
that a damaged copy is refused. (The preempt-and-resume demo with a real PyTorch run replaces
this once the torch runtime exists.)"""

from __future__ import annotations

import array
import json
import random
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from ..errors import IntegrityError, UsageError
from ..ops import pack, read_manifest, verify
from ._common import human_bytes, print_json, run
from .inspect import render


def write_sample_checkpoint(directory: Path, seed: int = 0) -> dict[str, object]:
    """A checkpoint-like directory: float32 'weights', an 'optimizer' file, trainer state."""
    rng = random.Random(seed)  # noqa: S311 - sample data, not secrets
    directory.mkdir(parents=True, exist_ok=True)
    weights = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(1 << 20)))
    (directory / "model.bin").write_bytes(weights.tobytes())
    moments = array.array("f", (rng.gauss(0.0, 1e-3) for _ in range(1 << 19)))
    (directory / "optimizer.bin").write_bytes(moments.tobytes())
    state = {"global_step": 1500, "epoch": 3, "batch_in_epoch": 20}
    (directory / "trainer_state.json").write_text(json.dumps(state))
    return {
        "model": {"width": 1024, "depth": 1},
        "optimizer": {"lr": 0.001, "betas": [0.9, 0.999]},
        "seed": seed,
        "train": {"checkpoint_every": 500, "auto_resume": True},
    }


def demo_command(
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the demo's files (default: a temp dir).")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Pack a sample checkpoint, verify and inspect it, and show a damaged copy refused."""

    def body() -> None:
        with tempfile.TemporaryDirectory(prefix="restorepoint-demo-") as tmp:
            base = workdir or Path(tmp)
            if workdir is not None and workdir.exists() and any(workdir.iterdir()):
                raise UsageError(f"--workdir {workdir} is not empty")
            source = base / "checkpoint"
            config = write_sample_checkpoint(source)
            url = str(base / "store" / "run-step1500.rp")
            packed = pack(
                source,
                url,
                position=1500,
                trainer=("demo-trainer", "1.0"),
                config=config,
                operational_keys=["train.checkpoint_every", "train.auto_resume"],
                cache_keys={"dataset": "synthetic-v1"},
                terms={"framework": "none"},
            )
            checked = verify(url)
            manifest = read_manifest(url)
            damaged = base / "store" / "damaged.rp"
            data = bytearray(Path(url).read_bytes())
            data[len(data) // 2] ^= 0xFF
            damaged.write_bytes(bytes(data))
            try:
                verify(str(damaged))
            except IntegrityError as exc:
                refused = f"{type(exc).__name__} ({exc.member or 'structure'}): {exc.message}"
            else:  # pragma: no cover - would be a bug
                raise AssertionError("a damaged restore point verified")
            if json_:
                print_json(
                    {
                        "ok": True,
                        "pack": packed.to_dict(),
                        "verify": checked.to_dict(),
                        "damaged_copy_refused": refused,
                    }
                )
                return
            typer.echo(
                f"packed   {packed.files} files, {human_bytes(packed.bytes)} -> "
                f"{human_bytes(packed.size)} in {packed.seconds:.2f} s: {url}"
            )
            typer.echo(f"verified {checked.files} files in {checked.seconds:.2f} s")
            typer.echo(render(manifest))
            typer.echo(f"a copy with one flipped byte is refused: {refused}")

    run(json_, body)
