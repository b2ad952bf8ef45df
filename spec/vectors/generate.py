"""Golden vectors for restore-point format v1: a few valid objects and many broken ones, each
broken one with exactly one fault; gate vectors: expectation files (handoff JSON) under gate/
for valid objects, each with the import gate's decision; trust vectors under trust/: signed
and encrypted objects, valid or with one fault each, read with the fixed test keys of trust/keys/;
and vector sets under sets/: multi-part restore points (spec section 25), each a folder laid out
as a store lays it out (a commit and its parts), valid or with one fault each.

    python spec/vectors/generate.py           write the .rp files, gate/*.json, trust/, sets/ and
                                              the index files
    python spec/vectors/generate.py --check   regenerate in memory, compare byte for byte with the
                                              committed files, run the reader on every vector, the
                                              gate on every gate vector, the reader with the
                                              recorded trust options on every trust vector, and
                                              verify (every part too) on every set's commit

Every object is built with ``restorepoint.testing.forge``: it recomputes each digest, offset and
length that a vector does not override, so the planted fault is the only one. Nothing here
depends on the machine: ids and times are fixed, there is no randomness, and zstd frames are
written by this script (raw, RLE and literals-only compressed blocks) rather than by libzstd,
whose output may change from one release to the next. The trust vectors are deterministic too:
their keys, ephemeral keys and file key come from fixed seeds, AES-GCM with a fixed key and
nonce is a function, and Ed25519 signatures are deterministic (RFC 8032).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import struct
import sys
import tracemalloc
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

HERE = Path(__file__).resolve().parent
# The vectors are checked against the restorepoint of this checkout, not an installed one.
sys.path.insert(0, str(HERE.parents[1]))

import chains  # noqa: E402 - beside this file: incremental restore points
import snapshots  # noqa: E402 - beside this file: the runtime's snapshot vectors

import restorepoint  # noqa: E402
from restorepoint import errors  # noqa: E402
from restorepoint.format import (  # noqa: E402
    PayloadDecoder,
    canonical_dumps,
    read_manifest,
    restore_point_digest,
)
from restorepoint.format.identity import config_identity  # noqa: E402
from restorepoint.format.limits import MAX_HEAD_BYTES, MAX_INDEX_BYTES, zstd_bound  # noqa: E402
from restorepoint.ops import open_manifest  # noqa: E402
from restorepoint.ops.handoff import handoff_document, load_expectations  # noqa: E402
from restorepoint.testing.forge import ForgedEntry, Parts, assemble, encrypt  # noqa: E402
from restorepoint.trust import (  # noqa: E402
    PAYLOAD_TYPE,
    PublicKey,
    Trust,
    load_identity,
    load_public,
    pae,
    raw_public,
    signature_block,
    statement,
)

INDEX = "index.json"
GATE = "gate"
#: The gate vectors' records: a file of their own, so that index.json keeps one record shape.
GATE_INDEX = f"{GATE}/index.json"
#: The handoff marker, written here as the spec gives it (section 17), not taken from the code.
HANDOFF = "restorepoint-handoff/1"
TRUST = "trust"
#: The trust vectors' records: signed and encrypted objects, each with the options to read it.
TRUST_INDEX = f"{TRUST}/index.json"
TRUST_KEYS = f"{TRUST}/keys"
MAX_VECTOR_BYTES = 100_000
MAX_TOTAL_BYTES = 1_000_000
#: A bomb vector that made the reader allocate this much would not have been refused in time.
BOMB_PEAK_BYTES = 4 << 20
CHUNK = 65536
STORE = {"name": "none"}
ZSTD = {"level": 3, "name": "zstd"}
PLANES = {"level": 1, "name": "planes"}
PLANES_FEATURE = "planes/1"
OTHER_ID = "fedcba9876543210fedcba9876543210"


def record_outcome(expected_error: str | None, fault: str) -> dict[str, Any]:
    """A record's outcome fields: whether it is valid, the error class a reader must raise and
    the exit code of ``restorepoint verify``, and the fault planted."""
    valid = expected_error is None
    return {
        "valid": valid,
        "expected_error": expected_error,
        "exit_code": 0 if valid else getattr(errors, str(expected_error)).exit_code,
        "fault": fault,
    }


@dataclass(frozen=True)
class Vector:
    name: str
    data: bytes
    fault: str
    expected_error: str | None = None
    #: valid vectors: the position and every payload file's sha256 a reader must report
    position: dict[str, int] | None = None
    files: dict[str, str] | None = None
    #: the reader must refuse this one without allocating what the stored bytes ask for
    bomb: bool = False

    def record(self) -> dict[str, Any]:
        valid = self.expected_error is None
        out: dict[str, Any] = {
            "name": self.name,
            "file": f"{self.name}.rp",
            **record_outcome(self.expected_error, self.fault),
        }
        if valid:
            out["position"] = self.position
            out["files"] = self.files
        return out


# -- zstd frames, written by hand -------------------------------------------------------------

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: 128 KiB: the largest block zstd allows, and the window every frame here declares.
_WINDOW_LOG = 17
_BLOCK_MAX = 1 << _WINDOW_LOG


def _frame_header(content_size: int) -> bytes:
    # Not single-segment: a window of 128 KiB lets a block be slightly larger than its content
    # (a literals-only block is), which a single-segment window of the content size would not.
    if 256 <= content_size < 65536 + 256:
        flag, fcs = 1, struct.pack("<H", content_size - 256)
    elif content_size < 1 << 32:
        flag, fcs = 2, struct.pack("<I", content_size)
    else:
        flag, fcs = 3, struct.pack("<Q", content_size)
    return _ZSTD_MAGIC + bytes([flag << 6, (_WINDOW_LOG - 10) << 3]) + fcs


def _block_header(last: bool, kind: int, size: int) -> bytes:
    return (int(last) | kind << 1 | size << 3).to_bytes(3, "little")


def _raw_block(data: bytes, last: bool) -> bytes:
    return _block_header(last, 0, len(data)) + data


def _rle_block(byte: int, n: int, last: bool) -> bytes:
    return _block_header(last, 1, n) + bytes([byte])


def _literals_block(data: bytes, last: bool) -> bytes:
    """A compressed block of raw literals and no sequences."""
    n = len(data)
    if n < 32:
        header = bytes([n << 3])
    elif n < 4096:
        header = bytes([1 << 2 | (n & 15) << 4, n >> 4])
    else:
        header = bytes([3 << 2 | (n & 15) << 4, (n >> 4) & 255, n >> 12])
    body = header + data + b"\x00"  # Number_of_Sequences = 0
    return _block_header(last, 2, len(body)) + body


def zstd_frame(plain: bytes) -> bytes:
    """One zstd frame with its content size: a uniform piece becomes an RLE block, any other
    piece a literals-only compressed block followed by a raw block (two block kinds, and
    several blocks per frame, for every reader to decode)."""
    pieces: list[tuple[str, bytes]] = []
    for start in range(0, len(plain), _BLOCK_MAX - 8):
        piece = plain[start : start + _BLOCK_MAX - 8]
        if piece == piece[:1] * len(piece):
            pieces.append(("rle", piece))
        elif len(piece) > 1:
            half = len(piece) // 2
            pieces += [("literals", piece[:half]), ("raw", piece[half:])]
        else:
            pieces.append(("raw", piece))
    blocks = []
    for i, (kind, piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        if kind == "rle":
            blocks.append(_rle_block(piece[0], len(piece), last))
        elif kind == "literals":
            blocks.append(_literals_block(piece, last))
        else:
            blocks.append(_raw_block(piece, last))
    if not blocks:
        blocks.append(_raw_block(b"", True))
    return _frame_header(len(plain)) + b"".join(blocks)


def zstd_bomb(content_size: int, expands_to: int) -> bytes:
    """A frame declaring ``content_size`` whose RLE blocks expand to ``expands_to`` bytes."""
    n = expands_to // _BLOCK_MAX
    blocks = [_rle_block(0, _BLOCK_MAX, i == n - 1) for i in range(n)]
    return _frame_header(content_size) + b"".join(blocks)


# -- planes chunks, written by hand ------------------------------------------------------------


def planes_chunk(plain: bytes, width: int, compressed: int) -> bytes:
    """A chunk of codec planes in mode 2 (spec section 7): the planes of ``width``, those in the
    mask ``compressed`` as hand-written zstd frames, which must be shorter than their plane
    (uniform planes, whose frames are RLE blocks)."""
    count = len(plain) // width
    parts = [bytes([2, width, compressed])]
    for k in range(width):
        plane = plain[k : count * width : width]
        if compressed >> k & 1:
            frame = zstd_frame(plane)
            assert len(frame) < len(plane), "a compressed plane must be shorter than the plane"
            parts += [struct.pack("<I", len(frame)), frame]
        else:
            parts.append(plane)
    parts.append(plain[count * width :])
    return b"".join(parts)


def raw_chunk(plain: bytes) -> bytes:
    return b"\x00" + plain


def zstd_chunk(plain: bytes) -> bytes:
    frame = zstd_frame(plain)
    assert len(frame) < len(plain), "a mode-1 frame must be shorter than the chunk"
    return b"\x01" + frame


def floats(count: int, high: int, next_high: int, width: int = 4) -> bytes:
    """``count`` little-endian elements of ``width`` bytes whose two top bytes are fixed (the
    sign and exponent of weights of one magnitude) and whose other bytes run through a
    pattern: the top planes are uniform, the others not."""
    out = bytearray()
    for i in range(count):
        low = bytes(((i * 37 + j * 101) >> j) & 0xFF for j in range(width - 2))
        out += low + bytes([next_high, high])
    return bytes(out)


def planes_entry(path: str, data: bytes, chunks: list[bytes]) -> ForgedEntry:
    return ForgedEntry(path, len(data), sha(data), dict(PLANES), chunks)


def planes_parts(entries: list[ForgedEntry], **head: Any) -> Parts:
    parts = Parts.sample(files={}, **({"required_features": [PLANES_FEATURE]} | head))
    parts.entries = entries
    return parts


#: The payload of most broken planes vectors: one float32 chunk of 4096 bytes in mode 2.
SMALL_FLOATS = floats(1024, 0x3C, 0x80)


def small_planes(chunks: bytes | list[bytes] | None = None, data: bytes = SMALL_FLOATS) -> Parts:
    """One file of ``data`` stored as ``chunks`` (default: one mode-2 chunk, planes 2 and 3
    compressed)."""
    if chunks is None:
        chunks = planes_chunk(data, 4, 0b1100)
    stored = [chunks] if isinstance(chunks, bytes) else chunks
    return planes_parts([planes_entry("weights.f32", data, stored)])


# -- building blocks --------------------------------------------------------------------------


def pattern(n: int) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n]


def entry(path: str, data: bytes, codec: dict[str, Any] | None = None) -> ForgedEntry:
    codec = codec or STORE
    if codec["name"] != "zstd":
        return ForgedEntry.from_bytes(path, data, codec=codec, chunk_size=CHUNK)
    chunks = [zstd_frame(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]
    return ForgedEntry(path, len(data), hashlib.sha256(data).hexdigest(), dict(codec), chunks)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def small_files() -> dict[str, bytes]:
    """The payload of most broken vectors: small, so that sixty of them stay small."""
    return {
        "model.pt": pattern(512),
        "optimizer.pt": b"\x00" * 200,
        "trainer_state.json": b'{"step": 1500}',
    }


def parts_of(files: dict[str, bytes], codec: dict[str, Any] | None = None, **head: Any) -> Parts:
    base = Parts.sample(files={}, **head)
    base.entries = [entry(p, files[p], codec) for p in sorted(files, key=lambda p: p.encode())]
    return base


def small(**head: Any) -> Parts:
    return parts_of(small_files(), **head)


def with_paths(*paths: str) -> Parts:
    """A store-only object whose entries have these paths, in this order (no sorting)."""
    parts = small()
    parts.entries = [entry(p, f"contents of {p!a}\n".encode()) for p in paths]
    return parts


def layout(parts: Parts) -> tuple[str, int]:
    """The head's sha256 and where the payload starts, as ``assemble`` will lay them out."""
    head = canonical_dumps(parts.head)
    return sha(head), 16 + len(head) + 32


def index_doc(parts: Parts) -> dict[str, Any]:
    return parts.index_document(*layout(parts))


def offsets(data: bytes) -> dict[str, int]:
    """Where each region of an assembled object starts."""
    (head_length,) = struct.unpack_from("<I", data, 12)
    index_offset, index_length = struct.unpack_from("<QQ", data, len(data) - 64)
    return {
        "head": 16,
        "head_length": head_length,
        "digest": 16 + head_length,
        "payload": 16 + head_length + 32,
        "index": index_offset,
        "index_length": index_length,
        "footer": len(data) - 64,
        "end": len(data),
    }


# -- the vectors ------------------------------------------------------------------------------


@dataclass
class Vectors:
    items: list[Vector] = field(default_factory=list)

    def valid(self, name: str, parts: Parts, files: dict[str, bytes], what: str) -> None:
        digests = {p: sha(files[p]) for p in sorted(files, key=lambda p: p.encode())}
        self.items.append(
            Vector(name, assemble(parts), what, None, dict(parts.head["position"]), digests)
        )

    def broken(
        self, name: str, error: str, fault: str, parts: Parts | bytes, *, bomb: bool = False
    ) -> None:
        data = parts if isinstance(parts, bytes) else assemble(parts)
        self.items.append(Vector(name, data, fault, error, bomb=bomb))


def build() -> list[Vector]:
    v = Vectors()
    _valid(v)
    _preamble(v)
    _truncated(v)
    _head(v)
    _index(v)
    _layout(v)
    _payload(v)
    _planes(v)
    _paths(v)
    _multipart(v)
    names = [x.name for x in v.items]
    assert len(names) == len(set(names)), "vector names must be unique"
    return v.items


def _valid(v: Vectors) -> None:
    sample = {
        "model.pt": bytes(range(256)) * 300,
        "optimizer.pt": b"\x00" * 1000,
        "trainer_state.json": b'{"step": 1500}',
    }
    v.valid(
        "valid-store-only",
        parts_of(sample),
        sample,
        "The sample restore point, codec none: a two-chunk file, a zero-filled file, a small one.",
    )
    v.valid(
        "valid-zstd",
        parts_of(sample, ZSTD),
        sample,
        "The sample restore point, codec zstd: frames of RLE, literals-only and raw blocks.",
    )
    v.valid(
        "valid-empty-payload",
        parts_of({}),
        {},
        "A payload without entries: the index follows the head digest directly.",
    )
    empty = {"empty.bin": b""}
    parts = parts_of(empty)
    parts.entries.append(entry("empty.zst", b"", ZSTD))
    v.valid(
        "valid-zero-length-files",
        parts,
        {"empty.bin": b"", "empty.zst": b""},
        "Two zero-length files (codecs none and zstd): zero chunks, stored_size 0.",
    )
    one = {"one-chunk.bin": pattern(CHUNK)}
    v.valid(
        "valid-one-chunk",
        parts_of(one),
        one,
        "A file of exactly chunk_size bytes: one full chunk, no empty second chunk.",
    )
    two = {"chunk-plus-one.bin": pattern(CHUNK + 1)}
    v.valid(
        "valid-chunk-plus-one",
        parts_of(two),
        two,
        "A file of chunk_size + 1 bytes: a full chunk and a one-byte chunk.",
    )
    v.valid(
        "valid-no-config",
        small(
            config=None,
            config_identity=None,
            operational_keys=[],
            trainer=None,
            cache_root=None,
            cache_keys={},
            terms={},
            position={"step": 0},
        ),
        small_files(),
        "No config (and no identity), null trainer, null cache_root, step 0 without an epoch.",
    )
    parts = small(format_version="1.7", x_future_hint={"note": "ignored by 1.0 readers"})
    parts.minor = 7
    parts.entries[0].extra["x_future_entry"] = "ignored by 1.0 readers"
    v.valid(
        "valid-minor-1.7-unknown-fields",
        parts,
        small_files(),
        "Format 1.7 with an unknown optional head field and an unknown optional entry field.",
    )
    v.valid(
        "valid-metrics",
        small(metrics={"accuracy": 0.875, "tokens": 1500, "val_loss": 0.213}),
        small_files(),
        "The head records three metrics (spec 4.3): two fractions and an integer.",
    )
    nested = {
        "données/état.json": b'{"step": 1500}',
        "modèles/编码器/权重.pt": pattern(300),
        "Ω/ñandú/ünïcödé.bin": b"\x01" * 100,
        "a/b/c/d/e.txt": b"deep\n",
    }
    assert all(unicodedata.normalize("NFC", p) == p for p in nested)
    v.valid(
        "valid-unicode-nested",
        parts_of(nested),
        nested,
        "Nested directories and NFC Unicode names, sorted by their UTF-8 bytes.",
    )
    deepest = {"/".join(["d"] * 127) + "/deepest.bin": b"128 components\n", "top.bin": b"top\n"}
    v.valid(
        "valid-path-depth-limit",
        parts_of(deepest),
        deepest,
        "A path of exactly MAX_PATH_DEPTH (128) components, beside one of a single component.",
    )


#: A commit's parts member (spec section 25): two ranks and a shared part.
_REF = {"digest": "ab" * 32, "id": "cd" * 16, "size": 4096}
MULTIPART_PARTS = {
    "objects": [
        {**_REF, "id": "c0" * 16, "name": "rank-00000.rp", "rank": 0},
        {**_REF, "id": "c1" * 16, "name": "rank-00001.rp", "rank": 1},
        {**_REF, "id": "cf" * 16, "name": "shared.rp", "rank": None},
    ],
    "reshardable": False,
    "world_size": 2,
}
MULTIPART_PART = {"commit": "0123456789abcdef" * 2, "rank": 1, "world_size": 2}


def _multipart_head(**head: Any) -> Parts:
    """A 1.1 object that lists multipart/1 (its files: the small ones, unless emptied)."""
    parts = small(format_version="1.1", required_features=["multipart/1"], **head)
    parts.minor = 1
    return parts


def _multipart(v: Vectors) -> None:
    v.valid(
        "valid-multipart-part",
        _multipart_head(part=MULTIPART_PART),
        small_files(),
        "Rank 1's part of a two-rank restore point (1.1, multipart/1).",
    )
    parts = small(parts=MULTIPART_PARTS)
    v.broken(
        "multipart-parts-without-feature",
        "MalformedManifest",
        "A head with parts whose required_features does not list multipart/1.",
        parts,
    )
    v.broken(
        "multipart-both-members",
        "MalformedManifest",
        "A head listing multipart/1 with both parts and part.",
        _multipart_head(parts=MULTIPART_PARTS, part=MULTIPART_PART),
    )
    v.broken(
        "multipart-neither-member",
        "MalformedManifest",
        "A head listing multipart/1 with neither parts nor part.",
        _multipart_head(),
    )
    missing = {**MULTIPART_PARTS, "objects": MULTIPART_PARTS["objects"][1:]}
    commit = parts_of({}, format_version="1.1", required_features=["multipart/1"])
    commit.minor = 1
    commit.head["parts"] = missing
    v.broken(
        "multipart-rank-without-part",
        "MalformedManifest",
        "A commit of two ranks that names a part for rank 1 only.",
        commit,
    )
    v.broken(
        "multipart-commit-with-payload",
        "MalformedManifest",
        "A commit whose payload is not empty: its parts hold the files.",
        _multipart_head(parts=MULTIPART_PARTS),
    )
    v.broken(
        "multipart-rank-beyond-world",
        "MalformedManifest",
        "A part of rank 2 in a world of two.",
        _multipart_head(part={**MULTIPART_PART, "rank": 2}),
    )
    same = parts_of({}, format_version="1.1", required_features=["multipart/1"])
    same.minor = 1
    first = MULTIPART_PARTS["objects"][0]["id"]
    same.head["parts"] = {
        **MULTIPART_PARTS,
        "objects": [{**o, "id": first} for o in MULTIPART_PARTS["objects"]],
    }
    v.broken(
        "multipart-duplicate-part-ids",
        "MalformedManifest",
        "A commit (no payload) that names its parts all by one id.",
        same,
    )
    v.broken(
        "multipart-in-format-1.0",
        "MalformedManifest",
        "Rank 1's part with format_version 1.0 in its head (and its preamble): multipart/1 "
        "came with 1.1.",
        small(format_version="1.0", required_features=["multipart/1"], part=MULTIPART_PART),
    )


def _preamble(v: Vectors) -> None:
    parts = small()
    parts.magic = b"\x89RPX\r\n\x1a\n"
    v.broken("bad-magic", "NotARestorePoint", "The magic's fourth byte is X, not T.", parts)
    parts = small(format_version="2.0")
    parts.major = 2
    v.broken(
        "major-version-2",
        "UnsupportedFormat",
        "Preamble and head say format 2.0, an unknown major version.",
        parts,
    )
    parts = small()
    parts.head_length = 0
    v.broken("head-length-zero", "LimitExceeded", "The preamble declares a head of 0 bytes.", parts)
    parts = small()
    parts.head_length = MAX_HEAD_BYTES + 1
    v.broken(
        "head-length-over-limit",
        "LimitExceeded",
        f"The preamble declares a head of {MAX_HEAD_BYTES + 1} bytes, one over the limit.",
        parts,
    )


def _truncated(v: Vectors) -> None:
    data = assemble(small())
    at = offsets(data)
    cuts = [
        ("empty", 0, "an empty object"),
        ("in-magic", 5, "inside the magic"),
        ("in-preamble", 12, "inside the preamble"),
        ("in-head", at["head"] + at["head_length"] // 2, "inside the head"),
        ("in-head-digest", at["payload"] - 10, "inside the head digest"),
        ("in-payload", at["payload"] + 100, "inside the first file's stored bytes"),
        ("in-index", at["index"] + at["index_length"] // 2, "inside the index"),
        ("before-footer", at["footer"], "where the footer should start"),
        ("in-footer", at["end"] - 10, "inside the footer"),
    ]
    for name, cut, where in cuts:
        v.broken(
            f"truncated-{name}",
            "TruncatedRestorePoint",
            f"The sample cut at byte {cut} of {at['end']}, {where}.",
            data[:cut],
        )
    parts = small()
    parts.trailing = b"appended\n"
    v.broken(
        "trailing-bytes",
        "TrailingBytes",
        "Nine bytes follow a complete, consistent footer.",
        parts,
    )


def _head(v: Vectors) -> None:
    parts = small()
    parts.head_digest = hashlib.sha256(b"another head").digest()
    v.broken("head-digest-mismatch", "DigestMismatch", "The head digest is of other bytes.", parts)

    parts = small()
    parts.head_bytes = json.dumps(parts.head, sort_keys=True).encode()
    v.broken(
        "head-not-canonical-whitespace",
        "MalformedManifest",
        "The head is sorted JSON with spaces after ':' and ',' (digests recomputed).",
        parts,
    )
    parts = small()
    parts.head_bytes = json.dumps(
        dict(reversed(list(parts.head.items()))), separators=(",", ":")
    ).encode()
    v.broken(
        "head-not-canonical-key-order",
        "MalformedManifest",
        "The head's keys are in reverse order, without whitespace (digests recomputed).",
        parts,
    )
    parts = small()
    parts.head_bytes = canonical_dumps(parts.head).replace(b'"step":1500', b'"step":1.5e3')
    v.broken(
        "head-not-canonical-number",
        "MalformedManifest",
        "The head spells the step 1500 as 1.5e3 (digests recomputed).",
        parts,
    )
    parts = small()
    canonical = canonical_dumps(parts.head)
    rp_id = f'"id":"{parts.head["id"]}"'.encode()
    parts.head_bytes = canonical.replace(rp_id, rp_id + b"," + rp_id)
    v.broken(
        "head-duplicate-key",
        "MalformedManifest",
        "The head holds the key id twice, with the same value.",
        parts,
    )
    deep: Any = {"leaf": 1}
    for _ in range(70):
        deep = {"d": deep}
    v.broken(
        "head-json-too-deep",
        "LimitExceeded",
        "The config nests 71 objects deep, beyond the JSON depth limit of 64.",
        small(config=deep, config_identity=config_identity(deep), operational_keys=[]),
    )
    v.broken(
        "head-version-disagrees",
        "MalformedManifest",
        "The head says format_version 1.1, the preamble 1.0.",
        small(format_version="1.1"),
    )
    v.broken(
        "unknown-required-feature",
        "UnsupportedFormat",
        "The head requires the feature x-sharded-payload, unknown to format 1.0.",
        small(required_features=["x-sharded-payload"]),
    )
    parts = small()
    parts.head["config"] = {**parts.head["config"], "lr": 0.002}
    v.broken(
        "config-identity-mismatch",
        "MalformedManifest",
        "The config's lr is 0.002 but config_identity is that of lr 0.001.",
        parts,
    )
    v.broken(
        "config-identity-without-config",
        "MalformedManifest",
        "config_identity is set while config is null.",
        small(config=None, operational_keys=[]),
    )
    v.broken(
        "step-negative",
        "MalformedManifest",
        "The position's step is -1.",
        small(position={"step": -1}),
    )
    v.broken(
        "step-not-integer",
        "MalformedManifest",
        "The position's step is 1.5.",
        small(position={"epoch": 1, "step": 1.5}),
    )
    v.broken(
        "batch-without-epoch",
        "MalformedManifest",
        "The position has a batch but no epoch.",
        small(position={"batch": 3, "step": 1500}),
    )
    v.broken(
        "id-not-hex",
        "MalformedManifest",
        "The id has uppercase hex digits.",
        small(id="0123456789ABCDEF0123456789ABCDEF"),
    )
    v.broken(
        "created-not-utc",
        "MalformedManifest",
        "created has a +01:00 offset instead of Z.",
        small(created="2026-01-01T01:00:00.000+01:00"),
    )
    v.broken(
        "metrics-not-finite",
        "MalformedManifest",
        "The metric val_loss is 1e999, a number beyond every finite double (digests recomputed).",
        _with_metric_text(b"1e999"),
    )
    v.broken(
        "metrics-too-many",
        "LimitExceeded",
        "The head records 65 metrics, beyond the limit of 64.",
        small(metrics={f"m{i:02d}": i for i in range(65)}),
    )
    v.broken(
        "metrics-name-unsafe",
        "MalformedManifest",
        "A metric name holds a space and a control character.",
        small(metrics={"val loss\u001b": 0.5}),
    )
    v.broken(
        "chunk-size-not-power-of-two",
        "MalformedManifest",
        "chunk_size is 98304 (3 * 32768), within the range but not a power of two.",
        small(chunk_size=98304),
    )
    v.broken(
        "chunk-size-below-minimum",
        "LimitExceeded",
        "chunk_size is 32768, a power of two below the minimum 65536.",
        small(chunk_size=32768),
    )


def _with_metric_text(text: bytes) -> Parts:
    """The small restore point with val_loss written as ``text`` in its head's bytes."""
    parts = small(metrics={"val_loss": 0.25})
    parts.head_bytes = canonical_dumps(parts.head).replace(
        b'"val_loss":0.25', b'"val_loss":' + text
    )
    return parts


def _index(v: Vectors) -> None:
    parts = small()
    parts.index_digest = hashlib.sha256(b"another index").digest()
    v.broken(
        "index-digest-mismatch",
        "DigestMismatch",
        "The footer's index digest is of other bytes.",
        parts,
    )
    parts = small()
    parts.index_extra["head_sha256"] = layout(small(position={"step": 1501}))[0]
    v.broken(
        "index-of-another-head",
        "MalformedManifest",
        "The index's head_sha256 is that of another head (step 1501).",
        parts,
    )
    parts = small()
    parts.index_extra["id"] = OTHER_ID
    v.broken("index-id-differs", "MalformedManifest", "The index names another id.", parts)
    parts = small()
    parts.index_bytes = json.dumps(index_doc(parts), sort_keys=True).encode()
    v.broken(
        "index-not-canonical",
        "MalformedManifest",
        "The index is sorted JSON with spaces after ':' and ',' (digest recomputed).",
        parts,
    )
    parts = small()
    parts.index_length = MAX_INDEX_BYTES + 1
    v.broken(
        "index-length-over-limit",
        "LimitExceeded",
        f"The footer declares an index of {MAX_INDEX_BYTES + 1} bytes, one over the limit.",
        parts,
    )
    parts = small()
    parts.entries[0].codec = {"name": "brotli"}
    v.broken(
        "unknown-codec",
        "UnsupportedFormat",
        "The first entry's codec is brotli, unknown to format 1.0.",
        parts,
    )
    parts = small()
    parts.entries[0].codec = {"name": "none", "x_param": 1}
    v.broken(
        "codec-unknown-parameter",
        "MalformedManifest",
        "The first entry's codec none has an unknown parameter.",
        parts,
    )


def _layout(v: Vectors) -> None:
    parts = small()
    parts.reserved = 1
    v.broken("footer-reserved-nonzero", "FramingError", "The footer's reserved field is 1.", parts)
    parts = small()
    parts.index_offset = offsets(assemble(parts))["index"] + 1
    v.broken(
        "index-offset-inconsistent",
        "FramingError",
        "The footer's index_offset is one past where the index starts.",
        parts,
    )
    parts = small()
    real = index_doc(parts)["payload"][1]["offset"]
    parts.entries[1].extra["offset"] = real + 1
    v.broken(
        "entry-offsets-not-contiguous",
        "FramingError",
        "The second entry's offset is one past where its stored bytes start.",
        parts,
    )
    # The stored bytes really take 1008 bytes (two store-only chunks of 500), and the index says
    # so: offsets add up, but one chunk of 1000 bytes can only be stored in 1004.
    parts = small()
    data = pattern(1000)
    parts.entries[0] = ForgedEntry("model.pt", 1000, sha(data), STORE, [data[:500], data[500:]])
    v.broken(
        "stored-size-impossible",
        "FramingError",
        "A 1000-byte store-only file (one chunk) stored as two chunks: stored_size 1008.",
        parts,
    )
    parts = small()
    parts.entries[0].stored_lengths = [0xFFFFFFFF]
    v.broken(
        "chunk-length-beyond-bound-none",
        "FramingError",
        "A store-only chunk of 512 bytes declares 4294967295 stored bytes.",
        parts,
    )
    # Two chunks, the first one tiny, so that the entry's stored_size stays possible and only
    # the second chunk's own length breaks the codec's bound.
    parts = parts_of({"model.pt": b"\x00" * CHUNK + pattern(1000)}, ZSTD)
    over = zstd_bound(1000) + 1
    frame = parts.entries[0].stored_chunks[1]
    parts.entries[0].stored_chunks[1] = frame + b"\x00" * (over - len(frame))
    v.broken(
        "chunk-length-beyond-bound-zstd",
        "FramingError",
        f"The second zstd chunk (1000 bytes) declares {over} stored bytes, over the zstd bound.",
        parts,
    )
    # zstd, not none: a store-only entry has exactly one possible stored_size, so the layout
    # check would catch the slack before the frames are read.
    parts = parts_of(small_files(), ZSTD)
    chunk = parts.entries[0].stored_chunks[0]
    parts.entries[0].stored_lengths = [len(chunk)]
    parts.entries[0].stored_chunks = [chunk + b"\x00\x00\x00"]
    v.broken(
        "entry-slack-bytes",
        "FramingError",
        "Three bytes follow the last zstd chunk frame, inside the entry's stored_size.",
        parts,
    )


def _payload(v: Vectors) -> None:
    parts = small()
    stored = bytearray(parts.entries[0].stored_chunks[0])
    stored[100] ^= 0x01
    parts.entries[0].stored_chunks[0] = bytes(stored)
    v.broken(
        "payload-digest-mismatch",
        "DigestMismatch",
        "One stored byte of a store-only chunk flipped; the index digests left as they were.",
        parts,
    )
    parts = small()
    parts.entries[0].stored_chunks[0] = parts.entries[0].stored_chunks[0][:-1]
    v.broken(
        "store-chunk-short",
        "DecodeError",
        "A store-only chunk of a 512-byte file stores 511 bytes (offsets and sizes consistent).",
        parts,
    )
    parts = parts_of(small_files(), ZSTD)
    frame = bytearray(parts.entries[0].stored_chunks[0])
    header = len(_frame_header(512))
    frame[header] |= 0b110  # block type 3: reserved
    parts.entries[0].stored_chunks[0] = bytes(frame)
    v.broken(
        "zstd-frame-corrupt",
        "DecodeError",
        "The first block of a zstd frame has the reserved block type 3.",
        parts,
    )
    parts = parts_of(small_files(), ZSTD)
    frame = parts.entries[0].stored_chunks[0]
    parts.entries[0].stored_chunks[0] = frame + zstd_frame(b"extra")
    v.broken(
        "zstd-two-frames",
        "DecodeError",
        "A zstd chunk holds its frame followed by a second, complete frame.",
        parts,
    )
    zeros = b"\x00" * 1000
    parts = parts_of({"model.pt": zeros}, ZSTD)
    bomb = zstd_bomb(32 << 20, 32 << 20)
    parts.entries[0].stored_chunks = [bomb]
    v.broken(
        "zstd-bomb-declared",
        "DecodeError",
        f"A 1000-byte chunk's {len(bomb)}-byte zstd frame declares and holds 32 MiB of zeros.",
        parts,
        bomb=True,
    )
    parts = parts_of({"model.pt": zeros}, ZSTD)
    parts.entries[0].stored_chunks = [zstd_bomb(1000, 32 << 20)]
    v.broken(
        "zstd-bomb-hidden",
        "DecodeError",
        "A zstd frame declares the chunk's 1000 bytes but its blocks expand to 32 MiB.",
        parts,
        bomb=True,
    )


def _planes(v: Vectors) -> None:
    """Codec planes (spec section 7) and its required feature planes/1 (section 12)."""
    fp32 = floats(CHUNK // 4, 0x3C, 0x80) + floats(250, 0x3D, 0x00) + b"\x7f"
    bf16 = bytes(x for i in range(3000) for x in ((i * 37) & 0xFF, 0x3F))
    fp64 = floats(500, 0x3F, 0xF0, width=8)
    log = b"=" * 3000
    noise = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(40))
    files = {"log.txt": log, "noise.bin": noise, "weights.bf16": bf16}
    files |= {"weights.f32": fp32, "weights.f64": fp64}
    entries = [
        planes_entry("log.txt", log, [zstd_chunk(log)]),
        planes_entry("noise.bin", noise, [raw_chunk(noise)]),
        planes_entry("weights.bf16", bf16, [planes_chunk(bf16, 2, 0b10)]),
        planes_entry(
            "weights.f32",
            fp32,
            [planes_chunk(fp32[:CHUNK], 4, 0b1100), planes_chunk(fp32[CHUNK:], 4, 0b1000)],
        ),
        planes_entry("weights.f64", fp64, [planes_chunk(fp64, 8, 0b11000000)]),
    ]
    v.valid(
        "valid-planes",
        planes_parts(entries),
        files,
        "Codec planes in every mode: raw, one zstd frame, byte planes of widths 2, 4 (a full "
        "chunk and a last chunk with a one-byte tail) and 8, some planes compressed.",
    )
    parts = parts_of(small_files(), ZSTD, required_features=[PLANES_FEATURE])
    v.valid(
        "valid-planes-feature-unused",
        parts,
        small_files(),
        "The head requires planes/1 and no entry uses codec planes (pack declares it up front).",
    )
    parts = small_planes()
    parts.head["required_features"] = []
    v.broken(
        "planes-without-feature",
        "MalformedManifest",
        "An entry of codec planes in an object whose head does not list planes/1.",
        parts,
    )
    parts = small_planes()
    parts.entries[0].codec = {"level": 1, "name": "planes", "width": 4}
    v.broken(
        "planes-codec-unknown-parameter",
        "MalformedManifest",
        "The codec object planes has an unknown parameter width.",
        parts,
    )
    good = planes_chunk(SMALL_FLOATS, 4, 0b1100)
    faults: list[tuple[str, str, bytes]] = [
        ("planes-mode-unknown", "The chunk's mode byte is 3.", b"\x03" + good[1:]),
        (
            "planes-width-3",
            "A planes chunk declares width 3 (its planes laid out for 4).",
            good[:1] + b"\x03" + good[2:],
        ),
        (
            "planes-mask-beyond-width",
            "The plane mask of a width-4 chunk has bit 4 set.",
            good[:2] + bytes([good[2] | 0x10]) + good[3:],
        ),
        (
            "planes-truncated",
            "The chunk ends 10 bytes into its last plane (offsets and sizes consistent).",
            good[: len(good) - 10],
        ),
        (
            "planes-tail-extra",
            "One byte follows the planes of a chunk that has no tail.",
            good + b"\x00",
        ),
        (
            "planes-length-beyond-chunk",
            "Plane 2's u32 length is 1000: shorter than its plane, longer than the chunk's rest.",
            _with_plane_length(good, 2, 1000),
        ),
        (
            "planes-frame-not-shorter",
            "Plane 3's frame (one raw block of its 1024 bytes) is not shorter than the plane.",
            _planes_with_frame(3, _frame_header(1024) + _raw_block(SMALL_FLOATS[3::4], True)),
        ),
        (
            "planes-frame-other-size",
            "A compressed plane's frame declares and holds 1023 bytes, its plane is 1024.",
            _planes_with_frame(3, zstd_frame(b"\x3c" * 1023)),
        ),
        (
            "planes-raw-short",
            "A raw chunk (mode 0) stores one byte fewer than the chunk's 4096.",
            raw_chunk(SMALL_FLOATS[:-1]),
        ),
        (
            "planes-zstd-not-shorter",
            "A mode-1 chunk's zstd frame is not shorter than the chunk's 4096 bytes.",
            b"\x01" + zstd_frame(SMALL_FLOATS),
        ),
    ]
    for name, fault, chunk in faults:
        v.broken(name, "DecodeError", fault, small_planes(chunk))
    # Two chunks, the first stored in a few bytes, so that the entry's stored_size stays
    # possible and only the second chunk's own length breaks the codec's bound (R9).
    data = b"\x3c" * CHUNK + SMALL_FLOATS
    over = good + b"\x00" * (len(SMALL_FLOATS) + 28 - len(good))
    parts = small_planes([zstd_chunk(data[:CHUNK]), over], data)
    v.broken(
        "chunk-length-beyond-bound-planes",
        "FramingError",
        "The second planes chunk (4096 bytes) declares 4124 stored bytes, over the bound p + 27.",
        parts,
    )
    flipped = bytearray(good)
    flipped[3 + 100] ^= 0x01  # in plane 0, stored as it is
    v.broken(
        "planes-digest-mismatch",
        "DigestMismatch",
        "One byte of a plane stored as it is flipped: it decodes, and the file's sha256 differs.",
        small_planes(bytes(flipped)),
    )
    zeros = bytes(8000)
    bomb = zstd_bomb(32 << 20, 32 << 20)
    v.broken(
        "planes-bomb-declared",
        "DecodeError",
        f"A plane of 2000 bytes stored as a {len(bomb)}-byte frame that declares 32 MiB.",
        small_planes(_planes_chunk_of(zeros, bomb), zeros),
        bomb=True,
    )
    v.broken(
        "planes-bomb-hidden",
        "DecodeError",
        "A plane's frame declares its 2000 bytes, but its blocks expand to 32 MiB.",
        small_planes(_planes_chunk_of(zeros, zstd_bomb(2000, 32 << 20)), zeros),
        bomb=True,
    )


def _with_plane_length(chunk: bytes, k: int, length: int) -> bytes:
    """``chunk`` (SMALL_FLOATS, width 4, mask 0b1100) with compressed plane ``k``'s length set."""
    assert k in (2, 3)
    at = 3 + 2 * 1024
    if k == 3:
        (first,) = struct.unpack_from("<I", chunk, at)
        at += 4 + first
    return chunk[:at] + struct.pack("<I", length) + chunk[at + 4 :]


def _planes_with_frame(k: int, frame: bytes) -> bytes:
    """SMALL_FLOATS in width 4, planes 2 and 3 compressed, plane ``k``'s frame replaced."""
    planes = [SMALL_FLOATS[j::4] for j in range(4)]
    parts = [bytes([2, 4, 0b1100]), planes[0], planes[1]]
    for j in (2, 3):
        f = frame if j == k else zstd_frame(planes[j])
        parts += [struct.pack("<I", len(f)), f]
    return b"".join(parts)


def _planes_chunk_of(plain: bytes, frame: bytes) -> bytes:
    """``plain`` (uniform) in width 4, planes 0 to 2 compressed as they should be, plane 3's
    frame replaced by ``frame``."""
    planes = [plain[j::4] for j in range(4)]
    parts = [bytes([2, 4, 0b1111])]
    for j in range(4):
        f = frame if j == 3 else zstd_frame(planes[j])
        parts += [struct.pack("<I", len(f)), f]
    return b"".join(parts)


def _paths(v: Vectors) -> None:
    cases: list[tuple[str, str, str, tuple[str, ...]]] = [
        ("path-dotdot", "UnsafePath", "A path ../outside.pt climbs out.", ("../outside.pt",)),
        ("path-absolute", "UnsafePath", "An absolute path /etc/passwd.", ("/etc/passwd",)),
        ("path-nul", "UnsafePath", "A path with a NUL byte.", ("model\x00.pt",)),
        ("path-backslash", "UnsafePath", "A path with a backslash.", ("dir\\model.pt",)),
        ("path-drive", "UnsafePath", "A path C:x that starts with a drive.", ("C:x",)),
        ("path-empty-component", "UnsafePath", "A path a//b.", ("a//b",)),
        ("path-dot-component", "UnsafePath", "A path a/./b.", ("a/./b",)),
        ("path-empty", "UnsafePath", "An empty path.", ("",)),
        ("path-control", "UnsafePath", "A path with an ESC character.", ("model\x1b.pt",)),
        (
            "path-duplicate",
            "UnsafePath",
            "The path model.pt twice.",
            ("model.pt", "model.pt"),
        ),
        (
            "path-case-collision",
            "UnsafePath",
            "Model.pt and model.pt collide after case folding.",
            ("Model.pt", "model.pt"),
        ),
        (
            "path-normalisation-collision",
            "UnsafePath",
            "caf\u00e9.pt (NFC) and cafe\u0301.pt (NFD) are one name after normalisation.",
            ("cafe\u0301.pt", "caf\u00e9.pt"),
        ),
        (
            "path-file-and-directory",
            "UnsafePath",
            "a is a file and the directory of a/b.",
            ("a", "a/b"),
        ),
        (
            "path-unsorted",
            "UnsafePath",
            "Entries optimizer.pt, model.pt: not in UTF-8 byte order.",
            ("optimizer.pt", "model.pt"),
        ),
        (
            "path-component-too-long",
            "LimitExceeded",
            "A path component of 256 bytes.",
            ("a" * 256,),
        ),
        (
            "path-too-long",
            "LimitExceeded",
            "A path of 4097 bytes (components of 100 bytes).",
            ("/".join(["b" * 100] * 40) + "/" + "c" * 57,),
        ),
        (
            "path-too-deep",
            "LimitExceeded",
            "A path of 129 components (MAX_PATH_DEPTH is 128), 257 bytes.",
            ("/".join(["d"] * 129),),
        ),
    ]
    for name, error, fault, paths in cases:
        v.broken(name, error, fault, with_paths(*paths))
    # A lone surrogate cannot be written by a canonical encoder; put it in by hand.
    parts = with_paths("model-X.pt")
    parts.index_bytes = canonical_dumps(index_doc(parts)).replace(b"model-X", b"model-\\ud800")
    v.broken(
        "path-lone-surrogate",
        "MalformedManifest",
        "A path with the lone surrogate \\ud800: not Unicode, so not canonical JSON.",
        parts,
    )


# -- gate vectors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GateVector:
    """An expectation file for a valid vector, and the gate's decision on it (spec 16, 17)."""

    name: str
    vector: str
    expect: dict[str, Any]
    mismatches: list[dict[str, Any]]
    what: str
    #: the expectation file is exactly what ``pack --handoff`` writes for the vector
    from_pack: bool = False
    #: the decision under the strict rule of every resume (``check``, ``import
    #: --check-keys``): a recorded field the file does not expect is unknown here
    strict: list[dict[str, Any]] = field(default_factory=list)

    @property
    def file(self) -> str:
        return f"{GATE}/{self.name.removeprefix('gate-')}.json"

    @property
    def data(self) -> bytes:
        # As ``pack --handoff`` writes a handoff file (spec section 17).
        return (
            json.dumps(self.expect, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        ).encode()

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "gate",
            "vector": f"{self.vector}.rp",
            "expect": self.file,
            "compatible": not self.mismatches,
            "exit_code": 3 if self.mismatches else 0,
            "mismatches": self.mismatches,
            "strict_compatible": not self.strict,
            "strict_exit_code": 3 if self.strict else 0,
            "strict_mismatches": self.strict,
            "fault": self.what,
        }


def head_of(data: bytes) -> dict[str, Any]:
    """The head document of an assembled object, straight from its bytes."""
    (head_length,) = struct.unpack_from("<I", data, 12)
    head: dict[str, Any] = json.loads(data[16 : 16 + head_length])
    return head


def handoff_of(head: dict[str, Any], url: str) -> dict[str, Any]:
    """The handoff document for a head, member by member as spec section 17 lists them."""
    return {
        "cache_keys": head["cache_keys"],
        "cache_root": head["cache_root"],
        "config": head["config"],
        "config_identity": head["config_identity"],
        "handoff": HANDOFF,
        "id": head["id"],
        "operational_keys": head["operational_keys"],
        "position": head["position"],
        "terms": head["terms"],
        "trainer": head["trainer"],
        "url": url,
    }


class _Drop:
    """A member to leave out of an expectation file."""


_DROP: Any = _Drop()


_FIELD_ORDER = ("trainer", "terms", "cache_root", "cache_keys", "config")


def strict_mismatches(
    head: dict[str, Any], doc: dict[str, Any], mismatches: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Spec section 16, the strict rule, spelled out on the documents themselves: each field
    the head records (a trainer, cache root or config that is not null; terms or cache keys
    that are not empty) that the expectation file does not hold is one mismatch, ``unknown``,
    with the recorded value as ``found`` (the config by its identity); in field order, the
    file's own mismatches in place."""
    recorded = {
        "trainer": (
            f"{head['trainer']['name']}={head['trainer']['version']}" if head["trainer"] else None
        ),
        "terms": head["terms"] or None,
        "cache_root": head["cache_root"],
        "cache_keys": head["cache_keys"] or None,
        "config": head["config_identity"],
    }
    known = {name: name in doc for name in _FIELD_ORDER}
    known["config"] = "config" in doc or "config_identity" in doc
    out: list[dict[str, Any]] = []
    for name in _FIELD_ORDER:
        if not known[name]:
            if recorded[name] is not None:
                out.append({"field": name, "found": recorded[name], "unknown": True})
            continue
        prefix = ("config", "config_identity") if name == "config" else (name,)
        out += [m for m in mismatches if m["field"].split(".")[0] in prefix]
    return out


def build_gate(vectors: list[Vector]) -> list[GateVector]:
    by_name = {x.name: x for x in vectors}
    sample = head_of(by_name["valid-store-only"].data)
    bare = head_of(by_name["valid-no-config"].data)
    base = handoff_of(sample, "valid-store-only.rp")
    bare_doc = handoff_of(bare, "valid-no-config.rp")
    identity = sample["config_identity"]
    out: list[GateVector] = []

    def gate(
        name: str,
        what: str,
        mismatches: list[dict[str, Any]],
        vector: str = "valid-store-only",
        from_pack: bool = False,
        **changes: Any,
    ) -> None:
        doc = json.loads(json.dumps(base if vector == "valid-store-only" else bare_doc))
        for key, value in changes.items():
            if value is _DROP:
                del doc[key]
            else:
                doc[key] = value
        head = sample if vector == "valid-store-only" else bare
        strict = strict_mismatches(head, doc, mismatches)
        out.append(GateVector(f"gate-{name}", vector, doc, mismatches, what, from_pack, strict))

    config = sample["config"]
    gate(
        "all-match",
        "The handoff that pack --handoff writes for valid-store-only: every expectation met.",
        [],
        from_pack=True,
    )
    gate(
        "trainer-version",
        "The trainer's version differs (1.0.1 expected, 1.0.0 recorded).",
        [{"field": "trainer", "expected": "fake-trainer=1.0.1", "found": "fake-trainer=1.0.0"}],
        trainer={"name": "fake-trainer", "version": "1.0.1"},
    )
    gate(
        "term-missing-on-restore-point",
        "A term nccl is expected that the restore point does not record: found is absent.",
        [{"field": "terms.nccl", "expected": "2.21"}],
        terms={**sample["terms"], "nccl": "2.21"},
    )
    gate(
        "term-extra-on-restore-point",
        "The restore point records a term cuda that is not expected: expected is absent.",
        [{"field": "terms.cuda", "found": "12.4"}],
        terms={"torch": "2.13.0"},
    )
    gate(
        "cache-root-differs",
        "The cache root differs.",
        [{"field": "cache_root", "expected": "/other-cache", "found": "/cache"}],
        cache_root="/other-cache",
    )
    gate(
        "cache-key-differs",
        "The cache key dataset differs.",
        [
            {
                "field": "cache_keys.dataset",
                "expected": "sha256:" + "cd" * 32,
                "found": "sha256:" + "ab" * 32,
            }
        ],
        cache_keys={"dataset": "sha256:" + "cd" * 32},
    )
    gate(
        "lr-differs",
        "The config's lr differs: refused by name, with both values.",
        [{"field": "config.lr", "expected": 0.0003, "found": 0.001}],
        config={**config, "lr": 0.0003},
    )
    gate(
        "operational-key-differs",
        "Only train.checkpoint_every differs, an operational key of the restore point: compatible.",
        [],
        config={**config, "train": {"checkpoint_every": 100}},
    )
    gate(
        "several",
        "Trainer, two terms, cache root, cache key and two config keys: all listed, in order.",
        [
            {"field": "trainer", "expected": "other-trainer=1.0.0", "found": "fake-trainer=1.0.0"},
            {"field": "terms.nccl", "expected": "2.21"},
            {"field": "terms.torch", "expected": "2.12.0", "found": "2.13.0"},
            {"field": "cache_root", "expected": None, "found": "/cache"},
            {"field": "cache_keys.dataset", "expected": "tok-v3", "found": "sha256:" + "ab" * 32},
            {"field": "config.model.depth", "expected": 12},
            {"field": "config.model.width", "expected": 128, "found": 64},
        ],
        trainer={"name": "other-trainer", "version": "1.0.0"},
        terms={"cuda": "12.4", "nccl": "2.21", "torch": "2.12.0"},
        cache_root=None,
        cache_keys={"dataset": "tok-v3"},
        config={**config, "model": {"depth": 12, "width": 128}},
    )
    gate(
        "only-terms",
        "A file with the marker and terms only: the absent members are not expected.",
        [],
        trainer=_DROP,
        cache_keys=_DROP,
        cache_root=_DROP,
        config=_DROP,
        config_identity=_DROP,
        id=_DROP,
        operational_keys=_DROP,
        position=_DROP,
        url=_DROP,
    )
    gate(
        "config-identity-only",
        "No config member: the config_identity is expected, and met.",
        [],
        config=_DROP,
    )
    other = config_identity({**config, "lr": 0.0003}, sample["operational_keys"])
    gate(
        "config-identity-differs",
        "No config member and another config_identity: one config_identity mismatch.",
        [{"field": "config_identity", "expected": other, "found": identity}],
        config=_DROP,
        config_identity=other,
    )
    gate(
        "config-null-expected",
        "config and config_identity null: a restore point without config is expected.",
        [{"field": "config_identity", "expected": None, "found": identity}],
        config=None,
        config_identity=None,
    )
    gate(
        "bare-all-match",
        "The handoff of valid-no-config: null trainer, cache root and config, empty maps.",
        [],
        vector="valid-no-config",
        from_pack=True,
    )
    gate(
        "sample-handoff-on-bare",
        "The handoff of valid-store-only against valid-no-config: each field a mismatch.",
        [
            {"field": "trainer", "expected": "fake-trainer=1.0.0", "found": None},
            {"field": "terms.cuda", "expected": "12.4"},
            {"field": "terms.torch", "expected": "2.13.0"},
            {"field": "cache_root", "expected": "/cache", "found": None},
            {"field": "cache_keys.dataset", "expected": "sha256:" + "ab" * 32},
            # The identity is computed with the restore point's operational keys: none here.
            {"field": "config_identity", "expected": config_identity(config, []), "found": None},
        ],
        vector="valid-no-config",
        **{k: v for k, v in base.items() if k not in ("id", "position", "url")},
    )
    gate(
        "unknown-here-cache-keys",
        "A handoff without cache_keys: the files' keys are not checked, but under the strict rule"
        " of every resume the recorded cache keys are unknown here: refused.",
        [],
        cache_keys=_DROP,
    )
    gate(
        "unknown-here-everything",
        "Only the marker: nothing is expected, so the lenient gate accepts; the strict rule "
        "refuses every field the restore point records, each unknown here.",
        [],
        **{k: _DROP for k in base if k != "handoff"},
    )
    gate(
        "unknown-here-nothing-recorded",
        "Only the marker, against a restore point that records nothing: nothing is unknown, "
        "so the strict rule accepts too.",
        [],
        vector="valid-no-config",
        **{k: _DROP for k in bare_doc if k != "handoff"},
    )
    names = [g.name for g in out]
    assert len(names) == len(set(names)), "gate vector names must be unique"
    return out


def gate_outcome(g: GateVector) -> list[str]:
    """Problems with what the library's gate makes of ``g`` (none if it decides as recorded)."""
    url = str(HERE / f"{g.vector}.rp")
    expect_path = HERE / g.file
    if not expect_path.exists() or not Path(url).exists():
        return []  # reported as missing already
    try:
        result = restorepoint.check(url, load_expectations(expect_path), raise_on_mismatch=False)
        strict = restorepoint.check(
            url, load_expectations(expect_path), raise_on_mismatch=False, strict=True
        )
    except errors.RestorePointError as exc:
        return [f"{g.name}: the gate raised {errors.error_class(exc)}: {exc}"]
    problems = []
    found = [m.to_dict() for m in result.mismatches]
    if found != g.mismatches:
        problems.append(f"{g.name}: mismatches {found}, expected {g.mismatches}")
    found = [m.to_dict() for m in strict.mismatches]
    if found != g.strict:
        problems.append(f"{g.name}: strict mismatches {found}, expected {g.strict}")
    if g.from_pack and handoff_document(result.manifest, f"{g.vector}.rp") != g.expect:
        problems.append(f"{g.name}: differs from the handoff that pack --handoff writes")
    if g.mismatches:
        try:
            restorepoint.check(url, load_expectations(expect_path))
            problems.append(f"{g.name}: check() did not raise IncompatibleRestorePoint")
        except errors.IncompatibleRestorePoint as exc:
            if exc.mismatches != g.mismatches:
                problems.append(f"{g.name}: the refusal lists {exc.mismatches}")
    return problems


# -- trust vectors ----------------------------------------------------------------------------

#: The fixed test keys, by name: never use them for anything but these vectors.
TEST_KEYS: dict[str, str] = {
    "signer": "signing",
    "stranger": "signing",
    "recipient": "encryption",
    "second-recipient": "encryption",
    "outsider": "encryption",
}
OTHER_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def _seed(what: str) -> bytes:
    return hashlib.sha256(f"restorepoint test vectors: {what}".encode()).digest()


def test_key(name: str) -> Ed25519PrivateKey | X25519PrivateKey:
    if TEST_KEYS[name] == "signing":
        return Ed25519PrivateKey.from_private_bytes(_seed(f"key {name}"))
    return X25519PrivateKey.from_private_bytes(_seed(f"key {name}"))


def signing_key(name: str) -> Ed25519PrivateKey:
    key = test_key(name)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def recipient(name: str) -> PublicKey:
    return PublicKey("encryption", raw_public(test_key(name)))


def key_files() -> dict[str, bytes]:
    """Every test key as keygen writes it: NAME (PKCS #8 PEM) and NAME.pub (SPKI PEM)."""
    out = {}
    for name in TEST_KEYS:
        key = test_key(name)
        out[f"{TRUST_KEYS}/{name}"] = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        out[f"{TRUST_KEYS}/{name}.pub"] = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    return out


@dataclass(frozen=True)
class TrustVector:
    """A signed or encrypted object, the trust options to read it with, and the outcome."""

    name: str
    data: bytes
    fault: str
    expected_error: str | None
    trusted: tuple[str, ...] = ()
    require_signature: bool = False
    identity: str | None = None
    position: dict[str, int] | None = None
    files: dict[str, str] | None = None

    @property
    def file(self) -> str:
        return f"{TRUST}/{self.name.removeprefix('trust-')}.rp"

    def trust(self) -> Trust:
        """The options as the library takes them, loaded from the committed key files."""
        return Trust(
            trusted=tuple(load_public(HERE / f"{TRUST_KEYS}/{k}.pub", "signing").raw
                          for k in self.trusted),
            require_signature=self.require_signature,
            identity=load_identity(HERE / f"{TRUST_KEYS}/{self.identity}")
            if self.identity is not None
            else None,
        )  # fmt: skip

    def record(self) -> dict[str, Any]:
        valid = self.expected_error is None
        out: dict[str, Any] = {
            "name": self.name,
            "kind": "trust",
            "file": self.file,
            "valid": valid,
            "expected_error": self.expected_error,
            "exit_code": 0 if valid else getattr(errors, str(self.expected_error)).exit_code,
            "trust": [f"{TRUST_KEYS}/{k}.pub" for k in self.trusted],
            "require_signature": self.require_signature,
            "identity": f"{TRUST_KEYS}/{self.identity}" if self.identity is not None else None,
            "fault": self.fault,
        }
        if valid:
            out["position"] = self.position
            out["files"] = self.files
        return out


def stream_files() -> dict[str, bytes]:
    """Three chunks (two uniform, stored as zstd RLE frames of equal length, and a short last
    one) and a one-chunk file: every stream fault fits in a few KB."""
    return {
        "stream.bin": b"\x01" * CHUNK + b"\x02" * CHUNK + pattern(1000),
        "trainer_state.json": b'{"step": 1500}',
    }


def trust_parts(
    *,
    sign: tuple[str, ...] = (),
    to: tuple[str, ...] = (),
    final: Any = None,
    **head: Any,
) -> Parts:
    parts = parts_of(stream_files(), ZSTD, **head)
    if to:
        encrypt(
            parts,
            [recipient(name) for name in to],
            file_key=_seed("file key")[:32],
            ephemerals=[
                X25519PrivateKey.from_private_bytes(_seed(f"ephemeral {i}")) for i in range(len(to))
            ],
            final=final,
        )
    parts.signers = [signing_key(name) for name in sign]
    return parts


def signature_block_of(data: bytes) -> bytes:
    index_offset, index_length, _, sig_length, _ = struct.unpack_from(
        "<QQ32sQ8s", data, len(data) - 64
    )
    start = index_offset + index_length
    return data[start : start + sig_length]


def stream_entry(parts: Parts) -> ForgedEntry:
    return next(e for e in parts.entries if e.path == "stream.bin")


def build_trust() -> list[TrustVector]:
    out: list[TrustVector] = []
    files = stream_files()
    digests = {p: sha(files[p]) for p in sorted(files, key=lambda p: p.encode())}

    def add(name: str, parts: Parts | bytes, fault: str, error: str | None, **opts: Any) -> None:
        data = parts if isinstance(parts, bytes) else assemble(parts)
        extra: dict[str, Any] = {}
        if error is None:
            extra = {"position": {"batch": 3, "epoch": 1, "step": 1500}, "files": digests}
        out.append(TrustVector(f"trust-{name}", data, fault, error, **opts, **extra))

    signed_opts: dict[str, Any] = {"trusted": ("signer",), "require_signature": True}
    add(
        "valid-signed",
        trust_parts(sign=("signer",)),
        "Signed by the test key signer (trusted, signature required).",
        None,
        **signed_opts,
    )
    add(
        "valid-encrypted",
        trust_parts(to=("recipient", "second-recipient")),
        "Encrypted to two recipients, opened by the second; unsigned.",
        None,
        identity="second-recipient",
    )
    add(
        "valid-signed-encrypted",
        trust_parts(sign=("signer",), to=("recipient",)),
        "Encrypted to recipient and signed by signer: the signature covers the sealed payload.",
        None,
        identity="recipient",
        **signed_opts,
    )

    # Signature faults.
    parts = trust_parts()
    key = signing_key("signer")

    def flipped(head_sha: str, index_sha: str) -> bytes:
        block = json.loads(signature_block(statement(parts.head["id"], head_sha, index_sha), [key]))
        sig = bytearray(base64.b64decode(block["signatures"][0]["sig"]))
        sig[10] ^= 0x01
        block["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        return canonical_dumps(block)

    parts.signer = flipped
    add(
        "bad-signature",
        parts,
        "One bit of the Ed25519 signature flipped (still canonical base64).",
        "SignatureError",
        **signed_opts,
    )
    other = assemble(trust_parts(sign=("signer",), position={"step": 1501}))
    parts = trust_parts()
    parts.signature = signature_block_of(other)
    add(
        "signature-over-other-bytes",
        parts,
        "The signature block of the same restore point at step 1501: valid, for other digests.",
        "SignatureError",
        **signed_opts,
    )
    add(
        "untrusted-key",
        trust_parts(sign=("stranger",)),
        "A valid signature by stranger, a key not in the trust list.",
        "SignatureError",
        **signed_opts,
    )
    parts = trust_parts()

    def other_type(head_sha: str, index_sha: str) -> bytes:
        body = statement(parts.head["id"], head_sha, index_sha)
        block = json.loads(signature_block(body, [key]))
        sig = key.sign(pae(OTHER_PAYLOAD_TYPE, body))
        block["signatures"][0]["sig"] = base64.b64encode(sig).decode()
        assert block["payload_type"] == PAYLOAD_TYPE
        return canonical_dumps(block)

    parts.signer = other_type
    add(
        "wrong-payload-type",
        parts,
        f"The right statement, signed as payload type {OTHER_PAYLOAD_TYPE} (its PAE).",
        "SignatureError",
        **signed_opts,
    )
    add(
        "unsigned-required",
        trust_parts(),
        "Unsigned, read with a signature required.",
        "SignatureError",
        **signed_opts,
    )

    # Decryption faults: unsigned, so that only the AEAD can catch them.
    add(
        "wrong-decryption-key",
        trust_parts(to=("recipient",)),
        "Encrypted to recipient, opened with outsider.",
        "DecryptionError",
        identity="outsider",
    )
    add(
        "no-identity",
        trust_parts(to=("recipient",)),
        "Encrypted, read without an identity.",
        "DecryptionError",
    )
    opener: dict[str, Any] = {"identity": "recipient"}
    parts = trust_parts(to=("recipient",))
    e = stream_entry(parts)
    e.stored_chunks.pop()
    e.size = 2 * CHUNK
    e.sha256 = sha(files["stream.bin"][: 2 * CHUNK])
    add(
        "truncated-stream",
        parts,
        "The last chunk of stream.bin removed, its size and sha256 made to match.",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(to=("recipient",), final=lambda entry, i, n: i == n - 1 and entry != 0)
    add(
        "missing-final-chunk",
        parts,
        "stream.bin's last chunk sealed without the last-chunk flag: no final chunk.",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(
        to=("recipient",), final=lambda entry, i, n: i == n - 1 or (entry, i) == (0, 0)
    )
    add(
        "two-final-chunks",
        parts,
        "stream.bin's first chunk sealed with the last-chunk flag too: two final chunks.",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(to=("recipient",))
    chunks = stream_entry(parts).stored_chunks
    chunks[0], chunks[1] = chunks[1], chunks[0]
    add(
        "reordered-chunk",
        parts,
        "stream.bin's first two sealed chunks swapped (same lengths: the layout holds).",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(to=("recipient",))
    chunks = stream_entry(parts).stored_chunks
    chunks[1] = chunks[0]
    add(
        "duplicated-chunk",
        parts,
        "stream.bin's first sealed chunk in place of its second as well.",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(to=("recipient",))
    chunks = stream_entry(parts).stored_chunks
    sealed = bytearray(chunks[2])
    sealed[len(sealed) // 2] ^= 0x01
    chunks[2] = bytes(sealed)
    add(
        "flipped-ciphertext",
        parts,
        "One bit of stream.bin's last sealed chunk flipped.",
        "DecryptionError",
        **opener,
    )
    other_parts = trust_parts(to=("recipient",), id=OTHER_ID)
    parts = trust_parts(to=("recipient",))
    stream_entry(parts).stored_chunks[1] = stream_entry(other_parts).stored_chunks[1]
    add(
        "chunk-from-another-restore-point",
        parts,
        "stream.bin's second chunk from a restore point with another id and the same file key.",
        "DecryptionError",
        **opener,
    )
    parts = trust_parts(to=("recipient",))
    parts.entries = [e for e in parts.entries if e.path != "trainer_state.json"]
    add(
        "dropped-entry",
        parts,
        "trainer_state.json removed from the index and the payload: one entry of two left.",
        "DecryptionError",
        **opener,
    )
    names = [t.name for t in out]
    assert len(names) == len(set(names)), "trust vector names must be unique"
    return out


def read_trusted(data: bytes, trust: Trust) -> tuple[dict[str, int], dict[str, str]]:
    """Read a trust vector as verify does: signatures and keys first, then every payload
    digest through the cipher."""
    opened = open_manifest(_Bytes(data), trust, need_key=True)
    assert opened.manifest is not None
    stream = io.BytesIO(data)
    stream.seek(opened.head.data_start)
    hashes: dict[str, Any] = {}
    decoder = PayloadDecoder(opened.manifest, stream, threads=2, cipher=opened.cipher)
    for e, chunk in decoder.events():
        h = hashes.setdefault(e.path, hashlib.sha256())
        if chunk is not None:
            h.update(chunk)
    return opened.manifest.position.to_dict(), {p: h.hexdigest() for p, h in hashes.items()}


def checked_read(name: str, expected: str | None, read: Callable[[], Any]) -> tuple[list[str], Any]:
    """Run ``read``. When its outcome is not the ``expected`` error class (None: to verify),
    the problems; when it refused as expected, no problems and None; when it verified as
    expected, no problems and what it returned."""
    try:
        got = read()
    except errors.RestorePointError as exc:
        found = errors.error_class(exc)
        if found != expected:
            return [f"{name}: expected {expected or 'to verify'}, raised {found}: {exc}"], None
        return [], None
    except Exception as exc:
        return [f"{name}: the reader crashed with {type(exc).__name__}: {exc}"], None
    if expected is not None:
        return [f"{name}: expected {expected}, but it verified"], None
    return [], got


def trust_outcome(t: TrustVector) -> list[str]:
    """Problems with what the reader, given the recorded options, makes of ``t``."""
    problems, got = checked_read(t.name, t.expected_error, lambda: read_trusted(t.data, t.trust()))
    if problems or got is None:
        return problems
    position, files = got
    if position != t.position:
        problems.append(f"{t.name}: position {position}, expected {t.position}")
    if files != t.files:
        problems.append(f"{t.name}: file digests {files}, expected {t.files}")
    return problems


# -- vector sets ------------------------------------------------------------------------------

SETS = "sets"
#: The sets' records: one per set, naming its commit.
SETS_INDEX = f"{SETS}/index.json"
#: The feature of multi-part restore points, written here as the spec gives it (section 25).
MULTIPART = "multipart/1"
#: The id of every set's commit, which its parts name (``part.commit``).
COMMIT_ID = "0123456789abcdef" * 2
#: The id of the other commit some faults take a part from, or name.
OTHER_COMMIT_ID = OTHER_ID


def store_name(head: dict[str, Any]) -> str:
    """A restore point's store name (spec section 19), ``RUN/STEP-CREATED-ID.rp``, written out
    here rather than taken from the code: STEP in 16 digits, CREATED as UTC to the millisecond
    without separators, the first 12 hex digits of the id."""
    date, _, clock = head["created"].removesuffix("Z").partition("T")
    created = date.replace("-", "") + "T" + clock.replace(":", "").replace(".", "") + "Z"
    return f"{head['run']}/{head['position']['step']:016d}-{created}-{head['id'][:12]}.rp"


def commit_parts(refs: list[dict[str, Any]], world: int = 2) -> Parts:
    """A commit (format 1.1, multipart/1, no payload) of ``world`` ranks naming ``refs``."""
    objects = sorted(refs, key=lambda r: str(r["name"]))
    parts = parts_of(
        {},
        format_version="1.1",
        required_features=[MULTIPART],
        id=COMMIT_ID,
        parts={"objects": objects, "reshardable": False, "world_size": world},
    )
    parts.minor = 1
    return parts


#: Where every set's commit lies in the set's folder, and its parts beside it (section 25.2).
COMMIT_NAME = store_name(commit_parts([]).head)
PARTS_DIR = COMMIT_NAME.removesuffix(".rp") + ".parts"


def part_name(rank: int | None) -> str:
    return "shared.rp" if rank is None else f"rank-{rank:05d}.rp"


def rank_of(name: str) -> int | None:
    return None if name == "shared.rp" else int(name.removeprefix("rank-").removesuffix(".rp"))


def part_id(rank: int | None, commit: str = COMMIT_ID) -> str:
    return sha(f"restorepoint test vectors: part {part_name(rank)} of {commit}".encode())[:32]


def rank_files(rank: int | None) -> dict[str, bytes]:
    """A part's files: each rank's model and optimizer shards, the shared trainer state."""
    if rank is None:
        return {"trainer_state.json": b'{"step": 1500}'}
    return {
        f"model.rank{rank}.pt": bytes([rank]) * 16 + pattern(600),
        f"optimizer.rank{rank}.pt": bytes([0x40 + rank]) * 300,
    }


def part_parts(
    rank: int | None,
    *,
    files: dict[str, bytes] | None = None,
    part: dict[str, Any] | None = None,
    **head: Any,
) -> Parts:
    """The part of ``rank`` (None: the shared part) of the commit COMMIT_ID of two ranks: rank
    1's files in codec zstd (the generator's frames), the others stored. ``part`` changes
    members of the head's ``part``, ``head`` other head members."""
    member = {"commit": COMMIT_ID, "rank": rank, "world_size": 2} | (part or {})
    parts = parts_of(
        rank_files(rank) if files is None else files,
        ZSTD if rank == 1 else None,
        **{
            "format_version": "1.1",
            "required_features": [MULTIPART],
            "id": part_id(rank),
            "part": member,
        }
        | head,
    )
    parts.minor = 1
    return parts


def object_digest(data: bytes) -> str:
    """The restore point digest (section 21) of an assembled object, from its bytes: its id,
    its head's sha256 and the footer's index digest."""
    (head_length,) = struct.unpack_from("<I", data, 12)
    head_sha = sha(data[16 : 16 + head_length])
    _, _, index_sha = struct.unpack_from("<QQ32s", data, len(data) - 64)
    return restore_point_digest(head_of(data)["id"], head_sha, index_sha.hex())


def ref_of(name: str, data: bytes) -> dict[str, Any]:
    """The element of a commit's ``parts.objects`` that names ``data`` as the part ``name``."""
    return {
        "digest": object_digest(data),
        "id": head_of(data)["id"],
        "name": name,
        "rank": rank_of(name),
        "size": len(data),
    }


@dataclass(frozen=True)
class SetVector:
    """A commit and its parts, laid out as a store lays them out, and the outcome of verify."""

    name: str
    #: every file of the set, by its path in the set's folder
    files: dict[str, bytes]
    fault: str
    expected_error: str | None
    position: dict[str, int] | None = None
    #: valid sets: each part as verify must report it (name, rank, digest, its files' sha256)
    parts: list[dict[str, Any]] | None = None

    @property
    def folder(self) -> str:
        return f"{SETS}/{self.name.removeprefix('set-')}"

    @property
    def commit(self) -> str:
        return f"{self.folder}/{COMMIT_NAME}"

    def record(self) -> dict[str, Any]:
        valid = self.expected_error is None
        out: dict[str, Any] = {
            "name": self.name,
            "kind": "set",
            "commit": self.commit,
            **record_outcome(self.expected_error, self.fault),
        }
        if valid:
            out["position"] = self.position
            out["parts"] = self.parts
        return out


#: Another config than the commits' (lr 0.002 for 0.001), with its own identity.
OTHER_CONFIG = {"lr": 0.002, "model": {"width": 64}, "train": {"checkpoint_every": 500}}
OTHER_IDENTITY = config_identity(OTHER_CONFIG, ["train.checkpoint_every"])


def build_sets() -> list[SetVector]:
    out: list[SetVector] = []
    good = {part_name(r): assemble(part_parts(r)) for r in (0, 1, None)}
    two = {n: good[n] for n in ("rank-00000.rp", "rank-00001.rp")}

    def add(
        name: str,
        fault: str,
        error: str | None,
        named: dict[str, bytes],
        lying: dict[str, bytes] | None = None,
        refs: list[dict[str, Any]] | None = None,
    ) -> None:
        """A set whose commit names ``refs`` (by default, each of ``named`` as itself) and whose
        parts folder holds ``lying`` (by default, ``named``)."""
        commit = assemble(commit_parts(refs or [ref_of(n, d) for n, d in named.items()]))
        lying = named if lying is None else lying
        files = {COMMIT_NAME: commit} | {f"{PARTS_DIR}/{n}": lying[n] for n in sorted(lying)}
        extra: dict[str, Any] = {}
        if error is None:
            extra["position"] = dict(head_of(commit)["position"])
            extra["parts"] = [
                {
                    "name": n,
                    "rank": rank_of(n),
                    "file": f"{SETS}/{name.removeprefix('set-')}/{PARTS_DIR}/{n}",
                    "digest": object_digest(d),
                    "files": {p: sha(v) for p, v in sorted(rank_files(rank_of(n)).items())},
                }
                for n, d in sorted(named.items())
            ]
        out.append(SetVector(name, files, fault, error, **extra))

    add(
        "set-valid-two-ranks",
        "A commit of two ranks and its two parts (rank 0's files stored, rank 1's in zstd).",
        None,
        two,
    )
    add(
        "set-valid-shared",
        "A commit of two ranks, their parts and the shared part (the trainer state).",
        None,
        good,
    )
    add(
        "set-part-missing",
        "set-valid-two-ranks without rank 1's part.",
        "IntegrityError",
        two,
        {"rank-00000.rp": two["rank-00000.rp"]},
    )
    add(
        "set-shared-missing",
        "set-valid-shared without the shared part.",
        "IntegrityError",
        good,
        {n: good[n] for n in two},
    )
    add(
        "set-part-swapped",
        "Rank 0's part (sound, of this commit) at rank 1's name as well.",
        "IntegrityError",
        two,
        {n: two["rank-00000.rp"] for n in two},
    )
    other_id = part_id(1, OTHER_COMMIT_ID)
    other = assemble(part_parts(1, part={"commit": OTHER_COMMIT_ID}, id=other_id))
    assert len(other) == len(two["rank-00001.rp"])
    add(
        "set-part-of-another-commit",
        "Rank 1's part of another commit of the same shape (its own id, same size) at rank 1's "
        "name.",
        "IntegrityError",
        two,
        {**two, "rank-00001.rp": other},
    )
    files = rank_files(1)
    model = bytearray(files["model.rank1.pt"])
    model[100] ^= 0x01
    changed = assemble(part_parts(1, files={**files, "model.rank1.pt": bytes(model)}))
    assert len(changed) == len(two["rank-00001.rp"])
    assert head_of(changed) == head_of(two["rank-00001.rp"])
    add(
        "set-part-other-bytes",
        "Rank 1's part with one byte of a file other (a sound object: same head and size, its "
        "index digests the new file): the digest the commit names differs.",
        "IntegrityError",
        two,
        {**two, "rank-00001.rp": changed},
    )
    parts = part_parts(0)
    stored = bytearray(parts.entries[0].stored_chunks[0])
    stored[100] ^= 0x01
    parts.entries[0].stored_chunks[0] = bytes(stored)
    flipped = assemble(parts)
    assert object_digest(flipped) == object_digest(two["rank-00000.rp"])
    add(
        "set-part-payload-flipped",
        "One stored byte of rank 0's part flipped: its digest and size are the ones named, only "
        "the part's own file sha256 differs.",
        "DigestMismatch",
        two,
        {**two, "rank-00000.rp": flipped},
    )
    named_faults: list[tuple[str, str, Parts]] = [
        (
            "set-part-names-another-commit",
            "Rank 1's part names another commit (part.commit), and the commit names it by digest.",
            part_parts(1, part={"commit": OTHER_COMMIT_ID}),
        ),
        (
            "set-part-rank-disagrees",
            "The part at rank 1's name says rank 0 (part.rank), and the commit names it by digest.",
            part_parts(1, part={"rank": 0}),
        ),
        (
            "set-part-world-size-disagrees",
            "Rank 1's part says a world of 3 (part.world_size), and the commit names it by digest.",
            part_parts(1, part={"world_size": 3}),
        ),
        (
            "set-part-run-differs",
            "Rank 1's part is of run other-run, and the commit names it by digest.",
            part_parts(1, run="other-run"),
        ),
        (
            "set-part-position-differs",
            "Rank 1's part is at step 1501, the commit at 1500, and the commit names it by digest.",
            part_parts(1, position={"batch": 3, "epoch": 1, "step": 1501}),
        ),
        (
            "set-part-created-differs",
            "Rank 1's part was created a second after its commit, and the commit names it by "
            "digest.",
            part_parts(1, created="2026-01-01T00:00:01.000Z"),
        ),
        (
            "set-part-trainer-differs",
            "Rank 1's part is of another trainer version than its commit (which the gate reads), "
            "and the commit names it by digest.",
            part_parts(1, trainer={"name": "fake-trainer", "version": "9.9.9"}),
        ),
        (
            "set-part-config-differs",
            "Rank 1's part has another config (lr 0.002) than its commit (which the gate reads), "
            "and the commit names it by digest.",
            part_parts(1, config=OTHER_CONFIG, config_identity=OTHER_IDENTITY),
        ),
        (
            "set-part-has-the-commit-id",
            "Rank 1's part has its commit's own id, and the commit names it so, by digest.",
            part_parts(1, id=COMMIT_ID),
        ),
    ]
    for name, fault, part in named_faults:
        add(name, fault, "IntegrityError", {**two, "rank-00001.rp": assemble(part)})
    files = rank_files(1)
    overlap = assemble(
        part_parts(1, files={**files, "optimizer.rank0.pt": files["optimizer.rank1.pt"]})
    )
    add(
        "set-parts-overlap",
        "Rank 1's part also holds a file at a path rank 0's part holds (optimizer.rank0.pt), and "
        "the commit names it by digest: the parts' files overlap.",
        "UnsafePath",
        {**two, "rank-00001.rp": overlap},
    )
    refs = [ref_of(n, d) for n, d in two.items()]
    refs[1]["size"] += 1
    add(
        "set-part-size-differs",
        "The commit names rank 1's part with a size one byte over its own (digest and id right).",
        "IntegrityError",
        two,
        refs=refs,
    )
    refs = [ref_of(n, d) for n, d in two.items()]
    refs[1]["id"] = OTHER_COMMIT_ID
    add(
        "set-part-id-differs",
        "The commit names rank 1's part with another id (digest and size right).",
        "IntegrityError",
        two,
        refs=refs,
    )
    names = [s.name for s in out]
    assert len(names) == len(set(names)), "set names must be unique"
    return out


def set_files(sets: list[SetVector]) -> dict[str, bytes]:
    """Every file of the sets, by its path relative to this directory."""
    out = {f"{s.folder}/{p}": data for s in sets for p, data in s.files.items()}
    out[SETS_INDEX] = index_bytes(sets)
    return out


def set_outcome(s: SetVector) -> list[str]:
    """Problems with what verify (the library's, which reads each part the commit names)
    makes of the set's commit, as committed."""
    problems, report = checked_read(
        s.name, s.expected_error, lambda: restorepoint.verify(str(HERE / s.commit))
    )
    if problems or report is None:
        return problems
    position = report.manifest.position.to_dict()
    if position != s.position:
        problems.append(f"{s.name}: position {position}, expected {s.position}")
    parts = [
        {
            "name": p.url.rsplit("/", 1)[-1],
            "rank": p.manifest.part.rank if p.manifest.part else "no part member",
            "file": f"{s.folder}/{PARTS_DIR}/{p.url.rsplit('/', 1)[-1]}",
            "digest": p.digest,
            "files": {e.path: e.sha256 for e in p.manifest.payload or ()},
        }
        for p in report.parts
    ]
    if parts != s.parts:
        problems.append(f"{s.name}: parts {parts}, expected {s.parts}")
    return problems


# -- writing and checking ---------------------------------------------------------------------


def index_bytes(
    records: list[Vector] | list[GateVector] | list[TrustVector] | list[SetVector],
) -> bytes:
    text = json.dumps([x.record() for x in records], indent=2, ensure_ascii=False)
    return (text + "\n").encode()


def write(vectors: list[Vector], gates: list[GateVector]) -> None:
    names = {f"{x.name}.rp" for x in vectors}
    for stale in HERE.glob("*.rp"):
        if stale.name not in names:
            stale.unlink()
    for x in vectors:
        (HERE / f"{x.name}.rp").write_bytes(x.data)
    (HERE / INDEX).write_bytes(index_bytes(vectors))
    (HERE / GATE).mkdir(exist_ok=True)
    gate_files = {g.file for g in gates} | {GATE_INDEX}
    for stale in (HERE / GATE).glob("*.json"):
        if f"{GATE}/{stale.name}" not in gate_files:
            stale.unlink()
    for g in gates:
        (HERE / g.file).write_bytes(g.data)
    (HERE / GATE_INDEX).write_bytes(index_bytes(gates))


def trust_files(trusts: list[TrustVector]) -> dict[str, bytes]:
    """Every file of the trust family, by its path relative to this directory."""
    out = {t.file: t.data for t in trusts}
    out.update(key_files())
    out[TRUST_INDEX] = index_bytes(trusts)
    return out


def write_trust(trusts: list[TrustVector]) -> None:
    wanted = trust_files(trusts)
    (HERE / TRUST_KEYS).mkdir(parents=True, exist_ok=True)
    for stale in (HERE / TRUST).rglob("*"):
        if stale.is_file() and str(stale.relative_to(HERE)) not in wanted:
            stale.unlink()
    for name, data in wanted.items():
        (HERE / name).write_bytes(data)


def write_snapshots(snaps: list[snapshots.SnapshotVector]) -> None:
    wanted = snapshots.files(snaps)
    (HERE / snapshots.SNAPSHOTS).mkdir(exist_ok=True)
    for stale in (HERE / snapshots.SNAPSHOTS).glob("*"):
        if stale.is_file() and stale.relative_to(HERE).as_posix() not in wanted:
            stale.unlink()
    for name, data in wanted.items():
        (HERE / name).write_bytes(data)


def check_snapshots(snaps: list[snapshots.SnapshotVector]) -> tuple[list[str], int]:
    """Problems with the committed snapshot vectors (bytes, stale or missing files, what the
    snapshot reader makes of each), and how many bytes they take."""
    problems, total = check_tree(snapshots.SNAPSHOTS, snapshots.files(snaps))
    if not problems:
        for v in snaps:
            problems += snapshots.outcome(v, checked_read)
    return problems, total


def chain_files() -> tuple[dict[str, bytes], list[chains.ChainVector]]:
    """Every file of ``chains/`` by its path relative to this directory, and the vectors."""
    files, vectors = chains.build(zstd_frame)
    files[chains.CHAINS_INDEX] = chains.index_bytes(vectors, record_outcome)
    return files, vectors


def write_chains() -> None:
    wanted, _ = chain_files()
    (HERE / chains.CHAINS).mkdir(exist_ok=True)
    for stale in (HERE / chains.CHAINS).rglob("*"):
        if stale.is_file() and stale.relative_to(HERE).as_posix() not in wanted:
            stale.unlink()
    for name, data in wanted.items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_bytes(data)


def check_chains() -> tuple[list[str], int]:
    """Problems with the committed chains (bytes, stale or missing files, what verify makes
    of each vector's object), and how many bytes they take."""
    wanted, vectors = chain_files()
    problems, total = check_tree(chains.CHAINS, wanted)
    if not problems:
        for v in vectors:
            problems += chains.check_outcome(
                HERE,
                v,
                lambda url, v=v: checked_read(
                    v.name, v.expected_error, lambda: restorepoint.verify(url)
                ),
            )
    return problems, total


def write_sets(sets: list[SetVector]) -> None:
    wanted = set_files(sets)
    (HERE / SETS).mkdir(exist_ok=True)
    for stale in (HERE / SETS).rglob("*"):
        if stale.is_file() and stale.relative_to(HERE).as_posix() not in wanted:
            stale.unlink()
    for folder in sorted((HERE / SETS).rglob("*"), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # the folder of a set, a run or a parts prefix no longer made
    for name, data in wanted.items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_bytes(data)


def check_tree(folder: str, wanted: dict[str, bytes]) -> tuple[list[str], int]:
    """Problems with the committed files under ``folder`` against ``wanted`` (path relative
    to this directory: bytes): stale, missing, other bytes, over the size limit; and how many
    bytes the wanted files take."""
    problems = []
    for path in sorted((HERE / folder).rglob("*")):
        name = path.relative_to(HERE).as_posix()
        if path.is_file() and name not in wanted:
            problems.append(f"{name}: not made by the generator (stale)")
    total = 0
    for name, data in wanted.items():
        path = HERE / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != data:
            problems.append(f"{name}: differs from what the generator writes")
        total += len(data)
        if len(data) >= MAX_VECTOR_BYTES:
            problems.append(f"{name}: {len(data)} bytes, the limit is {MAX_VECTOR_BYTES}")
    return problems, total


def check_sets(sets: list[SetVector]) -> tuple[list[str], int]:
    """Problems with the committed sets (bytes, stale or missing files, what verify makes of
    each commit), and how many bytes they take."""
    problems, total = check_tree(SETS, set_files(sets))
    if not problems:  # a set read from other bytes would say nothing of these
        for s in sets:
            problems += set_outcome(s)
    return problems, total


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self._data = data

    @property
    def size(self) -> int:
        return len(self._data)

    def read_range(self, start: int, end: int) -> bytes:
        return self._data[start:end]


def read(data: bytes) -> tuple[dict[str, int], dict[str, str]]:
    """Read a vector as a verifier does: manifest, then every payload digest."""
    head, manifest = read_manifest(_Bytes(data))
    stream = io.BytesIO(data)
    stream.seek(head.data_start)
    hashes: dict[str, Any] = {}
    for e, chunk in PayloadDecoder(manifest, stream, threads=2).events():
        h = hashes.setdefault(e.path, hashlib.sha256())
        if chunk is not None:
            h.update(chunk)
    return manifest.position.to_dict(), {p: h.hexdigest() for p, h in hashes.items()}


def attempt(x: Vector) -> tuple[Any, BaseException | None, int]:
    """Read ``x``: (position and digests, or None; the exception, or None; peak bytes traced).
    Bombs are read under tracemalloc, which sees every buffer a codec hands back."""
    if x.bomb:
        tracemalloc.start()
    try:
        try:
            result, error = read(x.data), None
        except Exception as exc:
            result, error = None, exc
        peak = tracemalloc.get_traced_memory()[1] if x.bomb else 0
    finally:
        if x.bomb:
            tracemalloc.stop()
    return result, error, peak


def outcome(x: Vector) -> list[str]:
    """Problems with what the reader makes of ``x`` (none if it behaves as recorded)."""
    result, error, peak = attempt(x)
    if error is not None and not isinstance(error, errors.RestorePointError):
        # A crash is a reader bug worth one line, not a traceback.
        return [f"{x.name}: reader crashed with {type(error).__name__}: {error}"]
    if peak > BOMB_PEAK_BYTES:
        return [f"{x.name}: the reader allocated {peak} bytes on a bomb"]
    if error is not None:
        found = errors.error_class(error)
        if x.expected_error is None:
            return [f"{x.name}: expected to verify, raised {found}: {error}"]
        if found != x.expected_error:
            return [f"{x.name}: expected {x.expected_error}, raised {found}: {error}"]
        return []
    if x.expected_error is not None:
        return [f"{x.name}: expected {x.expected_error}, but it verified"]
    position, files = result
    problems = []
    if position != x.position:
        problems.append(f"{x.name}: position {position}, expected {x.position}")
    if files != x.files:
        problems.append(f"{x.name}: file digests {files}, expected {x.files}")
    return problems


def check(
    vectors: list[Vector],
    gates: list[GateVector],
    trusts: list[TrustVector],
    sets: list[SetVector],
    snaps: list[snapshots.SnapshotVector],
) -> list[str]:
    problems = []
    wanted = {f"{x.name}.rp": x for x in vectors}
    index_path = HERE / INDEX
    if not index_path.exists():
        problems.append(f"{INDEX}: missing")
    elif index_path.read_bytes() != index_bytes(vectors):
        problems.append(f"{INDEX}: differs from what the generator writes")
    gate_index = HERE / GATE_INDEX
    if not gate_index.exists():
        problems.append(f"{GATE_INDEX}: missing")
    elif gate_index.read_bytes() != index_bytes(gates):
        problems.append(f"{GATE_INDEX}: differs from what the generator writes")
    for path in sorted(HERE.glob("*.rp")):
        if path.name not in wanted:
            problems.append(f"{path.name}: not made by the generator (stale)")
    total = 0
    for name, x in wanted.items():
        path = HERE / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != x.data:
            problems.append(f"{name}: differs from what the generator writes")
        total += len(x.data)
        if len(x.data) >= MAX_VECTOR_BYTES:
            problems.append(f"{name}: {len(x.data)} bytes, the limit is {MAX_VECTOR_BYTES}")
        problems += outcome(x)
    gate_files = {g.file: g for g in gates}
    for path in sorted((HERE / GATE).glob("*")):
        if f"{GATE}/{path.name}" not in gate_files and f"{GATE}/{path.name}" != GATE_INDEX:
            problems.append(f"{GATE}/{path.name}: not made by the generator (stale)")
    for name, g in gate_files.items():
        path = HERE / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != g.data:
            problems.append(f"{name}: differs from what the generator writes")
        total += len(g.data)
        problems += gate_outcome(g)
    trust_problems, trust_total = check_tree(TRUST, trust_files(trusts))
    problems += trust_problems
    total += trust_total
    if not any(p.startswith(TRUST_KEYS) for p in problems):
        for t in trusts:
            problems += trust_outcome(t)
    set_problems, set_total = check_sets(sets)
    problems += set_problems
    total += set_total
    snapshot_problems, snapshot_total = check_snapshots(snaps)
    problems += snapshot_problems
    total += snapshot_total
    chain_problems, chain_total = check_chains()
    problems += chain_problems
    total += chain_total
    if total >= MAX_TOTAL_BYTES:
        problems.append(f"all vectors: {total} bytes, the limit is {MAX_TOTAL_BYTES}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files and run the reader"
    )
    args = parser.parse_args(argv)
    vectors = build()
    gates = build_gate(vectors)
    trusts = build_trust()
    sets = build_sets()
    snaps = snapshots.build()
    names = [x.name for x in vectors] + [x.name for x in gates]
    names += [x.name for x in trusts] + [x.name for x in sets] + [x.name for x in snaps]
    assert len(names) == len(set(names)), "names must be unique among all vectors"
    if not args.check:
        write(vectors, gates)
        write_trust(trusts)
        write_sets(sets)
        write_snapshots(snaps)
        write_chains()
        print(
            f"wrote {len(vectors)} vectors, {len(gates)} gate vectors, {len(trusts)} trust "
            f"vectors, {len(sets)} vector sets, {len(snaps)} snapshot vectors, {INDEX}, "
            f"{GATE_INDEX}, {TRUST_INDEX}, {SETS_INDEX} and {snapshots.SNAPSHOTS_INDEX}"
        )
        return 0
    problems = check(vectors, gates, trusts, sets, snaps)
    for line in problems:
        print(line)
    if problems:
        return 1
    print(
        f"{len(vectors)} vectors, {len(gates)} gate vectors, {len(trusts)} trust vectors, "
        f"{len(sets)} vector sets and {len(snaps)} snapshot vectors: committed bytes match, "
        f"the reader agrees with {INDEX}, {TRUST_INDEX}, {SETS_INDEX} and "
        f"{snapshots.SNAPSHOTS_INDEX}, the gate with {GATE_INDEX}"
    )
    print(f"{len(chain_files()[1])} chain vectors: the reader agrees with {chains.CHAINS_INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
