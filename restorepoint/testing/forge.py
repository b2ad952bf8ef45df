"""Forge restore points byte by byte, for tests, golden vectors and fuzzing.

The real writer cannot produce a broken object; a test of a reader needs objects with exactly
one fault. ``Parts`` holds every piece of an object as data that a test may change; ``assemble``
lays them out and, unless told otherwise, recomputes everything that depends on what changed
(digests, offsets, lengths), so the one fault a test plants is the only one.

    parts = Parts.sample()                       # a small valid restore point
    parts.head["position"]["step"] = -1          # one fault: schema
    data = assemble(parts)                       # digests recomputed: only the fault remains

Signed and encrypted objects are forged the same way: ``parts.signers`` sign the statement of
the object as laid out (``parts.signer`` or ``parts.signature`` plant any other block), and
``encrypt(parts, recipients)`` seals every stored chunk as pack does, so that a test can then
reorder, drop or splice sealed chunks and leave only the AEAD to notice.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..format import canonical_dumps
from ..format.codecs import codec_from_dict
from ..format.identity import config_identity
from ..format.layout import (
    CHUNK_HEADER,
    END_MAGIC,
    FOOTER,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FORMAT_VERSION,
    MAGIC,
    PREAMBLE,
)
from ..format.manifest import ENCRYPTION_FEATURE
from ..trust import PublicKey, StreamCipher, recipients_for, signature_block, statement

__all__ = [
    "HOSTILE_PATHS",
    "HOSTILE_STRINGS",
    "HOSTILE_VALUES",
    "ForgedEntry",
    "Parts",
    "assemble",
    "encrypt",
    "sample_head",
    "zstd_bomb",
]

#: Strings an attacker puts wherever the spec allows any string (terms, names, the cache root,
#: unknown members): terminal control sequences, bidi overrides, separators, NUL, the longest
#: and the least normalised. Sound restore points may hold every one; printing them must not
#: act on the terminal.
HOSTILE_STRINGS: tuple[str, ...] = (
    "\x1b]0;pwned\x07",
    "\x1b[2J\x1b[H",
    "line\rover",
    "new\nline",
    "\x9b31m",
    "\u202eevil",
    "\u2028\u2029",
    "\x00",
    "\x7f",
    "e\u0301",
    "\ufeff",
    "\U0001f600",
    "%s%n%x",
    "../../etc/passwd",
    "x" * 5000,
    "",
)

#: Payload paths around every rule of spec section 9: the forbidden ones (traversal, absolute,
#: drives, backslashes, empty and dot components, controls, lengths, depth) and the allowed
#: ones that look dangerous (C1 controls, names Windows reserves, a fullwidth solidus).
HOSTILE_PATHS: tuple[str, ...] = (
    "../escape",
    "a/../../b",
    "/etc/passwd",
    "C:x",
    "a\\b",
    "a//b",
    "a/",
    "./a",
    "a/./b",
    "",
    "a\x00b",
    "a\x1bb",
    "del\x7f",
    "c1\x9b2J",
    "\u202eevil.pt",
    "CON",
    "trailing.",
    "a\uff0fb",
    "x" * 256,
    "/".join(["d" * 100] * 41),
    "/".join(["d"] * 129),
    "/".join(["d"] * 128),
    "Model.pt",
    "model.pt",
    "e\u0301",
    "\u00e9",
    "a",
    "a/b",
    "\ud800",
)

#: JSON values of every type and of the edges of each range, for members whose type or range
#: a reader must check.
HOSTILE_VALUES: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    2**53 - 1,
    float(2**53),  # the double that 2**53 is; an integer that large has no canonical form
    1.5,
    -0.0,
    1e300,
    "",
    "1",
    [],
    [1, "a"],
    {},
    {"name": "x"},
)

FIXED_ID = "0123456789abcdef0123456789abcdef"
FIXED_CREATED = "2026-01-01T00:00:00.000Z"


def sample_head(**overrides: Any) -> dict[str, Any]:
    """A valid head document with fixed id and time (deterministic bytes)."""
    config = {"lr": 0.001, "model": {"width": 64}, "train": {"checkpoint_every": 500}}
    operational = ["train.checkpoint_every"]
    head: dict[str, Any] = {
        "cache_keys": {"dataset": "sha256:" + "ab" * 32},
        "cache_root": "/cache",
        "chunk_size": 65536,
        "config": config,
        "config_identity": config_identity(config, operational),
        "created": FIXED_CREATED,
        "encryption": None,
        "format_version": FORMAT_VERSION,
        "id": FIXED_ID,
        "operational_keys": operational,
        "position": {"batch": 3, "epoch": 1, "step": 1500},
        "producer": {"name": "restorepoint", "version": "0.0.0-vectors"},
        "required_features": [],
        "run": "vectors-run",
        "terms": {"cuda": "12.4", "torch": "2.13.0"},
        "trainer": {"name": "fake-trainer", "version": "1.0.0"},
    }
    head.update(overrides)
    return head


@dataclass
class ForgedEntry:
    """One payload file: its index fields and its stored chunk frames (stored bytes each)."""

    path: str
    size: int
    sha256: str
    codec: dict[str, Any]
    stored_chunks: list[bytes]
    #: frame headers as written; None means "the length of each stored chunk"
    stored_lengths: list[int] | None = None
    #: extra index fields, or fields to replace (``offset``/``stored_size`` override layout)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_bytes(
        cls, path: str, data: bytes, *, codec: dict[str, Any] | None = None, chunk_size: int = 65536
    ) -> ForgedEntry:
        codec = codec or {"name": "none"}
        impl = codec_from_dict(codec)
        chunks = [impl.encode(data[i : i + chunk_size]) for i in range(0, len(data), chunk_size)]
        return cls(path, len(data), hashlib.sha256(data).hexdigest(), codec, chunks)

    def frames(self) -> bytes:
        lengths = self.stored_lengths or [len(c) for c in self.stored_chunks]
        return b"".join(
            CHUNK_HEADER.pack(n) + chunk
            for n, chunk in zip(lengths, self.stored_chunks, strict=True)
        )


@dataclass
class Parts:
    """Every piece of a restore point. ``None`` in an override means: compute it."""

    head: dict[str, Any]
    entries: list[ForgedEntry]
    magic: bytes = MAGIC
    major: int = FORMAT_MAJOR
    minor: int = FORMAT_MINOR
    head_bytes: bytes | None = None  # raw head instead of canonical(head)
    head_length: int | None = None  # declared length instead of len(head bytes)
    head_digest: bytes | None = None
    index_extra: dict[str, Any] = field(default_factory=dict)  # fields added to the index
    index_bytes: bytes | None = None
    index_digest: bytes | None = None
    index_offset: int | None = None
    index_length: int | None = None
    #: the footer's fourth field (reserved before signatures); None: the signature block's length
    signature_length: int | None = None
    end_magic: bytes = END_MAGIC
    trailing: bytes = b""
    #: the signature block, exactly these bytes (b"" for none); None: made as below
    signature: bytes | None = None
    #: makes the block from the object's (head sha256, index sha256), as the writer's signer
    signer: Callable[[str, str], bytes] | None = None
    #: without ``signature`` and ``signer``: these keys sign the statement of the object
    signers: list[Ed25519PrivateKey] = field(default_factory=list)

    @classmethod
    def sample(
        cls,
        files: dict[str, bytes] | None = None,
        codec: dict[str, Any] | None = None,
        **head_overrides: Any,
    ) -> Parts:
        head = sample_head(**head_overrides)
        if files is None:
            files = {
                "model.pt": bytes(range(256)) * 300,  # two chunks at 64 KiB
                "optimizer.pt": b"\x00" * 1000,
                "trainer_state.json": b'{"step": 1500}',
            }
        entries = [
            ForgedEntry.from_bytes(p, files[p], codec=codec, chunk_size=head["chunk_size"])
            for p in sorted(files, key=lambda p: p.encode())
        ]
        return cls(head=head, entries=entries)

    @property
    def reserved(self) -> int | None:
        """The footer's fourth field under its format-1.0-draft name (now signature_length)."""
        return self.signature_length

    @reserved.setter
    def reserved(self, value: int | None) -> None:
        self.signature_length = value

    def copy(self) -> Parts:
        return copy.deepcopy(self)

    def index_document(self, head_sha256: str, data_start: int) -> dict[str, Any]:
        payload = []
        offset = data_start
        for e in self.entries:
            stored = len(e.frames())
            item = {
                "codec": e.codec,
                "offset": offset,
                "path": e.path,
                "sha256": e.sha256,
                "size": e.size,
                "stored_size": stored,
            }
            item.update(e.extra)
            payload.append(item)
            offset += stored
        doc = {"head_sha256": head_sha256, "id": self.head.get("id"), "payload": payload}
        doc.update(self.index_extra)
        return doc


def assemble(parts: Parts) -> bytes:
    """The object's bytes, with everything not overridden computed from the parts."""
    head = parts.head_bytes if parts.head_bytes is not None else canonical_dumps(parts.head)
    head_length = parts.head_length if parts.head_length is not None else len(head)
    real_digest = hashlib.sha256(head).digest()
    digest = parts.head_digest if parts.head_digest is not None else real_digest
    out = bytearray(PREAMBLE.pack(parts.magic, parts.major, parts.minor, head_length))
    out += head
    out += digest
    data_start = len(out)
    for e in parts.entries:
        out += e.frames()
    index_offset_real = len(out)
    if parts.index_bytes is not None:
        index = parts.index_bytes
    else:
        index = canonical_dumps(parts.index_document(real_digest.hex(), data_start))
    out += index
    index_digest = (
        parts.index_digest if parts.index_digest is not None else hashlib.sha256(index).digest()
    )
    # Signed over what a reader computes: the head bytes' and the index bytes' real digests.
    real_index_digest = hashlib.sha256(index).hexdigest()
    if parts.signature is not None:
        block = parts.signature
    elif parts.signer is not None:
        block = parts.signer(real_digest.hex(), real_index_digest)
    elif parts.signers:
        body = statement(str(parts.head.get("id")), real_digest.hex(), real_index_digest)
        block = signature_block(body, parts.signers)
    else:
        block = b""
    out += block
    out += FOOTER.pack(
        parts.index_offset if parts.index_offset is not None else index_offset_real,
        parts.index_length if parts.index_length is not None else len(index),
        index_digest,
        parts.signature_length if parts.signature_length is not None else len(block),
        parts.end_magic,
    )
    out += parts.trailing
    return bytes(out)


def encrypt(
    parts: Parts,
    recipients: Sequence[PublicKey],
    *,
    file_key: bytes | None = None,
    ephemerals: Sequence[X25519PrivateKey] | None = None,
    final: Callable[[int, int, int], bool] | None = None,
) -> StreamCipher:
    """Encrypt the payload of ``parts`` in place, as pack does: the head gets its
    ``encryption`` object and the required feature, and every stored chunk of every entry is
    sealed for its path, size, position, the entry count, its index and the last-chunk flag.
    ``final(entry, index, count)`` gives that flag (by default: the entry's last chunk), which
    lets a test seal a stream with no final chunk or with two. ``file_key`` and ``ephemerals``
    make the bytes deterministic. Returns the cipher, to seal more chunks with.

    Sealing happens now: an entry removed, reordered or resized afterwards keeps chunks sealed
    for where it was, which is exactly what a stream attack looks like."""
    key, encryption = recipients_for(recipients, file_key=file_key, ephemerals=ephemerals)
    parts.head["encryption"] = encryption
    features = set(parts.head.get("required_features") or [])
    parts.head["required_features"] = sorted(features | {ENCRYPTION_FEATURE})
    cipher = StreamCipher(key, str(parts.head.get("id")))
    count = len(parts.entries)
    for position, e in enumerate(parts.entries):
        n = len(e.stored_chunks)
        e.stored_chunks = [
            cipher.seal(
                e.path,
                e.size,
                position,
                count,
                i,
                final(position, i, n) if final is not None else i == n - 1,
                chunk,
            )
            for i, chunk in enumerate(e.stored_chunks)
        ]
    return cipher


def zstd_bomb(declared: int, expands_to: int) -> bytes:
    """One zstd frame that declares ``declared`` content bytes and decodes to ``expands_to``
    zeros (a few bytes of stored data either way): what a bounded decoder must refuse."""
    import zstandard

    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes(expands_to))
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == expands_to
    header = 4 + 1 + (0 if frame[4] & 0x20 else 1)  # magic, descriptor, window byte
    width = {0: 1 if frame[4] & 0x20 else 0, 1: 2, 2: 4, 3: 8}[frame[4] >> 6]
    if width == 0:
        return frame  # no content size field to lie in
    value = declared - 256 if width == 2 else declared  # a 2-byte field holds size - 256
    if not 0 <= value < 1 << (8 * width):
        raise ValueError(f"a frame of {expands_to} bytes cannot declare {declared}")
    return frame[:header] + value.to_bytes(width, "little") + frame[header + width :]
