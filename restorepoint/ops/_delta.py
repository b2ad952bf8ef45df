"""Reading incremental restore points (spec section 28): opening the bases an object names,
beside it in its run's prefix of the store, each checked to be the one named before any of its
bytes is used. Used by verify, import, materialize and prune; publishing is ``ops._increment``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, NotFound, RestorePointError
from ..format import (
    DELTA_FEATURE,
    Manifest,
    parse_head,
    parse_index,
    read_index,
    read_prefix,
    read_tail,
    restore_point_digest,
)
from ..format.delta import Base, base_holder
from ..format.references import check_references
from ..storage import Location
from ._multipart import part_location

if TYPE_CHECKING:
    from .store import StoreEntry

__all__ = ["StoreBases", "bases_for", "bases_of", "check_bases", "keep_bases"]


@dataclass
class _Region:
    """A base opened: where its data region lies, and its byte ranges."""

    reader: Any
    data_start: int
    index_offset: int

    def read_range(self, start: int, end: int) -> bytes:
        data: bytes = self.reader.read_range(start, end)
        return data


class StoreBases:
    """The bases of ``manifest`` (read at ``location``), opened on first use, closed by
    ``close``. A base is read beside the object (``RUN/STEM.rp`` in the same run's prefix; R8
    checked its run), and refused, with one line naming it, when it is missing, is not a sound
    restore point up to its index, has another restore point digest than the one named, is of
    another run, or is the object itself."""

    def __init__(self, location: Location, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest
        self._readers: list[Any] = []

    def open(self, base: Base) -> _Region:
        stem = base.name.split("/", 1)[1]
        # A part's base is a part of an earlier commit (RUN/STEM.parts/NAME, spec 28.7): in
        # the run's prefix, beside this part's commit's parts prefix.
        part = self.manifest.part
        where = (self.location.up() if part is not None else self.location).beside(stem)
        try:
            reader = where.reader()
        except NotFound:
            raise IntegrityError(f"base {base.name} is missing", url=where.url) from None
        self._readers.append(reader)
        try:
            prefix = read_prefix(reader)
            head = parse_head(prefix)
            tail = read_tail(reader, prefix.data_start)
            read_index(reader, tail)
        except NotFound:
            raise IntegrityError(f"base {base.name} is missing", url=where.url) from None
        except RestorePointError as exc:
            raise IntegrityError(
                f"base {base.name} is not a sound restore point: {exc.message}", url=where.url
            ) from None
        found = restore_point_digest(head.manifest.id, prefix.head_sha256, tail.index_sha256)
        if head.manifest.id == self.manifest.id:
            raise IntegrityError(f"base {base.name} is the restore point itself", url=where.url)
        if found != base.digest:
            raise IntegrityError(
                f"base {base.name} has changed (its restore point digest differs)",
                url=where.url,
                expected=base.digest,
                found=found,
            )
        if head.manifest.run != self.manifest.run:
            raise IntegrityError(f"base {base.name} is of another run", url=where.url)
        if part is not None:
            # A part's base is a part of the same rank of another commit of the run (28.7).
            other = head.manifest.part
            if other is None or other.rank != part.rank:
                raise IntegrityError(f"base {base.name} is not a part of this rank", url=where.url)
            if other.commit == part.commit:
                raise IntegrityError(f"base {base.name} is a part of this commit", url=where.url)
        elif head.manifest.part is not None:
            raise IntegrityError(f"base {base.name} is a part", url=where.url)
        return _Region(reader, prefix.data_start, tail.index_offset)

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        self._readers.clear()


def bases_for(location: Location, manifest: Manifest) -> StoreBases | None:
    """The bases of ``manifest`` when it names any."""
    return StoreBases(location, manifest) if manifest.bases else None


def check_bases(location: Location, manifest: Manifest) -> None:
    """Every base ``manifest`` (the restore point at ``location``) names, opened as R9a opens it
    (``StoreBases.open``: beside the object, sound up to its index, the restore point digest
    named, the same run, not the object itself), and every referenced range inside its base's
    data region; no payload byte is read (spec section 28.4, after the commit). Raises
    ``IntegrityError`` naming the base."""
    bases = StoreBases(location, manifest)
    try:
        check_references(manifest, bases)
    finally:
        bases.close()


def keep_bases(
    location: Location, entries: list[StoreEntry], reasons: dict[str, list[str]]
) -> None:
    """Every base of a kept restore point is kept too, and theirs in turn (spec section 28.5):
    a prune never breaks a chain. The bases come from the kept ones' heads and indexes (bounded
    reads, no payload), a commit's from its parts' (a part's base is a part of an earlier
    commit, which is kept with its parts, 28.7); one that cannot be read names none (it does
    not verify either)."""
    listed = {e.name: e for e in entries}
    todo = [e for e in entries if reasons[e.name]]
    seen = {e.name for e in todo}
    while todo:
        entry = todo.pop()
        for name in sorted({base_holder(b) for b in bases_of(location.join(entry.name))}):
            base = listed.get(name)
            if base is None:
                continue  # already gone: fsck reports the dangling reference
            reasons[name].append(f"base of {entry.name}")
            if name not in seen:
                seen.add(name)
                todo.append(base)


def bases_of(location: Location, *, commit: bool = True) -> list[str]:
    """The names of the bases the restore point at ``location`` references: its own, or a
    commit's parts' (``RUN/STEM.parts/NAME``, each part's head and index read: bounded, one
    part at a time; a "part" that is a commit names none). None when it is not incremental or
    cannot be read up to its index (a missing part: verify reports it)."""
    try:
        reader = location.reader()
    except NotFound:
        return []
    try:
        prefix = read_prefix(reader)
        head = parse_head(prefix)
        parts = head.manifest.parts if commit else None
        if parts is None and DELTA_FEATURE not in head.manifest.required_features:
            return []
        if parts is None:
            tail = read_tail(reader, prefix.data_start)
            manifest = parse_index(head, tail, read_index(reader, tail))
    except (IntegrityError, NotFound):
        return []
    finally:
        reader.close()
    if parts is not None:
        names: list[str] = []
        for ref in parts.objects:
            found = bases_of(part_location(location, ref), commit=False)
            names += [n for n in found if n not in names]
        return names
    return [b.name for b in manifest.bases or ()]
