"""The manifest's multi-part members (spec section "Multi-part restore points"): a commit's
``parts`` (every part it names, by rank) and a part's ``part`` (the commit it belongs to)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import MalformedManifest
from ._checks import _int, _obj, _str

__all__ = [
    "MAX_WORLD_SIZE",
    "MULTIPART_FEATURE",
    "MULTIPART_VERSION",
    "PartOf",
    "PartRef",
    "Parts",
    "multipart_members",
]

#: The required feature of multi-part restore points: a commit naming its parts, and the parts
#: (spec section "Multi-part restore points").
MULTIPART_FEATURE = "multipart/1"
#: The format version a writer writes for a commit or a part (1.0 for every other object).
MULTIPART_VERSION = "1.1"
#: The most ranks one multi-part restore point may have.
MAX_WORLD_SIZE = 65536
_PART_NAME = re.compile(r"^(?:rank-([0-9]{5})|shared)\.rp\Z")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class PartRef:
    """One part a commit names: its file name beside the commit, the rank whose state it holds
    (None: the part every rank shares), its head id, its restore point digest (which pins its
    head, its index and so every payload file's sha256) and its size in bytes."""

    name: str
    rank: int | None
    id: str
    digest: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "id": self.id,
            "name": self.name,
            "rank": self.rank,
            "size": self.size,
        }

    @staticmethod
    def name_for(rank: int | None) -> str:
        return "shared.rp" if rank is None else f"rank-{rank:05d}.rp"


@dataclass(frozen=True)
class Parts:
    """A commit's ``parts`` member: the world size, whether the state may be resumed on another
    world size (``reshardable``), and every part, one per rank and at most one shared."""

    world_size: int
    reshardable: bool
    objects: tuple[PartRef, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "objects": [p.to_dict() for p in self.objects],
            "reshardable": self.reshardable,
            "world_size": self.world_size,
        }

    def for_rank(self, rank: int | None) -> tuple[PartRef, ...]:
        """The parts rank ``rank`` imports (the shared one, then its own); None: every part."""
        if rank is None:
            return self.objects
        return tuple(p for p in self.objects if p.rank is None or p.rank == rank)

    @classmethod
    def from_dict(cls, value: Any) -> Parts:
        obj = _obj(value, "parts")
        world = _int(obj.get("world_size"), "parts.world_size")
        if not 1 <= world <= MAX_WORLD_SIZE:
            raise MalformedManifest(f"parts.world_size must be from 1 to {MAX_WORLD_SIZE}")
        reshardable = obj.get("reshardable")
        if not isinstance(reshardable, bool):
            raise MalformedManifest("parts.reshardable must be true or false")
        raw = obj.get("objects")
        if not isinstance(raw, list) or not 1 <= len(raw) <= world + 1:
            raise MalformedManifest("parts.objects must be an array of one part per rank")
        refs = []
        for i, item in enumerate(raw):
            e = _obj(item, f"parts.objects[{i}]")
            name = _str(e.get("name"), f"parts.objects[{i}].name")
            rank = e.get("rank")
            if rank is not None:
                rank = _int(rank, f"parts.objects[{i}].rank")
            if name != PartRef.name_for(rank) or not _PART_NAME.fullmatch(name):
                raise MalformedManifest(
                    f"parts.objects[{i}]: a part of rank {rank} is named "
                    f"{PartRef.name_for(rank) if rank is None or rank < world else 'nothing'}"
                )
            rp_id = _str(e.get("id"), f"parts.objects[{i}].id")
            digest = _str(e.get("digest"), f"parts.objects[{i}].digest")
            if not _ID.fullmatch(rp_id) or not _HEX64.fullmatch(digest):
                raise MalformedManifest(f"parts.objects[{i}]: id or digest is not lowercase hex")
            refs.append(PartRef(name, rank, rp_id, digest, _int(e.get("size"), "size")))
        names = [r.name for r in refs]
        if names != sorted(set(names)):
            raise MalformedManifest("parts.objects must be sorted by name, without repeats")
        if sorted(r.rank for r in refs if r.rank is not None) != list(range(world)):
            raise MalformedManifest("parts.objects must hold exactly one part for every rank")
        if len({r.id for r in refs}) != len(refs):
            raise MalformedManifest("parts.objects: two parts have the same id")
        return cls(world, reshardable, tuple(refs))


@dataclass(frozen=True)
class PartOf:
    """A part's ``part`` member: the id of the commit that names it, its rank (None: shared)
    and the world size. A part is never a restore point on its own."""

    commit: str
    rank: int | None
    world_size: int

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "rank": self.rank, "world_size": self.world_size}

    @classmethod
    def from_dict(cls, value: Any) -> PartOf:
        obj = _obj(value, "part")
        commit = _str(obj.get("commit"), "part.commit")
        if not _ID.fullmatch(commit):
            raise MalformedManifest("part.commit must be 32 lowercase hex digits")
        world = _int(obj.get("world_size"), "part.world_size")
        rank = obj.get("rank")
        if rank is not None:
            rank = _int(rank, "part.rank")
        if not 1 <= world <= MAX_WORLD_SIZE or (rank is not None and rank >= world):
            raise MalformedManifest("part.rank must be below part.world_size")
        return cls(commit, rank, world)


def multipart_members(
    obj: dict[str, Any], features: list[str], version: str
) -> tuple[Parts | None, PartOf | None]:
    """``parts`` (a commit) or ``part`` (a part): exactly one, only with multipart/1, and only
    in a head of the minor version that brought it (1.1) or a later one."""
    has_parts, has_part = "parts" in obj, "part" in obj
    minor = tuple(int(n) for n in version.split("."))
    if MULTIPART_FEATURE in features and minor < (1, 1):
        raise MalformedManifest(
            f"{MULTIPART_FEATURE!r} needs format_version {MULTIPART_VERSION} or later, "
            f"not {version}"
        )
    if MULTIPART_FEATURE not in features:
        if has_parts or has_part:
            raise MalformedManifest(
                f"parts and part go with the required feature {MULTIPART_FEATURE!r}"
            )
        return None, None
    if has_parts == has_part:
        raise MalformedManifest(f"{MULTIPART_FEATURE!r} needs exactly one of parts and part")
    if has_parts:
        return Parts.from_dict(obj["parts"]), None
    return None, PartOf.from_dict(obj["part"])
