"""Where an incremental restore point cuts a file into chunks (spec section 28.4,
docs/performance.md "Chunking for incremental restore points"): at the start and the end of
every tensor of at least GROUP bytes that the container lists in a table read without running
code (a safetensors header, which is also the runtime's snapshot file; a zip's member table,
which is a torch.save or Lightning ``.ckpt``), and in fixed pieces of the chunk size within each
segment. A file of another kind is cut in fixed pieces from its start.

A tensor that moves (a pickle before it grew, a JSON header whose RNG state changed length) is
then still found whole. The table is only a hint: a wrong one costs reuse, never correctness,
since every chunk is named by its sha256."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["GROUP", "cuts_for"]

#: Tensors shorter than this get no cuts of their own: a run of biases and norms is one segment.
GROUP = 64 << 10
#: The most of a safetensors header read to find its tensors.
MAX_TABLE = 64 << 20
_LOCAL = struct.Struct("<4s5H3L2H")


def cuts_for(
    path: str, size: int, chunk_size: int, opener: Callable[[], BinaryIO] | None = None
) -> list[int] | None:
    """The starts of chunks 1..n-1 of the file at ``path`` (or of the file in memory that
    ``opener`` streams: a safetensors header is read from its start, which is the runtime's
    snapshot), or None for fixed chunks."""
    try:
        if opener is not None:
            with opener() as stream:
                spans = _safetensors_spans(io.BytesIO(_header_of(stream, size)), size)
        else:
            with open(path, "rb") as f:
                spans = _zip_spans(f, size) or _safetensors_spans(f, size)
    except (OSError, ValueError, zipfile.BadZipFile, struct.error, RecursionError):
        return None
    if not spans:
        return None
    marks = sorted({m for start, end in spans for m in (start, end) if 0 < m < size})
    cuts: list[int] = []
    start = 0
    for end in [*marks, size]:
        cuts.extend(range(start, end, chunk_size))
        start = end
    return cuts[1:] or None


def _header_of(stream: BinaryIO, size: int) -> bytes:
    """The first bytes of a stream read once: the length prefix and, where it names a
    plausible safetensors header, the header (at most MAX_TABLE)."""
    prefix = _read_exactly(stream, min(8, size))
    if len(prefix) < 8:
        return prefix
    (length,) = struct.unpack("<Q", prefix)
    if not 2 <= length <= min(MAX_TABLE, size - 8):
        return prefix
    return prefix + _read_exactly(stream, length)


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = stream.read(n - len(out))
        if not got:
            break
        out += got
    return bytes(out)


def _zip_spans(f: BinaryIO, size: int) -> list[tuple[int, int]]:
    f.seek(0)
    if f.read(4) != b"PK\x03\x04":
        return []
    out = []
    with zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.compress_size < GROUP:
                continue
            f.seek(info.header_offset)
            local = _LOCAL.unpack(f.read(_LOCAL.size))
            if local[0] != b"PK\x03\x04":
                continue
            start = info.header_offset + _LOCAL.size + local[-2] + local[-1]
            end = start + info.compress_size
            if end <= size:
                out.append((start, end))
    return out


def _safetensors_spans(f: BinaryIO, size: int) -> list[tuple[int, int]]:
    f.seek(0)
    prefix = f.read(9)
    if len(prefix) < 9 or prefix[8:9] != b"{":
        return []
    (length,) = struct.unpack("<Q", prefix[:8])
    if not 2 <= length <= min(MAX_TABLE, size - 8):
        return []
    f.seek(8)
    header = json.loads(f.read(length))
    if not isinstance(header, dict):
        return []
    base = 8 + length
    out = []
    for name, value in header.items():
        if name == "__metadata__" or not isinstance(value, dict):
            continue
        offsets = value.get("data_offsets")
        if (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(v, int) for v in offsets)
            and 0 <= offsets[0] <= offsets[1]
            and offsets[1] - offsets[0] >= GROUP
            and base + offsets[1] <= size
        ):
            out.append((base + offsets[0], base + offsets[1]))
    return out
