"""The CLI at one size, as a user meets it, against the shell's tools, side by side in one run:
``restorepoint pack`` against ``tar -I 'zstd -1 -T0'`` then ``sha256sum`` of the archive, and
``restorepoint verify`` against ``sha256sum`` of the restore point.

    python benchmarks/bench_cli.py [--size-gib 0.5] [--repeat 5] [--workdir DIR] [--json]
                                   [--baseline DIR]

The source is bench_pack.py's synthetic one (float32 tensors of normally distributed values and
small JSON files, cached in the work directory; needs numpy). Each round runs the four commands
in a seeded shuffled order, with ``sync`` and half a second of quiet before each; the ratios are
the medians of the ratios within a round. The load average is printed beside each round. Goals
(issue 26): pack at most 0.5x the tar pipeline's time, verify at least 2.0x sha256sum's speed.

``--baseline DIR`` also runs pack and verify with the restorepoint package found in DIR (a
checkout of the code before a change, put first on ``PYTHONPATH``) in every round, shuffled
with the others: on a shared machine, a change is only measured against its baseline at the
same load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import compile_tree, measured, use_checkout

use_checkout()  # this checkout is what the CLI runs (PYTHONPATH), compiled as an install is

from bench_pack import ensure_synthetic  # noqa: E402


def cli() -> list[str]:
    script = Path(sys.executable).with_name("restorepoint")
    return [str(script)] if script.exists() else [sys.executable, "-m", "restorepoint"]


#: CPU seconds (user + system, the command and its children) of each command timed, by name:
#: on a loaded machine the wall time says how much CPU the others left, the CPU time what the
#: command itself needed.
CPU: dict[str, list[float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str] | str, env: dict[str, str] | None = None, name: str = "") -> float:
    subprocess.run(["sync"], check=True)
    time.sleep(0.5)
    cpu = _children_cpu()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, shell=isinstance(cmd, str), stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    CPU.setdefault(name, []).append(_children_cpu() - cpu)
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rp-bench")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with, same rounds")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    source, total = ensure_synthetic(args.workdir, args.size_gib)
    out = args.workdir / "cli-out"
    rp = out / "cli.rp"
    tar = out / "out.tar.zst"
    pack = [*cli(), "pack", str(source), str(rp), "--step", "0"]
    commands: dict[str, Any] = {
        "pack": lambda: (rp.unlink(missing_ok=True), timed(pack, name="pack"))[1],
        "tar": lambda: (tar.unlink(missing_ok=True), timed(
            f"tar -I 'zstd -1 -T0' -cf {tar} -C {source} . && sha256sum {tar}", name="tar"))[1],
        "verify": lambda: timed([*cli(), "verify", str(rp)], name="verify"),
        "sha256sum": lambda: timed(["sha256sum", str(rp)], name="sha256sum"),
    }  # fmt: skip
    if args.baseline is not None:
        compile_tree(args.baseline)
        path = [str(args.baseline.resolve()), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        base_rp = out / "base.rp"
        base_pack = [*pack[:-3], str(base_rp), *pack[-2:]]
        commands["base pack"] = lambda: (
            base_rp.unlink(missing_ok=True),
            timed(base_pack, env, "base pack"),
        )[1]
        commands["base verify"] = lambda: timed([*cli(), "verify", str(rp)], env, "base verify")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    timed(pack)  # the object verify reads
    rounds = []
    for r in range(args.repeat):
        order = list(commands)
        random.Random(r).shuffle(order)
        if order.index("verify") < order.index("pack"):
            order.remove("verify")
            order.append("verify")  # verify reads this round's object
        times = {name: commands[name]() for name in order}
        times["load"] = os.getloadavg()[0]
        rounds.append(times)
        base = (
            f"; baseline pack {times['base pack']:.3f} s, verify {times['base verify']:.3f} s"
            if args.baseline is not None
            else ""
        )
        print(
            f"round {r}: pack {times['pack']:.3f} s, tar pipeline {times['tar']:.3f} s, "
            f"verify {times['verify']:.3f} s, sha256sum {times['sha256sum']:.3f} s{base} "
            f"(load average {times['load']:.2f})",
            flush=True,
        )
    pack_ratio = statistics.median(t["pack"] / t["tar"] for t in rounds)
    verify_speed = statistics.median(t["sha256sum"] / t["verify"] for t in rounds)
    loads = [t["load"] for t in rounds]
    print(f"\nload average {min(loads):.2f} to {max(loads):.2f}")
    cpu = {name: statistics.median(v[-args.repeat :]) for name, v in CPU.items() if name}
    print("CPU seconds (median): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    if args.baseline is not None:
        base_pack_ratio = statistics.median(t["base pack"] / t["tar"] for t in rounds)
        base_verify = statistics.median(t["sha256sum"] / t["base verify"] for t in rounds)
        print(f"baseline: pack / tar pipeline {base_pack_ratio:.2f}, verify {base_verify:.2f}x")
    sizes = {"source": total, "restore point": rp.stat().st_size, "tar.zst": tar.stat().st_size}
    shutil.rmtree(out, ignore_errors=True)
    print(f"source {total / (1 << 30):.2f} GiB; sizes {sizes}; restorepoint {measured()}")
    print(f"pack / (tar | zstd -1 -T0 + sha256sum): {pack_ratio:.2f} (goal <= 0.5)")
    print(f"verify speed / sha256sum: {verify_speed:.2f}x (goal >= 2.0x)")
    if args.json:
        doc = {"rounds": rounds, "pack_ratio": pack_ratio, "verify_speed": verify_speed, "cpu": cpu}
        print(json.dumps({**doc, "sizes": sizes, "restorepoint": measured()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
