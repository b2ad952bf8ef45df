"""The explicit limits of format v1 (spec section "Limits"). Readers enforce every one of them
before they allocate or trust anything; writers never produce an object that breaks one."""

from __future__ import annotations

__all__ = [
    "CHUNK_SIZE_DEFAULT",
    "CHUNK_SIZE_MAX",
    "CHUNK_SIZE_MIN",
    "GATE_PREFIX_MAX",
    "MAX_COMPONENT_BYTES",
    "MAX_DELTA_BASES",
    "MAX_ENTRIES",
    "MAX_HEAD_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_METRICS",
    "MAX_METRIC_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_PATH_DEPTH",
    "MAX_SAFE_INTEGER",
    "MAX_SIGNATURE_BYTES",
    "zstd_bound",
]

#: Everything a reader needs for the import gate lies in this many leading bytes.
GATE_PREFIX_MAX = 1 << 20
#: The head: the preamble (16 bytes), the head and its digest (32 bytes) fit in GATE_PREFIX_MAX.
MAX_HEAD_BYTES = GATE_PREFIX_MAX - 16 - 32
#: The index (the payload table) is read whole before any payload byte is trusted.
MAX_INDEX_BYTES = 64 << 20
MAX_ENTRIES = 100_000
#: The signature block between the index and the footer (a few hundred bytes per signature).
MAX_SIGNATURE_BYTES = 64 << 10
MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255
#: Components of one payload path (directories and the file). The unpacker holds a descriptor
#: open for every directory on the path it is writing (so that no path is ever resolved by
#: name): this keeps it far below a default file-descriptor limit (256 on macOS, 1024 on
#: Linux). Real checkpoints nest a few levels; MAX_PATH_BYTES alone would allow 2048.
MAX_PATH_DEPTH = 128
#: Nesting depth of any JSON value in the head or index (a config is the deepest part).
MAX_JSON_DEPTH = 64
#: Values (objects, arrays, strings, numbers, literals; member names not counted) in one JSON
#: document, counted on its bytes before it is parsed: what a parsed value costs in memory is
#: bounded by this, not by the document's size. The reference writer's largest index (MAX_ENTRIES
#: entries of 9 values, and 4 more) is 900,004 values; this is twice that and more.
MAX_JSON_VALUES = 1 << 21
#: Metrics one head may record (the head member ``metrics``): names are 1 to
#: MAX_METRIC_NAME_BYTES ASCII characters. Metrics steer retention, never acceptance; the bounds
#: keep a hostile head from making a prune hold or print more than a small table.
MAX_METRICS = 64
MAX_METRIC_NAME_BYTES = 64
#: Every integer of the format is at most 2**53 - 1: the largest that RFC 8785 (I-JSON) and
#: every JSON reader represent exactly. Sizes, offsets and their sums are checked against it.
MAX_SAFE_INTEGER = (1 << 53) - 1
#: Bases one incremental restore point may name (spec section 28): a reader opens at most this
#: many other objects (head, footer and index each, bounded) to read it.
MAX_DELTA_BASES = 16
CHUNK_SIZE_MIN = 1 << 16
CHUNK_SIZE_MAX = 1 << 26
#: 4 MiB: large enough that per-chunk overhead vanishes, small enough that a pipeline of a few
#: chunks keeps memory bounded.
CHUNK_SIZE_DEFAULT = 1 << 22


def zstd_bound(n: int) -> int:
    """ZSTD_COMPRESSBOUND: the largest single zstd frame that n input bytes can produce."""
    small = ((128 << 10) - n) >> 11 if n < (128 << 10) else 0
    return n + (n >> 8) + small
