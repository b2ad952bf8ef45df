"""The whole save-and-resume cycle, as a user meets it, side by side in one run: restorepoint's
ResumableRun against torch.save, PyTorch DCP (save and async_save) and Lightning's checkpoint IO,
on a local disk and on moto's S3 server.

    python benchmarks/bench_resume.py [--size 1G,4G,8G] [--stores local,s3] [--repeat 2]
        [--workdir DIR] [--hogs N] [--json] [--no-memory-check] [--tools a,b] [--plot PNG]
        [--park auto|always|never]

Needs torch, s3fs, moto[server], boto3 and the real weights (``restorepoint[torch,s3,test]``);
Lightning and DCP rows are skipped when they cannot be imported. Run from the repository root.

The state is a model of real trained weights (all-MiniLM-L6-v2, ``restorepoint.testing.weights``,
tiled to a third of ``--size``, each tile scaled by its own factor) with Adam's two moments after
``--adam-steps`` real optimizer steps: model + optimizer is ``--size``. Each round runs, for each
store, every tool in a seeded shuffled order (ours, a peer, ..., then the next round):

- **save**: the pause (training stopped), then a fixed compute loop (a 384x384 matmul chain on
  one torch thread) runs until the checkpoint is published; published = in the store, complete.
  Ours then also writes its run directory's ``last.pt`` (for a resume on the same machine),
  from memory: when that is in place is printed as "last.pt saved".
  restorepoint hashes (sha256 of every byte, recorded in the index) and compresses on the way;
  the peers do neither.
- **resume**: in a fresh process, as on the empty machine a preempted job restarts on: it
  builds the model and its optimizer (no state yet) and imports the tool's library (neither
  is timed), with none of a local store's files in the page cache (``Store.evict``), then
  from nothing in the run directory to the end of the first compute step
  (ours: ResumableRun + resume() from the store, the step taken in the run while the import's
  copy lands in the run directory; the peers: the download, torch.load / dcp.load and
  load_state_dict). The resumed model is checked against the saved one's digest.
- **bytes** stored, the **slowdown** of the compute loop while a publish runs in the
  background, and the **peak RSS** of this process during the save and of the resume's
  process during the resume (the kernel's high-water mark, reset before each; it includes the
  model and its optimizer). Ours publishes in a process of its own (``background="auto"``,
  the default, on Linux): its save's peak RSS is this process's plus the child's.
  ``restorepoint-thread`` is ours with ``background="thread"`` (the publish on a thread of
  the training process), and its figures get a ratio column of their own.
  ``restorepoint-stop`` is ours under a stop (``request_stop``, as SIGTERM or a termination
  notice asks): the state at the stop is published while training waits, at the process's
  priority, and "published" is when the stop would exit 42 (the restore point
  in the store, ``last.pt`` in the run directory). No compute loop runs beside it (training
  has stopped), so it has no slowdown; its ratios get a column of their own too.
- the mean step's slowdown in the parts that the kernel accounts to the training thread
  (``schedstat``), each in a mean baseline step's time, less what the baseline had of it:
  **waited for a core** (runnable while the background's threads ran on its core) and
  **blocked** (neither running nor runnable: for this loop, the GIL). They do not move with
  the machine's speed; the third part, the steps' own CPU time, does (printed per round, with
  the mean step's slowdown that the three add up to).

``--hogs N`` runs N other processes that keep a core busy each (``while True: pass``) for the
whole run: a machine whose other work (data loader workers, other jobs) takes the cores, where
the background's CPU share decides the time to a safe restore point and the step slowdown.

Figures are medians over the rounds, then each as a ratio to the best peer. The load average is
printed beside every figure: on a shared machine the figures are noisy, and the ratios (tools
seconds apart) less so than the seconds. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from _common import fs_type, measured, use_checkout
from _park import Parking

# The checkout this script is in is what it measures (and its resume processes, which inherit
# the path), not whichever restorepoint the interpreter has installed.
use_checkout()

from _resume_tools import (  # noqa: E402
    LIMIT_S,
    Compute,
    Cycle,
    Store,
    available_tools,
    load,
)

HINT = "bench_resume.py needs torch, s3fs, moto[server] and boto3: restorepoint[torch,s3,test]"
TOOLS = (
    "restorepoint",
    "restorepoint-thread",
    "restorepoint-stop",
    "torch.save",
    "dcp.save",
    "dcp.async_save",
    "lightning",
)
#: Ours (its defaults: the publish in a process of its own where one can run), ours publishing
#: on the training process's background thread (``background="thread"``), and ours with the
#: background at the training thread's priority (``background_nice=None``) or at other nice
#: levels: these last are not in the default list; they show what the background's CPU share
#: costs and buys (the default is docs/performance.md's choice).
OURS = (
    "restorepoint",
    "restorepoint-thread",
    "restorepoint-stop",
    "restorepoint-nice0",
    "restorepoint-nice5",
    "restorepoint-nice10",
    "restorepoint-nice19",
)
FIGURES = (
    "pause_s",
    "published_s",
    "bytes",
    "slowdown",
    "waited_core",
    "waited_blocked",
    "resume_s",
    "rss_save",
    "rss_resume",
)
#: Rows of ours whose ratios to the best peer get a column of their own beside the default's:
#: the publish on the training process's thread, and the publish of a stop (training waits).
EXTRA_COLUMNS = ("thread", "stop")
#: The slowdown and its parts that the kernel accounts: shown side by side, not as ratios.
SHARES = ("slowdown", "waited_core", "waited_blocked")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# -- the state --------------------------------------------------------------------------------


def build_state(size: int, adam_steps: int) -> tuple[Any, Any]:
    """Real weights tiled to size / 3 bytes of float32 parameters, and Adam after real steps
    (the gradient of a smooth loss of the weights: the moments take real distributions)."""
    import torch

    from restorepoint.testing.weights import safetensors_state_dict

    corpus = [t for t in safetensors_state_dict().values() if t.is_floating_point()]
    model = torch.nn.Module()
    want, have, i = size // 3, 0, 0
    while have < want:
        t = corpus[i % len(corpus)].float()
        scale = 1.0 + 1e-3 * (i // len(corpus))
        n = min(t.numel(), (want - have) // 4)
        if n <= 0:
            break
        data = (t.flatten()[:n] * scale).reshape(t.shape if n == t.numel() else (n,))
        model.register_parameter(f"p{i}", torch.nn.Parameter(data.clone()))
        have += n * 4
        i += 1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(adam_steps):
        for p in model.parameters():
            loss = ((p - p.detach().roll(1)) ** 2).mean() + 1e-2 * (p * p).sum()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


# -- the run ----------------------------------------------------------------------------------


def state_digest(model: Any) -> str | None:
    """The model's state digest (the runtime's: equal only when every tensor is bit for bit
    the same)."""
    from restorepoint.runtime.state import state_digest as digest

    return digest(model.state_dict())


# -- the resume, in a process of its own ------------------------------------------------------

#: What a resume process reports back.
RESUMED = ("resume_s", "rss_resume", "load_resume")
#: Each tool's modules, imported before the resume is timed.
PRELOAD = {
    "restorepoint": ("restorepoint.torch",),
    "dcp.save": ("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict"),
    "dcp.async_save": ("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict"),
    "lightning": ("lightning.fabric.plugins.io.torch_io",),
}


def resume_elsewhere(cycle: Cycle, tool: str, tag: str, size: int, digest: str | None) -> None:
    """The resume of ``tool``'s checkpoint in a fresh process, as on the empty machine a
    preempted job restarts on: it builds the model and its optimizer (no state yet), then
    times the resume to the end of the first step, and checks the resumed model against the
    saved one's digest. Its start and the model's build are not timed. A fresh process has
    none of this one's history (memory its allocator kept from earlier tools' rounds, which
    in one process showed as resume RSS growing round after round)."""
    spec = {
        "tool": tool,
        "tag": tag,
        "size": size,
        "kind": cycle.store.kind,
        "root": cycle.store.root,
        "options": cycle.store.options,
        "work": str(cycle.work),
        "digest": digest,
    }
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--resume-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the resume process failed (exit {proc.returncode}): {tail}")
    cycle.out.update(json.loads(proc.stdout.strip().splitlines()[-1]))


def resume_child(text: str) -> int:
    """A resume process (``--resume-child SPEC``): one tool's resume, its figures as a JSON
    line on stdout."""
    import gc

    import torch

    spec = json.loads(text)
    torch.set_num_threads(1)
    # What a training script has imported before it resumes: the tool's own library (its
    # import is not the resume's time), and s3fs for a store on S3.
    for module in PRELOAD.get(spec["tool"].split("-")[0], ()):
        __import__(module)
    if spec["kind"] != "local":
        __import__("s3fs")
    model, optimizer = build_state(spec["size"], 0)
    compute = Compute()
    # The math library's own start is not the resume's: the step it times is a warm one.
    compute.step()
    store = Store.attach(spec["kind"], spec["root"], spec["options"])
    cycle = Cycle(model, optimizer, compute, store, Path(spec["work"]))
    gc.collect()
    cycle.resume(spec["tool"], spec["tag"])
    found = state_digest(model)
    if found is None or found != spec["digest"]:
        print(f"{spec['tool']}: the resumed model differs from the saved one", file=sys.stderr)
        return 1
    print(json.dumps({k: cycle.out[k] for k in RESUMED}))
    return 0


def make_room(size: int) -> None:
    """Touch and free ``size`` bytes of fresh memory: the kernel then reclaims, before any
    tool runs, the page cache that the previous size's files left, which the first tool of
    the size would otherwise pay for in its pause (a copy into fresh pages: measured at 4 GiB,
    7 s for whichever tool came first against 1.2 s in isolation)."""
    import torch

    room = torch.ones(max(1, size // 4), dtype=torch.float32)
    del room


def measure_size(
    size: int, stores: list[str], tools: list[str], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    import gc

    model, optimizer = build_state(size, args.adam_steps)
    compute = Compute()
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    digest = state_digest(model)
    parking = Parking(model, optimizer, workdir / f"parked-{size}.pt") if args.parks else None
    make_room(state_bytes)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {t: [] for t in tools} for s in stores}
    opened = {kind: Store(kind, workdir) for kind in stores}
    failures: list[str] = []
    try:
        for r in range(args.repeat):
            for kind in stores:
                order = list(tools)
                random.Random(1000 * r + len(kind)).shuffle(order)
                for tool in order:
                    store = opened[kind]
                    store.clear()
                    cycle = Cycle(model, optimizer, compute, store, workdir)
                    tag = f"{size}-{r}-{kind}-{uuid.uuid4().hex[:6]}"
                    try:
                        cycle.save(tool, tag)
                        gc.collect()
                        try:
                            if parking is not None:
                                parking.park()
                            store.evict()
                            resume_elsewhere(cycle, tool, tag, size, digest)
                        finally:
                            if parking is not None:
                                parking.unpark()
                                assert state_digest(model) == digest, "unparked state differs"
                    except BaseException as exc:  # DCP's CheckpointException is a BaseException
                        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                            raise
                        # A store that fails a request past its retries (moto under load
                        # answers 500) fails that cycle, not the run: it is reported, not timed.
                        failures.append(f"{kind} round {r} {tool}: {type(exc).__name__}: {exc}")
                        print(f"  FAILED {failures[-1]}", file=sys.stderr, flush=True)
                        continue
                    finally:
                        gc.collect()
                    runs[kind][tool].append(cycle.out)
                    print(
                        f"  {size / (1 << 30):.3g} GiB {kind:5} round {r} {tool:15}"
                        f" pause {cycle.out['pause_s']:7.3f} s  published"
                        f" {cycle.out['published_s']:7.3f} s  resume {cycle.out['resume_s']:7.3f} s"
                        + (
                            f"  last.pt saved {cycle.out['saved_s']:7.3f} s"
                            if "saved_s" in cycle.out
                            else ""
                        )
                        + _slowdown(cycle.out)
                        + f"  (load {cycle.out['load_resume']:.2f})",
                        file=sys.stderr,
                        flush=True,
                    )
                store.clear()
    finally:
        for store in opened.values():
            store.close()
        if parking is not None:
            parking.path.unlink(missing_ok=True)
    return {
        "size": size,
        "state_bytes": state_bytes,
        "parked": parking is not None,
        "runs": runs,
        "failures": failures,
    }


def _slowdown(out: dict[str, Any]) -> str:
    if out.get("slowdown") is None:
        return ""
    text = f"  slowdown {out['slowdown']:+.1%}"
    if out.get("waited_core") is not None:
        text += (
            f" (mean {out['slowdown_mean']:+.1%}: waited for a core {out['waited_core']:+.1%},"
            f" blocked {out['waited_blocked']:+.1%}, CPU time {out['slowdown_cpu']:+.1%})"
        )
    return text


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians per tool and figure, and each figure of ours as a ratio to the best peer."""
    out: dict[str, Any] = {}
    for kind, by_tool in result["runs"].items():
        med: dict[str, dict[str, float | None]] = {}
        for tool, rounds in by_tool.items():
            med[tool] = {}
            for fig in (*FIGURES, "load_save", "load_resume"):
                values = [r[fig] for r in rounds if r.get(fig) is not None]
                med[tool][fig] = statistics.median(values) if values else None
        ratios = {tool: _ratios(med, tool) for tool in OURS if tool in med}
        # The default's ratios; with only other rows of ours, the first of them.
        first = next(iter(ratios), "restorepoint")
        out[kind] = {
            "median": med,
            "vs_best_peer": ratios.get("restorepoint", ratios.get(first, {})),
        }
        if "restorepoint-nice0" in ratios:
            out[kind]["vs_best_peer_nice0"] = ratios["restorepoint-nice0"]
        for extra in EXTRA_COLUMNS:
            if f"restorepoint-{extra}" in ratios and first != f"restorepoint-{extra}":
                out[kind][f"vs_best_peer_{extra}"] = ratios[f"restorepoint-{extra}"]
    return out


def _ratios(med: dict[str, dict[str, float | None]], ours_tool: str) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    for fig in FIGURES:
        ours = med[ours_tool].get(fig)
        peers = {t: v[fig] for t, v in med.items() if t not in OURS and v[fig] is not None}
        if ours is None or not peers:
            ratios[fig] = None
            continue
        best = min(peers, key=lambda t: peers[t])  # type: ignore[arg-type,return-value]
        if fig in SHARES:
            ratios[fig] = {"ours": ours, "best_peer": best, "peer": peers[best]}
            continue
        value = peers[best]
        ratios[fig] = {"ratio": ours / value if value else None, "best_peer": best}
    return ratios


def fmt(fig: str, v: float | None) -> str:
    if v is None:
        return "-"
    if fig == "bytes":
        return f"{v / (1 << 20):.0f} MiB"
    if fig.startswith("rss"):
        return f"{v / (1 << 20):.0f} MiB"
    if fig in SHARES:
        return f"{v:+.1%}"
    return f"{v:.2f} s"


def _cell(fig: str, r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if fig in SHARES:
        return f"{r['ours']:+.1%} vs {r['peer']:+.1%} ({r['best_peer']})"
    return f"{r['ratio']:.2f}x ({r['best_peer']})" if r["ratio"] else "-"


def print_table(results: list[dict[str, Any]]) -> None:
    names = {
        "pause_s": "pause per snapshot",
        "published_s": "snapshot -> published",
        "bytes": "bytes stored",
        "slowdown": "step slowdown during publish",
        "waited_core": "  mean step: waited for a core",
        "waited_blocked": "  mean step: blocked (the GIL)",
        "resume_s": "empty machine -> first step",
        "rss_save": "peak RSS, save",
        "rss_resume": "peak RSS, resume",
    }
    for res in results:
        for kind, summary in res["summary"].items():
            med = summary["median"]
            tools = list(med)
            print(
                f"\n== {res['state_bytes'] / (1 << 30):.2f} GiB of state, {kind} store"
                f" (median of {res['repeat']}; load average {res['load_start']:.2f}"
                f" -> {res['load_end']:.2f})"
            )
            extras = {
                e: summary[f"vs_best_peer_{e}"]
                for e in EXTRA_COLUMNS
                if summary.get(f"vs_best_peer_{e}")
            }
            head = "  ours / best peer" + "".join(f" | {e} / best peer" for e in extras)
            print(f"{'figure':30}" + "".join(f"{t:>19}" for t in tools) + head)
            for fig in FIGURES:
                row = f"{names[fig]:30}" + "".join(f"{fmt(fig, med[t][fig]):>19}" for t in tools)
                cell = _cell(fig, summary["vs_best_peer"].get(fig))
                cell += "".join(f" | {_cell(fig, ratios.get(fig))}" for ratios in extras.values())
                print(row + f"  {cell}")
            loads = "".join(f"{med[t]['load_resume'] or 0:>19.2f}" for t in tools)
            print(f"{'load average (1 min)':30}" + loads)


#: How each figure is drawn: its title, and the factor and unit of its axis.
PLOTTED = {
    "pause_s": ("pause per snapshot", 1.0, "s"),
    "published_s": ("snapshot -> published", 1.0, "s"),
    "bytes": ("bytes stored", 1 / (1 << 30), "GiB"),
    "slowdown": ("step slowdown during the publish", 100.0, "%"),
    "waited_core": ("the step waited for a core", 100.0, "%"),
    "waited_blocked": ("the step blocked (the GIL)", 100.0, "%"),
    "resume_s": ("empty machine -> first step", 1.0, "s"),
    "rss_save": ("peak RSS, save", 1 / (1 << 30), "GiB"),
    "rss_resume": ("peak RSS, resume", 1 / (1 << 30), "GiB"),
}


def plot(results: list[dict[str, Any]], target: Path) -> str:
    """Each figure against the state's size, ours and each peer (a grid of 4 columns per
    store); or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib to get one)"
    kinds = sorted({k for r in results for k in r["summary"]})
    cols = 4
    per_kind = -(-len(FIGURES) // cols)
    fig, axes = plt.subplots(
        per_kind * len(kinds), cols, figsize=(4 * cols, 3.2 * per_kind * len(kinds)),
        squeeze=False,
    )  # fmt: skip
    for i, kind in enumerate(kinds):
        tools = sorted({t for r in results for t in r["summary"].get(kind, {}).get("median", {})})
        for j, name in enumerate(FIGURES):
            ax = axes[i * per_kind + j // cols][j % cols]
            title, factor, unit = PLOTTED[name]
            for tool in tools:
                xs, ys = [], []
                for r in results:
                    v = r["summary"].get(kind, {}).get("median", {}).get(tool, {}).get(name)
                    if v is not None:
                        xs.append(r["state_bytes"] / (1 << 30))
                        ys.append(v * factor)
                ax.plot(xs, ys, marker="o", label=tool)
            ax.set_title(f"{title} ({kind} store)", fontsize=9)
            ax.set_xlabel("state, GiB", fontsize=8)
            ax.set_ylabel(unit, fontsize=8)
            ax.grid(alpha=0.3)
        for j in range(len(FIGURES), per_kind * cols):
            axes[i * per_kind + j // cols][j % cols].axis("off")
        axes[i * per_kind][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    return f"plot written to {target}"


#: Memory a size asks for, in states: this process's state, a snapshot's copy of it and a resumed
#: copy, with room to spare; parked (``--park``), the resumed copy takes the parked one's place.
NEEDS = {False: 3.5, True: 2.4}


def fits(size: int, parked: bool) -> bool:
    """Whether the run fits in this machine's available memory (``NEEDS``)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return size * NEEDS[parked] <= info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G,4G,8G", help="state sizes: 32M, 1G, ... (a list)")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--adam-steps", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--plot", type=Path, default=None, help="default: docs/ beside performance.md"
    )
    parser.add_argument(
        "--hogs", type=int, default=0, help="other processes keeping a core busy each"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="run a size the memory check would skip (about 3.5x the state is asked for, "
        "2.4x parked; fewer tools need less: 8 GiB without dcp.async_save peaked at 20 GiB "
        "in use)",
    )
    parser.add_argument(
        "--park",
        choices=("auto", "always", "never"),
        default="auto",
        help="move this process's state to disk while each resume runs (auto: where the "
        "state and a resumed one do not fit side by side)",
    )
    parser.add_argument("--resume-child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """N processes that each keep a core busy until terminated (a loaded machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, n))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import warnings

    # DCP says, at every call, that it saves in one process: it does, on purpose.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    try:
        import torch
    except ImportError:
        print(HINT, file=sys.stderr)
        return 2
    if args.resume_child is not None:
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        return resume_child(args.resume_child)
    tools, skipped = available_tools(args.tools.split(","))
    stores = args.stores.split(",")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="rp-resume-")) if own else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    results, notes = [], [f"{t}: skipped ({why})" for t, why in skipped.items()]
    hogs = start_hogs(args.hogs)
    if hogs:
        notes.append(f"{len(hogs)} busy-loop processes ran beside the benchmark (--hogs)")
    try:
        for text in args.size.split(","):
            size = parse_size(text)
            # auto: park where the state and a resumed one do not fit side by side.
            args.parks = args.park == "always" or (args.park == "auto" and not fits(size, False))
            if not args.no_memory_check and not fits(size, args.parks):
                notes.append(f"{text}: skipped, does not fit in this machine's memory")
                print(notes[-1], file=sys.stderr)
                continue
            if args.parks:
                notes.append(f"{text}: the state parked on disk during each resume (--park)")
            started = load()
            res = measure_size(size, stores, tools, args, workdir)
            notes += [f"{text}: failed, not timed: {f}" for f in res["failures"]]
            res.update(repeat=args.repeat, load_start=started, load_end=load())
            res["summary"] = summarize(res)
            results.append(res)
    finally:
        for hog in hogs:
            hog.terminate()
            hog.wait(10)
        torch.set_num_threads(previous_threads)
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(results)
    target = args.plot or Path(__file__).resolve().parent.parent / "docs" / "bench_resume.png"
    notes.append(plot(results, target) if results else "no size ran: no plot")
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "workdir_fs": fs_type(workdir),
        "moto": "a server process of its own on 127.0.0.1",
        "restorepoint": measured(),
    }
    for note in notes:
        print(f"note: {note}")
    if args.json:
        print(json.dumps({"env": env, "notes": notes, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
