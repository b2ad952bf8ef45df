"""A fake LichtFeld Studio: a test double of the trainer's command line, logs and checkpoints.

    python -m restorepoint.testing.fake_lichtfeld --headless -d DATA -o OUT [-i ITERATIONS]
        [--eval] [--eval-steps N]... [--save-steps A,B,...] [--steps-scaler F]
        [--resume CHECKPOINT] [--export=FORMATS] [--log-file FILE] [--step-delay S]
        [--unpatched]
    python -m restorepoint.testing.fake_lichtfeld --version

It behaves like the real binary as far as docs/adapters.md records what is known of it: the
flags, log lines shaped like the real logger's (``[HH:MM:SS.mmm] [info] file.cpp:LINE  message``
with ANSI colours on stdout, the file pattern with ``--log-file``), a progress bar redrawn with
carriage returns, ``[Evaluation at step N]`` blocks, checkpoints written to
``OUT/checkpoints/checkpoint_N.resume`` through a ``.tmp`` file and a rename and announced
afterwards by ``Checkpoint saved: PATH (G Gaussians, iter N)``, ``splat_N.ply`` at the end,
and resume continuing at the iteration after the checkpoint's.

The seed system's patches are mimicked too: ``--save-steps`` (scaled by ``--steps-scaler``
exactly like ``--eval-steps``), and SIGUSR1 taking a snapshot on a worker thread without
stopping training, wired only while the training loop runs (before it, SIGUSR1 kills the
process, as an unhandled SIGUSR1 does). SIGTERM stops training at the next iteration and exits
143 without waiting for a snapshot in flight for more than a moment.

Training is simulated: a short list of floats evolving deterministically per iteration from a
seed derived from the data directory, so a resumed run ends bitwise in the same state as an
uninterrupted one. ``--dialect other`` switches to a different, made-up trainer (other flags,
file names, log lines and snapshot signal) used to test custom adapter profiles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["FAKE_COMMIT", "FAKE_VERSION", "main"]

FAKE_VERSION = "v0.0.0-fake"
FAKE_COMMIT = "fa4e000"
OTHER_VERSION = "2.1.0"
CHECKPOINT_FORMAT = "fake-lichtfeld-checkpoint/1"
EXPORT_FORMATS = ("ply", "sog", "spz", "html", "usd", "usda", "usdc", "rad")
STATE_SIZE = 8
DEFAULT_ITERATIONS = 30_000
#: Exit status after SIGTERM: the shell's 128 + signal number.
SIGTERM_EXIT = 128 + signal.SIGTERM
#: How long SIGTERM waits for a snapshot already being written before exiting anyway.
SNAPSHOT_GRACE = 2.0

_GREEN = "\033[32m"
_YELLOW = "\033[33m"
_RESET = "\033[0m"


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def scale_steps(steps: Sequence[int], scaler: float) -> list[int]:
    """The trainer's step scaling: each value times the scaler in single precision, rounded
    half away from zero; zeros dropped, duplicates removed, sorted. A scaler of 1 or <= 0
    leaves the values alone (but still sorted and unique)."""
    if scaler <= 0 or scaler == 1:
        return sorted({s for s in steps if s > 0})
    ratio = _f32(scaler)
    out = set()
    for s in steps:
        scaled = math.floor(_f32(_f32(float(s)) * ratio) + 0.5)
        if scaled > 0:
            out.add(scaled)
    return sorted(out)


def _int_list(values: Sequence[str] | None, separator: str, flag: str) -> list[int]:
    out: list[int] = []
    for value in values or []:
        for part in value.split(separator):
            if not part.strip():
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise SystemExit(f"Parse error: {flag} expects integers, got {part!r}") from None
    return out


@dataclass
class Params:
    data: Path
    output: Path
    iterations: int
    save_steps: list[int]
    eval_steps: list[int]
    enable_eval: bool
    steps_scaler: float
    exports: list[str]
    step_delay: float
    progress_every: int
    #: the upstream binary, without the snapshot patch: no handler for the snapshot signal
    unpatched: bool = False


@dataclass
class Dialect:
    name: str
    snapshot_signal: int
    log_file: Path | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    lock: threading.Lock = field(default_factory=threading.Lock)
    log_handle: TextIO | None = None

    def checkpoint_path(self, output: Path, iteration: int) -> Path:
        if self.name == "other":
            return output / "state" / f"step-{iteration:06d}.ckpt"
        return output / "checkpoints" / f"checkpoint_{iteration}.resume"

    def log(self, message: str, *, source: str = "trainer.cpp:412", level: str = "info") -> None:
        now = time.time()
        local = time.localtime(now)
        millis = int(now * 1000) % 1000
        with self.lock:
            if self.name == "other":
                self.out.write(f"{time.strftime('%H:%M:%S', local)} {level.upper()} {message}\n")
            else:
                colour = _YELLOW if level == "warn" else _GREEN
                self.out.write(
                    f"[{time.strftime('%H:%M:%S', local)}.{millis:03d}] {colour}[{level}]{_RESET}"
                    f" {source}  {message}\n"
                )
                if self.log_handle is not None:
                    self.log_handle.write(
                        f"[{time.strftime('%Y-%m-%d %H:%M:%S', local)}.{millis:03d}] [{level}] "
                        f"{source} {message}\n"
                    )
                    self.log_handle.flush()
            self.out.flush()

    def raw(self, text: str) -> None:
        with self.lock:
            self.out.write(text)
            self.out.flush()


class Trainer:
    """The simulated training run; the main thread trains, a worker thread snapshots."""

    def __init__(self, params: Params, dialect: Dialect) -> None:
        self.params = params
        self.dialect = dialect
        self.iteration = 0
        self.state = _initial_state(params.data)
        self.state_lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.snapshot_requested = threading.Event()
        self.stop_requested = False
        self.finished = threading.Event()
        self.worker = threading.Thread(target=self._snapshot_worker, daemon=True)
        self.started = 0.0

    # -- signals -------------------------------------------------------------------------------

    def _on_snapshot_signal(self, signum: int, frame: Any) -> None:
        self.snapshot_requested.set()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    # -- checkpoints ---------------------------------------------------------------------------

    def gaussians(self, iteration: int) -> int:
        return 100_000 + 37 * iteration

    def save_checkpoint(self, iteration: int, state: list[float]) -> Path:
        path = self.dialect.checkpoint_path(self.params.output, iteration)
        document = {
            "format": CHECKPOINT_FORMAT,
            "iteration": iteration,
            "num_gaussians": self.gaussians(iteration),
            "state": state,
            "params": {
                "data_path": str(self.params.data),
                "output_path": str(self.params.output),
                "iterations": self.params.iterations,
                "save_steps": self.params.save_steps,
                "eval_steps": self.params.eval_steps,
                "enable_eval": self.params.enable_eval,
                "steps_scaler": self.params.steps_scaler,
            },
        }
        data = json.dumps(document, sort_keys=True).encode()
        # Two writers (the training thread at a save step, the snapshot worker) may save the
        # same iteration; one at a time keeps the temporary file theirs alone.
        with self.write_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        if self.dialect.name == "other":
            self.dialect.log(f"committed snapshot step={iteration} file={path}")
        else:
            self.dialect.log(
                f"Checkpoint saved: {path} ({self.gaussians(iteration)} Gaussians, "
                f"iter {iteration})",
                source="checkpoint.cpp:245",
            )
        return path

    def _snapshot_worker(self) -> None:
        while True:
            self.snapshot_requested.wait()
            self.snapshot_requested.clear()
            if self.finished.is_set():
                return
            with self.state_lock:
                iteration, state = self.iteration, list(self.state)
            if iteration == 0:
                continue
            if self.dialect.name != "other":
                self.dialect.log(f"Snapshot requested by signal at iteration {iteration}")
            self.save_checkpoint(iteration, state)

    # -- training ------------------------------------------------------------------------------

    def resume_from(self, checkpoint: dict[str, Any]) -> None:
        self.iteration = int(checkpoint["iteration"])
        self.state = [float(x) for x in checkpoint["state"]]

    def train(self) -> int:
        p = self.params
        d = self.dialect
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.worker.start()
        # Wired only now, as in the patched trainer (a snapshot needs a running training
        # loop), and before the line that tells a watcher the trainer is up.
        if not p.unpatched:
            signal.signal(d.snapshot_signal, self._on_snapshot_signal)
        if d.name == "other":
            d.log("ready: accepting snapshot requests")
        else:
            d.log("Starting training loop")
        self.started = time.monotonic()
        first = self.iteration + 1
        save_steps = set(p.save_steps)
        eval_steps = set(p.eval_steps) if p.enable_eval else set()
        it = first
        stopped = False
        while it <= p.iterations:
            if self.stop_requested:
                stopped = True
                break
            with self.state_lock:
                _step(self.state, it)
                self.iteration = it
            if p.step_delay:
                time.sleep(p.step_delay)
            if it in eval_steps:
                self._evaluate(it)
            if it in save_steps and it != p.iterations:
                with self.state_lock:
                    state = list(self.state)
                self.save_checkpoint(it, state)
            if d.name != "other" and (it % p.progress_every == 0 or it in (first, p.iterations)):
                self._progress(it)
            it += 1
        if not p.unpatched:
            signal.signal(d.snapshot_signal, signal.SIG_IGN)
        self.finished.set()
        self.snapshot_requested.set()
        if stopped or self.stop_requested:
            self.worker.join(SNAPSHOT_GRACE)
            d.raw("\n")
            d.log(
                f"Received SIGTERM, stopping training at iteration {self.iteration}", level="warn"
            )
            return SIGTERM_EXIT
        self.worker.join(SNAPSHOT_GRACE)
        d.raw("\n")
        self._export()
        return 0

    def _evaluate(self, it: int) -> None:
        s = self.state
        psnr = 20.0 + 10.0 * abs(math.sin(s[0]))
        ssim = 0.5 + 0.4 * abs(math.cos(s[1]))
        lpips = 0.1 + 0.2 * abs(math.sin(s[2]))
        self.dialect.raw(f"\n[Evaluation at step {it}]\n")
        self.dialect.log(
            f"PSNR: {psnr:.4f}, SSIM: {ssim:.4f}, LPIPS: {lpips:.4f}, Time: 0.0123s/image, "
            f"#GS: {self.gaussians(it)}",
            source="trainer.cpp:988",
        )

    def _progress(self, it: int) -> None:
        total = self.params.iterations
        done = int(30 * it / total)
        elapsed = int(time.monotonic() - self.started)
        loss = 0.05 + 0.01 * abs(math.sin(self.state[3]))
        self.dialect.raw(
            f"\rTraining [{'█' * done}{'░' * (30 - done)}] {100 * it // total}% "
            f"[{elapsed // 60:02d}m:{elapsed % 60:02d}s] {it}/{total} | Loss: {loss:.4f} | "
            f"Splats: {self.gaussians(it)}"
        )

    def _export(self) -> None:
        p = self.params
        body = _final_document(self.iteration, self.state)
        p.output.mkdir(parents=True, exist_ok=True)
        formats = p.exports or ["ply"]
        if self.dialect.name == "other":
            target = p.output / f"final.{formats[0]}"
            target.write_text(body)
            self.dialect.log(f"wrote {target}")
            return
        for fmt in dict.fromkeys(["ply", *formats]):
            target = p.output / f"splat_{self.iteration}.{fmt}"
            target.write_text(body)
            self.dialect.log(f"Exported {target}", source="exporter.cpp:77")


def _final_document(iteration: int, state: list[float]) -> str:
    return json.dumps({"iteration": iteration, "state": state}, sort_keys=True) + "\n"


def _initial_state(data: Path) -> list[float]:
    h = hashlib.sha256()
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        h.update(path.relative_to(data).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    digest = h.digest()
    return [int.from_bytes(digest[4 * i : 4 * i + 4], "little") / 2**32 for i in range(STATE_SIZE)]


def _step(state: list[float], it: int) -> None:
    for i in range(len(state)):
        state[i] = state[i] * 0.9995 + 1e-3 * math.sin(it * (i + 1) * 0.001 + state[i - 1])


# -- command lines ---------------------------------------------------------------------------


def _lichtfeld_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="LichtFeld-Studio", allow_abbrev=False)
    p.add_argument("-V", "--version", action="store_true")
    p.add_argument("--headless", action="store_true")
    p.add_argument("-d", "--data-path", dest="data")
    p.add_argument("-o", "--output-path", dest="output")
    p.add_argument("-i", "--iter", dest="iterations", type=int)
    p.add_argument("--eval", dest="enable_eval", action="store_true")
    p.add_argument("--eval-steps", action="append")
    p.add_argument("--save-steps", action="append")
    p.add_argument("--steps-scaler", type=float)
    p.add_argument("--resume")
    p.add_argument("--export")
    p.add_argument("--log-file")
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--progress-every", type=int, default=100)
    # Not a flag of the real binary: the test double acting as the upstream binary without
    # the snapshot patch (its ready line, its --save-steps, no SIGUSR1 handler).
    p.add_argument("--unpatched", action="store_true")
    return p


def _other_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="other-trainer", allow_abbrev=False)
    p.add_argument("--version", action="store_true")
    p.add_argument("--data")
    p.add_argument("--out", dest="output")
    p.add_argument("--steps", dest="iterations", type=int)
    p.add_argument("--snapshot-at")
    p.add_argument("--from", dest="resume")
    p.add_argument("--format", dest="export")
    p.add_argument("--step-delay", type=float, default=0.0)
    return p


def _fail(message: str) -> int:
    sys.stderr.write(f"Error: {message}\n")
    return 1


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911, PLR0912, PLR0915 - the fake trainer's command line, flag by flag, as the real one
    args_list = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--dialect", choices=("lichtfeld", "other"), default="lichtfeld")
    known, rest = pre.parse_known_args(args_list)
    other = known.dialect == "other"
    ns = (_other_parser() if other else _lichtfeld_parser()).parse_args(rest)
    if ns.version:
        if other:
            print(f"other-trainer {OTHER_VERSION}")
        else:
            print(f"LichtFeld Studio {FAKE_VERSION} ({FAKE_COMMIT})")
        return 0
    dialect = Dialect(
        "other" if other else "lichtfeld", signal.SIGUSR2 if other else signal.SIGUSR1
    )
    checkpoint: dict[str, Any] | None = None
    if ns.resume:
        try:
            checkpoint = json.loads(Path(ns.resume).read_text())
        except FileNotFoundError:
            return _fail(f"Checkpoint file does not exist: {ns.resume}")
        except (OSError, ValueError) as exc:
            return _fail(f"Failed to load checkpoint {ns.resume}: {exc}")
        if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
            return _fail(f"Invalid checkpoint: {ns.resume}")
    saved = checkpoint["params"] if checkpoint else {}
    data = ns.data or saved.get("data_path")
    output = ns.output or saved.get("output_path")
    if not data or not output:
        return _fail("Training mode requires both --data-path and --output-path")
    if not Path(data).is_dir():
        return _fail(f"Path does not exist: {data}")
    if other:
        scaler = 1.0
        save = _int_list([ns.snapshot_at] if ns.snapshot_at else None, ";", "--snapshot-at")
        evals: list[int] = []
        enable_eval = False
    else:
        scaler = ns.steps_scaler if ns.steps_scaler is not None else 1.0
        save = _int_list(ns.save_steps, ",", "--save-steps")
        evals = _int_list(ns.eval_steps, ",", "--eval-steps")
        enable_eval = bool(ns.enable_eval)
    if checkpoint is not None and ns.iterations is None:
        iterations = int(saved["iterations"])
    else:
        raw_iterations = ns.iterations if ns.iterations is not None else DEFAULT_ITERATIONS
        iterations = scale_steps([raw_iterations], scaler)[0] if raw_iterations > 0 else 0
    save_steps = (
        scale_steps(save, scaler) if save or checkpoint is None else list(saved["save_steps"])
    )
    eval_steps = (
        scale_steps(evals, scaler) if evals or checkpoint is None else list(saved["eval_steps"])
    )
    exports = [f.strip().lstrip(".") for f in (ns.export or "").split(",") if f.strip()]
    for fmt in exports:
        if not other and fmt not in EXPORT_FORMATS:
            return _fail(f"Invalid format '{fmt}'. Use: {', '.join(EXPORT_FORMATS)}")
    params = Params(
        data=Path(data),
        output=Path(output),
        iterations=iterations,
        save_steps=save_steps,
        eval_steps=eval_steps,
        enable_eval=enable_eval or (checkpoint is not None and bool(saved.get("enable_eval"))),
        steps_scaler=scaler,
        exports=exports,
        step_delay=ns.step_delay,
        progress_every=max(1, getattr(ns, "progress_every", 100)),
        unpatched=bool(getattr(ns, "unpatched", False)),
    )
    params.output.mkdir(parents=True, exist_ok=True)
    log_file = getattr(ns, "log_file", None)
    if log_file:
        dialect.log_handle = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - whole run
    trainer = Trainer(params, dialect)
    if not other:
        dialect.log(f"Loading dataset from {params.data}", source="application.cpp:151")
        if scaler > 0 and scaler != 1:
            dialect.log(f"Scaling training steps by factor: {scaler}", source="parameters.cpp:1203")
        dialect.log(
            f"Initializing trainer with {params.iterations} iterations", source="trainer.cpp:331"
        )
    if checkpoint is not None:
        trainer.resume_from(checkpoint)
        if not other:
            dialect.log(
                f"Checkpoint loaded: {ns.resume} ({checkpoint.get('num_gaussians', 0)} Gaussians,"
                f" iter {trainer.iteration})",
                source="checkpoint.cpp:402",
            )
        else:
            dialect.log(f"resuming from step {trainer.iteration}")
    try:
        return trainer.train()
    finally:
        if dialect.log_handle is not None:
            dialect.log_handle.close()


if __name__ == "__main__":
    sys.exit(main())
