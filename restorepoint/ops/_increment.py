"""Publishing incremental restore points (spec section 28.4, W4c): what the newest restore
point of the run in the store lets a new one reference, from its head and index only (bounded:
no payload byte is read), and the writer's policy for when to publish a full one instead."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import NotFound, RestorePointError, SourceError
from ..format import (
    Codec,
    Manifest,
    restore_point_digest,
)
from ..format.delta import DELTA_FEATURE, Base, chunk_lengths, pack_cuts
from ..format.limits import MAX_DELTA_BASES
from ..format.writer import DeltaPlan
from ..storage import Location
from ._open import open_manifest
from ._source import SourceFile
from .store import list_store

__all__ = ["FULL_EVERY", "MIN_REUSE", "Planned", "enough_reuse", "plan_from", "plan_increment"]

#: A full restore point at least every FULL_EVERY publishes: a restore point names at most
#: FULL_EVERY - 1 bases (its base and that one's bases), so a reader opens that many objects.
FULL_EVERY = 8
#: A full restore point when the new one would reuse less than this fraction of its plain
#: bytes: the state changes too much for references (and their verification) to pay.
MIN_REUSE = 0.25

assert FULL_EVERY <= MAX_DELTA_BASES


@dataclass(frozen=True)
class Planned:
    """What a publish may reference (None: it publishes a full one), and why."""

    plan: DeltaPlan | None
    reason: str


def plan_increment(store: Location, run: str, chunk_size: int, codec: Codec) -> Planned:
    """The frames of the run's newest restore point that a new one may reference, flattened
    (a frame the newest one references is named where it lies, in that one's base). A full
    restore point when there is none, when it is not sound up to its index, has no chunk
    digests (not ``delta/1``), another chunk size, or already FULL_EVERY - 1 bases. Its
    payload is never read here: the publish verifies what it referenced (section 28.4)."""
    try:
        entries = list_store(store, run=run)
    except NotFound:
        entries = []
    if not entries:
        return Planned(None, "no earlier restore point of the run")
    newest = entries[0]
    where = store.join(newest.name)
    reader = where.reader()
    try:
        opened = open_manifest(reader, need_key=False)
    except RestorePointError:
        return Planned(None, f"the newest restore point {newest.name} cannot be read")
    finally:
        reader.close()
    manifest, tail = opened.manifest, opened.tail
    assert manifest is not None
    assert tail is not None
    if manifest.run != run or DELTA_FEATURE not in manifest.required_features:
        return Planned(None, f"the newest restore point {newest.name} names no chunks")
    if manifest.chunk_size != chunk_size:
        return Planned(None, f"the newest restore point {newest.name} has another chunk size")
    bases = manifest.bases or ()
    if len(bases) + 1 >= FULL_EVERY:
        return Planned(None, f"a full restore point every {FULL_EVERY}")
    digest = restore_point_digest(manifest.id, opened.head.head_sha256, tail.index_sha256)
    return Planned(plan_from(newest.name, digest, manifest, codec), f"based on {newest.name}")


def plan_from(name: str, digest: str, manifest: Manifest, codec: Codec) -> DeltaPlan:
    """What a new restore point may reference of ``manifest`` (the restore point named
    ``name``, of restore point digest ``digest``): every chunk of an entry of the same codec,
    where its frame lies, flattened."""
    plan_bases = (Base(name, digest), *(manifest.bases or ()))
    frames: dict[str, tuple[int, int, int]] = {}
    wanted = codec.to_dict()
    for entry in manifest.payload or ():
        delta = entry.delta
        # Frames decode with the referencing entry's codec (R9a): only the same codec's.
        if delta is None or entry.codec.to_dict() != wanted:
            continue
        referenced = delta.referenced()
        at = entry.offset
        for i in range(delta.count):
            length = delta.frame_length(i)
            sha = delta.chunk_sha256(i)
            if i in referenced:
                ref, pos = referenced[i]
                frames.setdefault(sha, (ref.base + 1, pos, length))
            else:
                frames.setdefault(sha, (0, at, length))
                at += 4 + length
    return DeltaPlan(plan_bases, frames)


def enough_reuse(
    files: Sequence[SourceFile],
    chunk_size: int,
    cuts: Sequence[list[int] | None],
    plan: DeltaPlan,
) -> bool:
    """Whether a restore point of ``files`` (chunked at ``cuts``) would reuse at least
    MIN_REUSE of its plain bytes from ``plan`` (W4c): each chunk hashed before any frame is
    written, one chunk in memory at a time; it stops as soon as the answer is known."""
    total = sum(f.size for f in files)
    want = MIN_REUSE * total
    reused = 0
    left = total
    for item, item_cuts in zip(files, cuts, strict=True):
        lengths = chunk_lengths(item.size, chunk_size, pack_cuts(item_cuts) if item_cuts else None)
        try:
            stream: BinaryIO = (
                item.opener() if item.opener is not None else open(item.location, "rb")  # noqa: SIM115
            )
            with stream:
                for length in lengths:
                    if reused >= want or reused + left < want:
                        return reused >= want
                    chunk = stream.read(length)
                    if len(chunk) != length:
                        raise SourceError("file shrank while it was packed", url=item.location)
                    if hashlib.sha256(chunk).hexdigest() in plan.frames:
                        reused += length
                    left -= length
        except OSError as exc:
            raise SourceError(f"cannot read ({exc.strerror})", url=item.location) from None
    return reused >= want
