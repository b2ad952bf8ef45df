"""Side-by-side PyTorch runtime benchmark: what a restorepoint.torch.ResumableRun snapshot
costs a training loop, against what a plain loop does on a signal (torch.save + fsync).

    python benchmarks/bench_torch.py [--state-mb 100] [--steps 60] [--repeat 3]
        [--snapshots 3] [--threads 1] [--batch 8] [--workdir DIR] [--json]
    python benchmarks/bench_torch.py --container [--state-mb 1024] [--repeat 3]

``--container`` compares the snapshot file with torch.save / torch.load of the same state
instead (``_container.py``).

A model of 1024x1024 Linear layers with an Adam optimizer (two moments per parameter, so the
state_dicts are three times the parameters) trains on a fixed batch. Each round runs five
segments, in an order shuffled from round to round:

- ResumableRun with zstd level 1 and its background thread at nice +19 (the defaults), with
  level=None (store only), and with zstd level 1 and background_nice=None (the background at
  the training thread's priority), each with a local store: ``--steps`` timed steps, then
  ``--snapshots`` times: a real SIGUSR1 sent to this process just before a commit(), steps
  until the background save + pack + publish of that snapshot is done, and 20 quiet steps;
- a plain loop that, on the same SIGUSR1, calls torch.save(state, path) + fsync in the loop;
- the same with torch.save to an in-memory buffer.

Measured per segment: the pause (from the signal to training running again: the commit()
that acts on the signal, less a normal commit), and the median step time while a snapshot is
saved and uploaded in the background against the median of the steps with no background work
(the first ``--steps`` and the quiet ones). The table gives the median and the best of the
rounds. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import fs_type

HINT = "bench_torch.py needs torch: pip install 'restorepoint[torch]'"
WIDTH = 1024
WARMUP_STEPS = 5
SETTLE_S = 0.5
#: Quiet steps after each snapshot's background work; they count as baseline steps too, so
#: the baseline spans the same minutes as the steps it is compared with.
GAP_STEPS = 20
#: A background snapshot that takes longer than this is reported as not finished.
BACKGROUND_LIMIT_S = 60.0
PAUSE_TARGET_S = 0.3
SLOWDOWN_TARGET = 0.15

VARIANTS = {
    "rp_zstd1": "ResumableRun, zstd 1, nice +19 (default)",
    "rp_store": "ResumableRun, level=None (store only)",
    "rp_full": "ResumableRun, zstd 1, background_nice=None",
    "save_fsync": "plain loop: torch.save + fsync",
    "save_buffer": "plain loop: torch.save to BytesIO",
}


# -- the training loop -----------------------------------------------------------------------


@dataclass
class Trainer:
    model: Any
    optimizer: Any
    x: Any
    y: Any

    def step(self) -> None:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()

    def state(self) -> dict[str, Any]:
        """What a plain loop saves: the two state_dicts (they alias the live tensors)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}


def layers_for(state_mb: float) -> int:
    # Adam keeps two float32 moments per parameter: state = 3 x 4 bytes per parameter.
    per_layer = 3 * 4 * (WIDTH * WIDTH + WIDTH)
    return max(1, round(state_mb * 1e6 / per_layer))


def build(layers: int, batch: int, seed: int = 0) -> Trainer:
    import torch

    torch.manual_seed(seed)
    mods: list[Any] = []
    for i in range(layers):
        mods.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < layers - 1:
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, WIDTH), torch.randn(batch, WIDTH)
    return Trainer(model, optimizer, x, y)


def tensor_bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


# -- one segment -----------------------------------------------------------------------------


@dataclass
class Segment:
    """One variant in one round: baseline steps, then ``snapshots`` times a signal step and
    the steps that run while that snapshot is saved and uploaded in the background."""

    variant: str
    baseline_s: list[float] = field(default_factory=list)
    commit_s: list[float] = field(default_factory=list)
    signal_step_s: list[float] = field(default_factory=list)
    signal_to_running_s: list[float] = field(default_factory=list)
    reported_pause_s: list[float] = field(default_factory=list)
    # Steps wholly inside a background window (pooled over the snapshots), and every step
    # from a signal until its background work was seen done (for the time lost).
    during_s: list[float] = field(default_factory=list)
    after_signal_s: list[float] = field(default_factory=list)
    background_s: list[float] = field(default_factory=list)
    pack_s: list[float] = field(default_factory=list)
    stored_bytes: int | None = None
    finished: bool = True
    other_cores: float | None = None

    def summary(self) -> dict[str, Any]:
        base = statistics.median(self.baseline_s)
        commit = statistics.median(self.commit_s)
        pauses = [max(0.0, t - commit) for t in self.signal_to_running_s]
        during = statistics.median(self.during_s) if self.during_s else None
        n = len(pauses)
        # The training time one snapshot costs in all: the pause, plus what the steps that ran
        # beside its background work took beyond a normal step. Against the mean, not the
        # median: step times are skewed, and over hundreds of steps (a slow, niced background)
        # the gap between the two would add up to more than the effect.
        mean = statistics.fmean(self.baseline_s)
        lost = (sum(pauses) + sum(t - mean for t in self.after_signal_s)) / n
        med = statistics.median
        return {
            "baseline_step_ms": 1000 * base,
            "normal_commit_ms": 1000 * commit,
            "pause_s": med(pauses),
            "pause_max_s": max(pauses),
            "reported_pause_s": med(self.reported_pause_s) if self.reported_pause_s else None,
            "signal_step_ms": 1000 * med(self.signal_step_s),
            "signal_step_ratio": med(self.signal_step_s) / base,
            "during_step_ms": None if during is None else 1000 * during,
            "during_steps": len(self.during_s),
            "slowdown": None if during is None else during / base - 1,
            "background_s": med(self.background_s) if self.background_s else None,
            "pack_s": med(self.pack_s) if self.pack_s else None,
            "stored_bytes": self.stored_bytes,
            "lost_s": lost,
            "snapshots": n,
            "finished": self.finished,
            "other_cores": self.other_cores,
        }

    def raw(self) -> dict[str, Any]:
        def r(values: list[float]) -> list[float]:
            return [round(t, 6) for t in values]

        return {
            "baseline_step_s": r(self.baseline_s),
            "signal_step_s": r(self.signal_step_s),
            "signal_to_running_s": r(self.signal_to_running_s),
            "reported_pause_s": r(self.reported_pause_s),
            "during_step_s": r(self.during_s),
            "after_signal_step_s": r(self.after_signal_s),
            "background_s": r(self.background_s),
            "pack_s": r(self.pack_s),
        }


class OtherLoad:
    """CPU time that other processes used while this one ran, in cores: the machine's busy
    time (/proc/stat) less this process's own. Closer to what a figure suffered than the
    load average, which counts this process too and lags by minutes."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
        busy = sum(fields[:8]) - fields[3] - fields[4]
        own = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[2] <= self.start[2]:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return max(0.0, others / (end[2] - self.start[2]))


def timed_steps(trainer: Trainer, commit: Callable[[], None], n: int, seg: Segment) -> None:
    for _ in range(n):
        started = time.perf_counter()
        trainer.step()
        mid = time.perf_counter()
        commit()
        ended = time.perf_counter()
        seg.baseline_s.append(ended - started)
        seg.commit_s.append(ended - mid)


def signal_step(trainer: Trainer, commit: Callable[[], None], seg: Segment) -> float:
    """A step whose commit() is the first to see a real SIGUSR1; returns when training runs
    again (perf_counter)."""
    started = time.perf_counter()
    trainer.step()
    sent = time.perf_counter()
    os.kill(os.getpid(), signal.SIGUSR1)
    commit()
    resumed = time.perf_counter()
    seg.signal_step_s.append(resumed - started)
    seg.signal_to_running_s.append(resumed - sent)
    return resumed


def uploaded_at(run_dir: Path, step: int) -> float | None:
    """Wall time of the run's "uploaded" event for ``step``: when its background work ended."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        event = json.loads(line)
        if event.get("event") == "uploaded" and event.get("step") == step:
            when = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
            return when.replace(tzinfo=timezone.utc).timestamp()
    return None


def run_restorepoint(
    trainer: Trainer,
    steps: int,
    snapshots: int,
    workdir: Path,
    name: str,
    level: int | None,
    nice: int | None = 19,
) -> Segment:
    from restorepoint.torch import ResumableRun

    seg = Segment(name)
    run_dir = workdir / "runs" / name
    store = workdir / "store" / name
    for path in (run_dir, store):
        shutil.rmtree(path, ignore_errors=True)
    store.mkdir(parents=True)
    config = {"bench": "bench_torch", "segment": name, "width": WIDTH}
    with ResumableRun(
        config, run_dir=run_dir, store=f"{store}/", level=level, background_nice=nice
    ) as run:
        run.track(model=trainer.model, optimizer=trainer.optimizer)
        timed_steps(trainer, run.commit, steps, seg)
        for _ in range(snapshots):
            before = run.last_pause_s
            sent_wall = time.time()
            resumed = signal_step(trainer, run.commit, seg)
            if run.last_pause_s is None or run.last_pause_s == before:
                raise RuntimeError("the SIGUSR1 was not acted on at the next commit")
            seg.reported_pause_s.append(run.last_pause_s)
            step = run.step
            steps_wall: list[tuple[float, float]] = []
            while not run.wait(timeout=0):
                if time.perf_counter() - resumed > BACKGROUND_LIMIT_S:
                    seg.finished = False
                    break
                begun = time.time()
                t0 = time.perf_counter()
                trainer.step()
                run.commit()
                steps_wall.append((begun, time.perf_counter() - t0))
            seg.after_signal_s += [d for _, d in steps_wall]
            done = uploaded_at(run_dir, step)
            if done is None:
                seg.finished = False
                continue
            seg.background_s.append(done - sent_wall)
            # The step the work ended in ran partly alone: only whole steps inside count.
            seg.during_s += [d for b, d in steps_wall if b + d <= done]
            seg.pack_s += [u["seconds"] for u in run.uploads if u.get("step") == step]
            seg.stored_bytes = max(f.stat().st_size for f in store.rglob("*.rp"))
            timed_steps(trainer, run.commit, GAP_STEPS, seg)
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    return seg


def run_plain(
    trainer: Trainer, steps: int, snapshots: int, workdir: Path, name: str, durable: bool
) -> Segment:
    """A plain loop: its own SIGUSR1 handler sets a flag, the loop saves when it sees it."""
    import torch

    seg = Segment(name)
    target = workdir / "plain" / "checkpoint.pt"
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir(parents=True)
    flag = {"save": False, "saves": 0}

    def on_signal(signum: int, frame: Any) -> None:
        flag["save"] = True

    def commit() -> None:
        if not flag["save"]:
            return
        flag["save"] = False
        flag["saves"] += 1
        if durable:
            with open(target, "wb") as f:
                torch.save(trainer.state(), f)
                f.flush()
                os.fsync(f.fileno())
        else:
            buffer = io.BytesIO()
            torch.save(trainer.state(), buffer)
            seg.stored_bytes = buffer.tell()

    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:
        timed_steps(trainer, commit, steps, seg)
        for i in range(snapshots):
            signal_step(trainer, commit, seg)
            if flag["saves"] != i + 1:
                raise RuntimeError("the SIGUSR1 was not acted on at the next commit")
            if durable:
                seg.stored_bytes = target.stat().st_size
            timed_steps(trainer, commit, GAP_STEPS, seg)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    shutil.rmtree(target.parent, ignore_errors=True)
    return seg


# -- report ----------------------------------------------------------------------------------


def aggregate(segments: dict[str, list[Segment]]) -> dict[str, dict[str, Any]]:
    """Per variant: every round's summary, and the median and best (lowest) of each number."""
    out: dict[str, dict[str, Any]] = {}
    for variant, segs in segments.items():
        rounds = [s.summary() for s in segs]
        stats: dict[str, Any] = {"label": VARIANTS[variant], "rounds": rounds}
        for key in rounds[0]:
            values = [r[key] for r in rounds if isinstance(r[key], (int, float))]
            if values and not isinstance(rounds[0][key], bool):
                stats[key] = {
                    "median": statistics.median(values),
                    "best": min(values),
                    "worst": max(values),
                }
        stats["finished"] = all(r["finished"] for r in rounds)
        stats["raw"] = [s.raw() for s in segs]
        out[variant] = stats
    return out


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    goals = []
    for variant in ("rp_zstd1", "rp_store"):
        r = results[variant]
        goals.append(
            {
                "name": f"pause, {VARIANTS[variant]}",
                "value": r["pause_s"]["median"],
                "value_best": r["pause_s"]["best"],
                "op": "<=",
                "target": PAUSE_TARGET_S,
                "unit": "s",
                "pass": r["pause_s"]["median"] <= PAUSE_TARGET_S,
            }
        )
    for variant in ("rp_zstd1", "rp_store", "rp_full"):
        r = results[variant]
        slow = r.get("slowdown")
        goals.append(
            {
                "name": f"step slowdown, {VARIANTS[variant]}",
                "value": None if slow is None else slow["median"],
                "value_best": None if slow is None else slow["best"],
                "op": "<=",
                "target": SLOWDOWN_TARGET,
                "unit": "",
                "pass": slow is not None and r["finished"] and slow["median"] <= SLOWDOWN_TARGET,
            }
        )
    return goals


def _mb(n: float | None) -> str:
    return "" if n is None else f"{n / 1e6:.1f}"


def print_table(
    meta: dict[str, Any], results: dict[str, dict[str, Any]], goals: list[dict[str, Any]]
) -> None:
    def cells(variant: str, key: str, fmt: str, worst: str | None = None) -> str:
        value = results[variant].get(key)
        if value is None:
            return f"{'-':>8} {'-':>8}"
        text = f"{value['median']:8{fmt}} {value['best']:8{fmt}}"
        if worst is not None:
            text += f" {results[variant][worst]['worst']:8{fmt}}"
        return text

    print()
    print(
        f"state {meta['state_bytes'] / 1e6:.1f} MB (model {meta['model_bytes'] / 1e6:.1f} MB + "
        f"Adam {meta['optimizer_bytes'] / 1e6:.1f} MB; {meta['layers']} Linear "
        f"{WIDTH}x{WIDTH}), batch {meta['batch']}, torch threads {meta['torch_threads']}, "
        f"{meta['cpus']} CPUs, workdir on {meta['workdir_fs']}, repeat {meta['repeat']}, "
        f"{meta['steps']} baseline steps and {meta['snapshots']} signals per segment"
    )
    print(
        f"load average: {' '.join(f'{x:.2f}' for x in meta['load_start'])} at start, "
        f"{' '.join(f'{x:.2f}' for x in meta['load_end'])} at end; other processes used "
        f"{meta['other_cores'] or 0:.2f} cores on average"
    )
    print()
    print(f"{'1. pause: signal -> training again (s)':48} {'median':>8} {'best':>8} {'worst':>8}")
    for v, label in VARIANTS.items():
        print(f"{label:48} {cells(v, 'pause_s', '.3f', 'pause_max_s')}")
        if v.startswith("rp_"):
            reported = cells(v, "reported_pause_s", ".3f")
            print(f"{'  as reported (run.last_pause_s)':48} {reported}")
    print()

    def num(variant: str, key: str, width: int, fmt: str, which: str = "median") -> str:
        value = results[variant].get(key)
        return f"{'-':>{width}}" if value is None else f"{value[which]:{width}{fmt}}"

    print(
        f"{'2. step time (ms), median of rounds':48} {'before':>8} {'during':>8} "
        f"{'slowdown':>9} {'best':>8} {'bg s':>6} {'pack s':>6} {'steps':>5} {'lost s':>6} "
        f"{'others':>6}"
    )
    for v in ("rp_zstd1", "rp_store", "rp_full"):
        slow = results[v].get("slowdown")
        pct = "" if slow is None else f"{100 * slow['median']:8.1f}% {100 * slow['best']:7.1f}%"
        print(
            f"{VARIANTS[v]:48} {num(v, 'baseline_step_ms', 8, '.1f')} "
            f"{num(v, 'during_step_ms', 8, '.1f')} {pct:>18} "
            f"{num(v, 'background_s', 6, '.2f')} {num(v, 'pack_s', 6, '.2f')} "
            f"{num(v, 'during_steps', 5, '.0f')} {num(v, 'lost_s', 6, '.3f')} "
            f"{num(v, 'other_cores', 6, '.2f')}"
        )
        if not results[v]["finished"]:
            print(f"  a background snapshot was not done within {BACKGROUND_LIMIT_S:.0f} s")
    print(f"{'':48} {'before':>8} {'saving':>8} {'x step':>9}")
    for v in ("save_fsync", "save_buffer"):
        print(
            f"{VARIANTS[v]:48} {num(v, 'baseline_step_ms', 8, '.1f')} "
            f"{num(v, 'signal_step_ms', 8, '.1f')} {num(v, 'signal_step_ratio', 8, '.1f')}x "
            f"{'':8} {'':6} {'':6} {'':5} {num(v, 'lost_s', 6, '.3f')} "
            f"{num(v, 'other_cores', 6, '.2f')}"
        )
    sizes = ", ".join(
        f"{v} {_mb(results[v]['stored_bytes']['median'])}"
        for v in VARIANTS
        if "stored_bytes" in results[v]
    )
    print(f"MB written per snapshot: {sizes}")
    print()
    print(f"{'target (median of rounds)':54} {'value':>8} {'best':>8} {'target':>8}")
    for g in goals:
        scale, unit, fmt = (100, "%", ".1f") if g["unit"] == "" else (1, " s", ".3f")
        value = "-" if g["value"] is None else f"{scale * g['value']:{fmt}}{unit}"
        best = "-" if g["value_best"] is None else f"{scale * g['value_best']:{fmt}}{unit}"
        goal = f"{g['op']} {scale * g['target']:g}{unit}"
        verdict = "PASS" if g["pass"] else "FAIL"
        print(f"{g['name']:54} {value:>8} {best:>8} {goal:>8}  {verdict}")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state-mb", type=float, default=100.0, help="model + Adam state size (default 100)"
    )
    parser.add_argument(
        "--steps", type=int, default=60, help="baseline steps per segment (default 60)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "restorepoint-bench-torch",
        help="where the run directories, the store and the plain checkpoints go",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--snapshots", type=int, default=3, help="signals per segment (default 3)")
    parser.add_argument("--json", action="store_true", help="also print every number as JSON")
    parser.add_argument(
        "--container",
        action="store_true",
        help="the snapshot file against torch.save/torch.load (state default 1024 MB)",
    )
    args = parser.parse_args(argv)
    if args.state_mb <= 0 or args.steps < 3 or min(args.repeat, args.threads, args.snapshots) < 1:
        parser.error(
            "--state-mb must be positive, --steps at least 3, --repeat, --threads and "
            "--snapshots at least 1"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(HINT)
        return 2
    import restorepoint

    torch.set_num_threads(args.threads)
    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    if args.container:
        import _container

        state_mb = args.state_mb if "--state-mb" in (argv or sys.argv) else 1024.0
        numbers = _container.run(state_mb, workdir, args.repeat)
        _container.print_table(numbers)
        if args.json:
            print(json.dumps(numbers, indent=2))
        return 0
    load_start = os.getloadavg()
    whole_run = OtherLoad()
    trainer = build(layers_for(args.state_mb), args.batch)
    # The first steps allocate Adam's moments and warm the allocator.
    for _ in range(WARMUP_STEPS):
        trainer.step()
    state = trainer.state()
    segments: dict[str, list[Segment]] = {v: [] for v in VARIANTS}
    snaps = args.snapshots
    runners: dict[str, Callable[[str], Segment]] = {
        "rp_zstd1": lambda n: run_restorepoint(trainer, args.steps, snaps, workdir, n, 1),
        "rp_store": lambda n: run_restorepoint(trainer, args.steps, snaps, workdir, n, None),
        "rp_full": lambda n: run_restorepoint(trainer, args.steps, snaps, workdir, n, 1, None),
        "save_fsync": lambda n: run_plain(trainer, args.steps, snaps, workdir, n, True),
        "save_buffer": lambda n: run_plain(trainer, args.steps, snaps, workdir, n, False),
    }
    try:
        for r in range(args.repeat):
            order = list(VARIANTS)
            random.Random(r).shuffle(order)
            for variant in order:
                time.sleep(SETTLE_S)
                others = OtherLoad()
                seg = runners[variant](f"{variant}-r{r}")
                seg.other_cores = others.cores()
                segments[variant].append(seg)
            print(f"round {r + 1}/{args.repeat} done ({', '.join(order)})", flush=True)
    finally:
        for sub in ("runs", "store", "plain"):
            shutil.rmtree(workdir / sub, ignore_errors=True)
    results = aggregate(segments)
    goals = targets(results)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "state_bytes": tensor_bytes(state),
        "model_bytes": tensor_bytes(state["model"]),
        "optimizer_bytes": tensor_bytes(state["optimizer"]),
        "layers": layers_for(args.state_mb),
        "batch": args.batch,
        "steps": args.steps,
        "snapshots": args.snapshots,
        "repeat": args.repeat,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "workdir_fs": fs_type(workdir),
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "other_cores": whole_run.cores(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "restorepoint": restorepoint.__version__,
        "torch": torch.__version__,
    }
    print_table(meta, results, goals)
    if args.json:
        print(json.dumps({"meta": meta, "results": results, "targets": goals}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
