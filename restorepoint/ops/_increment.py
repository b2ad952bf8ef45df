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
    PartOf,
    PartRef,
    read_head,
    restore_point_digest,
)
from ..format.delta import DELTA_FEATURE, Base, chunk_lengths, pack_cuts
from ..format.limits import MAX_DELTA_BASES
from ..format.writer import DeltaPlan
from ..storage import Location
from ._multipart import parts_prefix
from ._open import open_manifest
from ._source import SourceFile
from .store import list_store

__all__ = [
    "FULL_EVERY",
    "MIN_REUSE",
    "Planned",
    "enough_reuse",
    "plan_from",
    "plan_increment",
    "plan_part",
]

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
    return _plan_on(store, newest.name, run, chunk_size, codec)


def plan_part(part: Location, head: Manifest, codec: Codec) -> Planned:
    """W4c for a part (spec section 28.7): what the part at ``part`` (of head ``head``, not yet
    named by a commit) may reference of the part of the same rank (or the shared part) of the
    run's newest commit, read through that commit's head (which must name it) and its own head
    and index. A full part when the newest restore point is no commit or has no such part (a
    first commit, another world size), and for the reasons of ``plan_increment``."""
    assert head.part is not None
    assert head.run is not None
    run_prefix = part.up().up()  # STORE/RUN/STEM.parts/NAME -> STORE/RUN
    store = run_prefix.up()
    own = PartRef.name_for(head.part.rank)
    try:
        entries = list_store(store, run=head.run)
    except NotFound:
        entries = []
    if not entries:
        return Planned(None, "no earlier restore point of the run")
    newest = entries[0]
    reader = store.join(newest.name).reader()
    try:
        commit = read_head(reader).manifest
    except RestorePointError:
        return Planned(None, f"the newest restore point {newest.name} cannot be read")
    finally:
        reader.close()
    ref = next((r for r in (commit.parts.objects if commit.parts else ()) if r.name == own), None)
    if ref is None or commit.id == head.part.commit:
        return Planned(None, f"the newest restore point {newest.name} has no part {own}")
    name = f"{parts_prefix(newest.name)}/{own}"
    return _plan_on(store, name, head.run, head.chunk_size, codec, part=(head.part, ref.digest))


def _plan_on(  # noqa: PLR0913, PLR0911 - the base, what the new object must match; a reason each
    store: Location,
    name: str,
    run: str,
    chunk_size: int,
    codec: Codec,
    *,
    part: tuple[PartOf, str] | None = None,
) -> Planned:
    """What a new object may reference of the object ``name`` of ``store`` (its head and
    index only): a part (``part``: the new one's ``part`` member and the digest its commit
    names) of the same rank whose digest is the one named, or a restore point that is none."""
    where = store.join(name)
    reader = where.reader()
    try:
        opened = open_manifest(reader, need_key=False)
    except RestorePointError:
        return Planned(None, f"the newest restore point {name} cannot be read")
    finally:
        reader.close()
    manifest, tail = opened.manifest, opened.tail
    assert manifest is not None
    assert tail is not None
    if manifest.run != run or DELTA_FEATURE not in manifest.required_features:
        return Planned(None, f"the newest restore point {name} names no chunks")
    if manifest.chunk_size != chunk_size:
        return Planned(None, f"the newest restore point {name} has another chunk size")
    bases = manifest.bases or ()
    if len(bases) + 1 >= FULL_EVERY:
        return Planned(None, f"a full restore point every {FULL_EVERY}")
    digest = restore_point_digest(manifest.id, opened.head.head_sha256, tail.index_sha256)
    if part is not None:
        new, named = part
        found = manifest.part
        if found is None or found.rank != new.rank or digest != named:
            return Planned(None, f"{name} is not the part its commit names")
    elif manifest.part is not None or manifest.parts is not None:
        return Planned(None, f"the newest restore point {name} names no chunks")
    return Planned(plan_from(name, digest, manifest, codec), f"based on {name}")


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
