"""Incremental restore points (spec section 28, required feature ``delta/1``): the index members
that name each chunk, and the references that let a chunk's stored frame lie in an earlier
restore point of the same run (a **base**) instead of in this object's own data region.

Each entry of a ``delta/1`` object carries, beside the members of section 5:

- ``chunks``: the sha256 of every chunk's plain bytes, 64 lowercase hex digits each, packed;
- ``frames``: every chunk's stored length (the frame header's value), 8 lowercase hex digits
  each, packed, wherever the frame lies: a later writer computes each chunk's byte range in
  this object from it without reading a frame;
- ``cuts`` (optional): where chunks 1..n-1 start in the plain file, 14 lowercase hex digits
  each, packed; absent, the chunks are the fixed ``chunk_size`` pieces of section 3;
- ``refs``: runs ``[first, count, base, base_offset, base_length]``: chunks
  ``first..first+count-1`` are the ``count`` consecutive frames at bytes
  ``[base_offset, base_offset + base_length)`` of base ``base`` of the index's ``bases``.

References are flattened: they always point at frames that lie physically in the base, so a
reader never follows a base's own references, and no chain or cycle is ever walked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LimitExceeded, MalformedManifest
from .limits import MAX_DELTA_BASES, MAX_SAFE_INTEGER

if TYPE_CHECKING:
    from .manifest import Manifest

__all__ = [
    "DELTA_FEATURE",
    "DELTA_VERSION",
    "Base",
    "Chunks",
    "Ref",
    "base_holder",
    "bases_from_list",
    "chunk_lengths",
    "chunks_from_entry",
    "reused_bytes",
]

DELTA_FEATURE = "delta/1"
#: The format version a writer writes for a ``delta/1`` object.
DELTA_VERSION = "1.2"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX = re.compile(r"^[0-9a-f]*\Z")
#: ``RUN/STEP-CREATED-ID.rp``: a store name (section 19.1), the only thing a base may be.
_BASE_NAME = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})/[0-9]{16}-[0-9]{8}T[0-9]{9}Z-[0-9a-f]{12}\.rp\Z"
)
#: ``RUN/STEM.parts/NAME``: the part ``NAME`` of a commit of the run (section 25.2), the only
#: thing a part's base may be; NAME is checked against the part's own name.
_PART_BASE_NAME = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})/[0-9]{16}-[0-9]{8}T[0-9]{9}Z-[0-9a-f]{12}\.parts/"
    r"(rank-[0-9]{5}\.rp|shared\.rp)\Z"
)
#: What a commit's parts prefix ends in (section 25.2).
_PARTS_INFIX = ".parts/"
SHA_DIGITS = 64
FRAME_DIGITS = 8
CUT_DIGITS = 14


@dataclass(frozen=True)
class Base:
    """A base: its store name (``RUN/STEM.rp``, relative to the store) and restore point
    digest (section 21), which pins its head and its index, so every frame length it records."""

    name: str
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "name": self.name}

    @property
    def run(self) -> str:
        return self.name.split("/", 1)[0]


def base_holder(name: str) -> str:
    """The store name of the restore point that holds the base named ``name``: the base
    itself, or, for a part's base ``RUN/STEM.parts/NAME`` (section 28.7), its commit
    ``RUN/STEM.rp``."""
    if _PARTS_INFIX in name:
        return name.split(_PARTS_INFIX, 1)[0] + ".rp"
    return name


@dataclass(frozen=True)
class Ref:
    """Chunks ``first..first+count-1`` are the frames at ``[offset, offset+length)`` of base
    number ``base``."""

    first: int
    count: int
    base: int
    offset: int
    length: int

    def to_list(self) -> list[int]:
        return [self.first, self.count, self.base, self.offset, self.length]


@dataclass(frozen=True)
class Chunks:
    """An entry's ``delta/1`` members."""

    sha256: str
    frames: str
    cuts: str | None = None
    refs: tuple[Ref, ...] = ()

    @property
    def count(self) -> int:
        return len(self.sha256) // SHA_DIGITS

    def chunk_sha256(self, i: int) -> str:
        return self.sha256[SHA_DIGITS * i : SHA_DIGITS * (i + 1)]

    def frame_length(self, i: int) -> int:
        return int(self.frames[FRAME_DIGITS * i : FRAME_DIGITS * (i + 1)], 16)

    def referenced(self) -> dict[int, tuple[Ref, int]]:
        """Each referenced chunk's run, and where its frame starts in the base."""
        out: dict[int, tuple[Ref, int]] = {}
        for ref in self.refs:
            at = ref.offset
            for i in range(ref.first, ref.first + ref.count):
                out[i] = (ref, at)
                at += 4 + self.frame_length(i)
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "chunks": self.sha256,
            "frames": self.frames,
            "refs": [r.to_list() for r in self.refs],
        }
        if self.cuts is not None:
            out["cuts"] = self.cuts
        return out


def pack_cuts(cuts: Sequence[int]) -> str:
    return "".join(f"{c:014x}" for c in cuts)


def chunk_lengths(size: int, chunk_size: int, cuts: str | None = None) -> list[int]:
    """The plain length of every chunk of a file of ``size`` bytes: the fixed pieces of
    ``chunk_size`` (section 3), or those ``cuts`` (checked at R8) makes."""
    if cuts is None:
        n = -(-size // chunk_size)
        return [min(chunk_size, size - i * chunk_size) for i in range(n)]
    starts = [0, *(int(cuts[i : i + CUT_DIGITS], 16) for i in range(0, len(cuts), CUT_DIGITS))]
    return [b - a for a, b in zip(starts, [*starts[1:], size], strict=True)]


def iter_fixed(size: int, chunk_size: int) -> Iterator[int]:
    left = size
    while left > 0:
        yield min(chunk_size, left)
        left -= chunk_size


def chunks_from_entry(  # noqa: PLR0912 - one check per member, in the order of R8
    e: dict[str, Any], where: str, size: int, chunk_size: int
) -> Chunks:
    """An entry's ``delta/1`` members, each checked on its own (R8): the layout checks that
    need the codec and the bases are the reader's (``reader._check_delta_layout``)."""
    sha = e.get("chunks")
    frames = e.get("frames")
    cuts = e.get("cuts")
    if not isinstance(sha, str) or not isinstance(frames, str) or not _HEX.fullmatch(sha):
        raise MalformedManifest(f"{where}: chunks and frames must be lowercase hex strings")
    if not _HEX.fullmatch(frames) or (cuts is not None and not isinstance(cuts, str)):
        raise MalformedManifest(f"{where}: frames and cuts must be lowercase hex strings")
    if cuts is not None:
        if not _HEX.fullmatch(cuts) or len(cuts) % CUT_DIGITS:
            raise MalformedManifest(f"{where}: cuts must be 14 hex digits per cut")
        previous = 0
        for i in range(0, len(cuts), CUT_DIGITS):
            cut = int(cuts[i : i + CUT_DIGITS], 16)
            if not previous < cut < size or cut - previous > chunk_size:
                raise MalformedManifest(
                    f"{where}: cuts must increase inside the file, at most chunk_size apart"
                )
            previous = cut
        if size - previous > chunk_size or size == 0:
            raise MalformedManifest(f"{where}: the last chunk is longer than chunk_size")
        n = len(cuts) // CUT_DIGITS + 1
    else:
        n = -(-size // chunk_size)
    if len(sha) != SHA_DIGITS * n or len(frames) != FRAME_DIGITS * n:
        raise MalformedManifest(
            f"{where}: chunks and frames must name each of the entry's {n} chunks"
        )
    raw = e.get("refs")
    if not isinstance(raw, list) or len(raw) > n:
        raise MalformedManifest(f"{where}: refs must be an array of at most one run per chunk")
    refs = []
    end = 0
    for j, item in enumerate(raw):
        if (
            not isinstance(item, list)
            or len(item) != 5
            or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SAFE_INTEGER
                for v in item
            )
        ):
            raise MalformedManifest(f"{where}.refs[{j}] must be five integers")
        ref = Ref(*item)
        if ref.count < 1 or ref.first < end or ref.first + ref.count > n:
            raise MalformedManifest(
                f"{where}.refs[{j}]: runs must be sorted, apart and inside the entry's chunks"
            )
        end = ref.first + ref.count
        refs.append(ref)
    return Chunks(sha, frames, cuts, tuple(refs))


def _base_name(name: str, i: int, part: str | None) -> re.Match[str]:
    """``bases[i].name`` parsed: a store name, or for a part (``part``: its name) a part of
    the same name of a commit (section 28.7)."""
    if part is None:
        match = _BASE_NAME.fullmatch(name)
        if match is None:
            raise MalformedManifest(f"bases[{i}].name must be a store name RUN/STEP-CREATED-ID.rp")
        return match
    match = _PART_BASE_NAME.fullmatch(name)
    if match is None:
        raise MalformedManifest(f"bases[{i}].name must be a part RUN/STEP-CREATED-ID.parts/{part}")
    if match.group(2) != part:
        raise MalformedManifest(f"bases[{i}] is a part of another rank, not {part}")
    return match


def bases_from_list(raw: Any, run: str | None, part: str | None = None) -> tuple[Base, ...]:
    """The index's ``bases`` (R8): store names of this run, digests, no repeats, at most
    MAX_DELTA_BASES. A part's (``part``: its name, ``rank-RRRRR.rp`` or ``shared.rp``) are
    parts of the same name of this run's commits (section 28.7), an object's restore points."""
    if not isinstance(raw, list):
        raise MalformedManifest("index.bases must be an array")
    if len(raw) > MAX_DELTA_BASES:
        raise LimitExceeded(f"{len(raw)} bases; the limit is {MAX_DELTA_BASES}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise MalformedManifest(f"bases[{i}] must be an object")
        name, digest = item.get("name"), item.get("digest")
        if not isinstance(name, str) or not isinstance(digest, str):
            raise MalformedManifest(f"bases[{i}]: name and digest must be strings")
        match = _base_name(name, i, part)
        if match.group(1) != run:
            raise MalformedManifest(f"bases[{i}] is a restore point of another run")
        if not _HEX64.fullmatch(digest):
            raise MalformedManifest(f"bases[{i}].digest must be 64 lowercase hex digits")
        out.append(Base(name, digest))
    if len({b.name for b in out}) != len(out) or len({b.digest for b in out}) != len(out):
        raise MalformedManifest("index.bases names a base twice")
    return tuple(out)


def reused_bytes(manifest: Manifest) -> int:
    """Plain bytes of ``manifest``'s chunks that lie in its bases."""
    total = 0
    for entry in manifest.payload or ():
        if entry.delta is None or not entry.delta.refs:
            continue
        lengths = chunk_lengths(entry.size, manifest.chunk_size, entry.delta.cuts)
        for ref in entry.delta.refs:
            total += sum(lengths[ref.first : ref.first + ref.count])
    return total
