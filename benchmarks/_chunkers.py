"""The chunkings bench_chunking.py compares, and where a container's tensors start.

A chunker turns one file's bytes into chunk boundaries; every chunk is then named by its
sha256. Three kinds:

- ``fixed``: chunks of ``size`` bytes from the start of each file, the last shorter: what the
  format's frames are today (spec section 3).
- ``tensor``: a cut at the start of every tensor the container names without running a
  pickle (a safetensors header, a torch zip's member table), and fixed ``size`` pieces from
  each cut; files with no such table are chunked as ``fixed``.
- ``grouped``: as ``tensor``, but only tensors of at least 64 KiB get cuts (at their start and
  end): a run of shorter tensors is one segment.
- ``cdc``: content-defined chunking, FastCDC 2020 from ``pyfastcdc`` (a Cython extension),
  with an average size ``size`` (min size/4, max size*4, the library's defaults).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: A safetensors header larger than this is not one we wrote.
MAX_HEADER = 100_000_000
#: ``grouped``: tensors shorter than this share segments with their neighbours.
GROUP_BELOW = 64 << 10
#: A zip local file header's fixed part (APPNOTE 4.3.7).
ZIP_LOCAL_HEADER = 30

Cutter = Callable[[Path, memoryview], Iterator[tuple[int, int]]]


def parse_size(text: str) -> int:
    """``64K``, ``4M``, ``1G`` or a number of bytes."""
    text = text.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def size_label(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def cdc_available() -> str | None:
    """The CDC library's version, or None when it is not installed."""
    try:
        import pyfastcdc
    except ImportError:
        return None
    return str(pyfastcdc.__version__)


# -- where tensors start ---------------------------------------------------------------------


def safetensors_starts(data: memoryview) -> list[int] | None:
    """The file offsets where a safetensors file's header ends and each tensor starts."""
    if len(data) < 8:
        return None
    (length,) = struct.unpack_from("<Q", data)
    if length > min(MAX_HEADER, len(data) - 8):
        return None
    try:
        header = json.loads(bytes(data[8 : 8 + length]))
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    base = 8 + length
    starts = {base}
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict) and "data_offsets" in info:
            starts.add(base + int(info["data_offsets"][0]))
    return sorted(starts)


def zip_starts(path: Path, data: memoryview) -> list[int] | None:
    """The offsets of each member's data in a torch zip (torch.save, Lightning's .ckpt): the
    member table is read, never the pickle."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError):
        return None
    starts = set()
    for info in infos:
        at = info.header_offset
        if at + ZIP_LOCAL_HEADER > len(data):
            return None
        name_len, extra_len = struct.unpack_from("<HH", data, at + 26)
        starts.add(at + ZIP_LOCAL_HEADER + name_len + extra_len)
    return sorted(starts)


def tensor_starts(path: Path, data: memoryview) -> list[int] | None:
    """Tensor starts of a file the benchmark can read safely (a torch zip, a safetensors
    file: the runtime's snapshot file is one, whatever its name), or None."""
    if data[:4] == b"PK\x03\x04":
        return zip_starts(path, data)
    return safetensors_starts(data)


# -- the chunkers ----------------------------------------------------------------------------


def fixed_cuts(size: int) -> Cutter:
    def cut(_path: Path, data: memoryview) -> Iterator[tuple[int, int]]:
        for start in range(0, len(data), size):
            yield start, min(size, len(data) - start)

    return cut


def tensor_cuts(size: int) -> Cutter:
    def cut(path: Path, data: memoryview) -> Iterator[tuple[int, int]]:
        starts = tensor_starts(path, data) or []
        bounds = sorted({0, len(data), *(s for s in starts if 0 < s < len(data))})
        for lo, hi in itertools.pairwise(bounds):
            for start in range(lo, hi, size):
                yield start, min(size, hi - start)

    return cut


def grouped_cuts(size: int) -> Cutter:
    """As ``tensor_cuts``, but a tensor shorter than ``GROUP_BELOW`` gets no cut of its own:
    a run of short tensors (biases, norms) is one segment, cut in fixed pieces."""

    def cut(path: Path, data: memoryview) -> Iterator[tuple[int, int]]:
        starts = [s for s in tensor_starts(path, data) or [] if 0 < s < len(data)]
        ends = [*starts[1:], len(data)] if starts else []
        bounds = {0, len(data)}
        for start, end in zip(starts, ends, strict=True):
            if end - start >= GROUP_BELOW:
                bounds |= {start, end}
        ordered = sorted(bounds)
        for lo, hi in itertools.pairwise(ordered):
            for start in range(lo, hi, size):
                yield start, min(size, hi - start)

    return cut


def cdc_cuts(size: int) -> Cutter:
    from pyfastcdc import FastCDC

    chunker = FastCDC(avg_size=size)

    def cut(_path: Path, data: memoryview) -> Iterator[tuple[int, int]]:
        for chunk in chunker.cut_buf(data):
            yield chunk.offset, chunk.length

    return cut


@dataclass(frozen=True)
class Chunking:
    kind: str
    size: int

    @property
    def label(self) -> str:
        return f"{self.kind} {size_label(self.size)}"

    def cutter(self) -> Cutter:
        kinds = {"fixed": fixed_cuts, "tensor": tensor_cuts, "grouped": grouped_cuts}
        return (kinds | {"cdc": cdc_cuts})[self.kind](self.size)


# -- what is measured ------------------------------------------------------------------------


def read_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path, read whole (the chunking is timed on
    memory, not on the disk)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def chunk_digests(
    cutter: Cutter, root: Path, files: dict[str, bytes]
) -> Iterable[tuple[bytes, int]]:
    """(sha256, length) of every chunk of every file."""
    for name, data in files.items():
        view = memoryview(data)
        for start, length in cutter(root / name, view):
            yield hashlib.sha256(view[start : start + length]).digest(), length
