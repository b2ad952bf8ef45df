"""The byte-plane transform and its compression, measured on real trained weights: what the codec
planes chose and why (docs/performance.md, "Codec planes").

    python benchmarks/bench_planes.py [--repeat 9] [--workdir DIR] [--json]

- sizes: the real-weights checkpoint (restorepoint.testing.weights) in 4 MiB chunks, stored
  whole with zstd -1, as byte planes of width 2 and 4 (the whole shuffled chunk as one zstd
  frame, or each plane on its own, as is when it does not shrink), and as codec planes stores it;
- the transform, split and merge of a 4 MiB float32 chunk, with the standard library (bytes
  slicing, bytearray slice assignment), numpy (if installed) and blosc2's shuffle inside its own
  compressor (if installed; blosc2 has no shuffle without its container format), on one thread
  and on two (whether the GIL is held shows there), plus what importing numpy costs a process;
- zstd on the sign-and-exponent plane: levels 1, 3 and 19 against the plane parameters the codec
  uses, compressing and decompressing;
- the codec itself: encode, decode and the probe alone, against zstd -1 of the whole chunk.

Medians of ``--repeat`` runs of each; on a shared machine, run it when ``uptime`` is low.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zstandard

from restorepoint.format import codecs
from restorepoint.testing.weights import write_checkpoint

MIB = 1 << 20
CHUNK = 4 * MIB


def median_s(f: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def aggregate_gb_s(f: Callable[[], object], threads: int, calls: int, nbytes: int) -> float:
    """Throughput of ``calls`` calls of ``f`` spread over ``threads`` threads."""
    with ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        list(pool.map(lambda _: f(), range(calls)))
        elapsed = time.perf_counter() - started
    return calls * nbytes / elapsed / 1e9


def checkpoint_chunks(workdir: Path) -> dict[str, list[bytes]]:
    root = workdir / "real-weights"
    if not (root / ".complete").is_file():
        write_checkpoint(root)
        (root / ".complete").write_text("")
    out: dict[str, list[bytes]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".complete"):
        data = path.read_bytes()
        group = path.relative_to(root).parts[0]
        out.setdefault(group, []).extend(data[i : i + CHUNK] for i in range(0, len(data), CHUNK))
    return out


def full_chunk(chunks: list[bytes]) -> bytes:
    """A whole 4 MiB chunk from the middle of a group (of tensor data, not a file's end)."""
    middle = len(chunks) // 2
    return next(c for c in chunks[middle:] + chunks[:middle] if len(c) == CHUNK)


def sizes(groups: dict[str, list[bytes]]) -> dict[str, dict[str, float]]:
    level1 = zstandard.ZstdCompressor(level=1, write_checksum=False)
    plane = codecs._plane_compressor()
    codec = codecs.PlanesCodec(1)
    out = {}
    for group, chunks in groups.items():
        plain = sum(len(c) for c in chunks)
        row = {"plain_mib": plain / MIB, "zstd_1": 0.0, "planes_codec": 0.0}
        for width in (2, 4):
            row[f"w{width}_shuffled_zstd_1"] = 0.0
            row[f"w{width}_each_plane"] = 0.0
        for chunk in chunks:
            row["zstd_1"] += len(level1.compress(chunk))
            row["planes_codec"] += len(codec.encode(chunk))
            for width in (2, 4):
                split = codecs.split_planes(chunk, width)
                tail = chunk[len(chunk) // width * width :]
                row[f"w{width}_shuffled_zstd_1"] += len(level1.compress(b"".join(split) + tail))
                row[f"w{width}_each_plane"] += len(tail) + sum(
                    min(len(p), 4 + len(plane.compress(p))) for p in split
                )
        out[group] = {k: (v if k == "plain_mib" else plain / v) for k, v in row.items()}
    return out


def transform(chunk: bytes, repeat: int) -> dict[str, Any]:
    planes = codecs.split_planes(chunk, 4)
    out: dict[str, Any] = {}

    def std_split() -> object:
        return codecs.split_planes(chunk, 4)

    def std_merge() -> object:
        return codecs.merge_planes(list(planes), b"")

    candidates: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "stdlib": (std_split, std_merge)
    }
    try:
        import numpy as np

        def np_split() -> object:
            return np.frombuffer(chunk, np.uint8).reshape(-1, 4).T.tobytes()

        def np_merge() -> object:
            merged = bytearray(len(chunk))
            view = np.frombuffer(merged, np.uint8).reshape(-1, 4)
            for k, p in enumerate(planes):
                view[:, k] = np.frombuffer(p, np.uint8)
            return merged

        candidates["numpy"] = (np_split, np_merge)
        started = time.perf_counter()
        for _ in range(3):
            subprocess.run([sys.executable, "-c", "import numpy"], check=True)
        with_numpy = (time.perf_counter() - started) / 3
        started = time.perf_counter()
        for _ in range(3):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        out["numpy_import_s"] = round(with_numpy - (time.perf_counter() - started) / 3, 4)
    except ImportError:
        out["numpy"] = "not installed"
    for name, (split, merge) in candidates.items():
        out[name] = {
            "split_gb_s": round(CHUNK / median_s(split, repeat) / 1e9, 2),
            "merge_gb_s": round(CHUNK / median_s(merge, repeat) / 1e9, 2),
            "split_2_threads_gb_s": round(aggregate_gb_s(split, 2, 4 * repeat, CHUNK), 2),
            "merge_2_threads_gb_s": round(aggregate_gb_s(merge, 2, 4 * repeat, CHUNK), 2),
        }
    try:
        import blosc2

        cparams = {
            "typesize": 4,
            "clevel": 1,
            "codec": blosc2.Codec.ZSTD,
            "filters": [blosc2.Filter.SHUFFLE],
            "nthreads": 1,
        }
        packed = blosc2.compress2(chunk, **cparams)
        out["blosc2_shuffle_zstd_1"] = {
            "encode_gb_s": round(
                CHUNK / median_s(lambda: blosc2.compress2(chunk, **cparams), repeat) / 1e9, 2
            ),
            "decode_gb_s": round(
                CHUNK / median_s(lambda: blosc2.decompress2(packed), repeat) / 1e9, 2
            ),
            "ratio": round(CHUNK / len(packed), 3),
        }
    except ImportError:
        out["blosc2"] = "not installed"
    return out


def exponent_plane(chunk: bytes, repeat: int) -> dict[str, Any]:
    plane = codecs.split_planes(chunk, 4)[3]
    dec = zstandard.ZstdDecompressor()
    rows = {}
    for name, comp in (
        ("level 1", zstandard.ZstdCompressor(level=1)),
        ("level 3", zstandard.ZstdCompressor(level=3)),
        ("level 19", zstandard.ZstdCompressor(level=19)),
        ("codec planes", codecs._plane_compressor()),
    ):
        frame = comp.compress(plane)
        reps = 1 if name == "level 19" else repeat
        rows[name] = {
            "ratio": round(len(plane) / len(frame), 3),
            "compress_gb_s": round(
                len(plane) / median_s(lambda c=comp: c.compress(plane), reps) / 1e9, 3
            ),
            "decompress_gb_s": round(
                len(plane) / median_s(lambda f=frame: dec.decompress(f), repeat) / 1e9, 2
            ),
        }
    return rows


def codec_speed(groups: dict[str, list[bytes]], repeat: int) -> dict[str, Any]:
    return {
        group: _codec_on(full_chunk(groups[group]), repeat) for group in ("model", "model-bf16")
    }


def _codec_on(chunk: bytes, repeat: int) -> dict[str, Any]:
    codec = codecs.PlanesCodec(1)
    zstd = codecs.ZstdCodec(1)
    stored = codec.encode(chunk)
    frame = zstd.encode(chunk)
    sample = codecs._sample(chunk)

    def gb_s(f: Callable[[], object]) -> float:
        return round(len(chunk) / median_s(f, repeat) / 1e9, 2)

    return {
        "mode": list(stored[:3]),
        "planes_encode_gb_s": gb_s(lambda: codec.encode(chunk)),
        "planes_decode_gb_s": gb_s(lambda: codec.decode(stored, len(chunk))),
        "zstd_1_encode_gb_s": gb_s(lambda: zstd.encode(chunk)),
        "zstd_1_decode_gb_s": gb_s(lambda: zstd.decode(frame, len(chunk))),
        # The probe tries every mode on the sample; this is that, and the sample's encoding.
        "probe_ms": round(median_s(lambda: codecs.encode_planes(sample, 1), repeat) * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "restorepoint-bench"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    groups = checkpoint_chunks(args.workdir)
    fp32_chunk = full_chunk(groups["model"])
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_before": [round(x, 2) for x in load],
        "sizes_ratio": sizes(groups),
        "transform_fp32_4mib": transform(fp32_chunk, args.repeat),
        "exponent_plane_fp32": exponent_plane(fp32_chunk, args.repeat),
        "codec_4mib": codec_speed(groups, args.repeat),
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "zstandard": zstandard.__version__,
    }
    print(f"{report['date']}, load {report['load_before']} before, {report['load_after']} after")
    print("\ncompression ratio (plain / stored), 4 MiB chunks:")
    for group, row in report["sizes_ratio"].items():
        cells = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "plain_mib")
        print(f"  {group} ({row['plain_mib']:.1f} MiB): {cells}")
    print("\ntransform of a 4 MiB float32 chunk (width 4), GB/s:")
    for name, row in report["transform_fp32_4mib"].items():
        print(f"  {name}: {row}")
    print("\nzstd on the sign-and-exponent plane of that chunk (1 MiB):")
    for name, row in report["exponent_plane_fp32"].items():
        print(f"  {name}: {row}")
    print("\nthe codec on one 4 MiB chunk from the middle of each group:")
    for name, row in report["codec_4mib"].items():
        print(f"  {name}: {row}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
