"""Reading through references (spec section 28.3, R9a): the bases an incremental restore point
names, opened by the caller (who knows the store), and its referenced frames read from them in
bounded ranged reads, each checked on its own. ``check_references`` makes the checks that read
no frame, for the publish's check after the commit (28.4)."""

from __future__ import annotations

from typing import Protocol

from ..errors import FramingError, IntegrityError, TruncatedRestorePoint
from .delta import Base, Ref
from .layout import CHUNK_HEADER
from .manifest import Entry, Manifest

__all__ = ["BASE_READ_SPAN", "BaseFrames", "BaseRegion", "Bases", "check_references"]


class BaseRegion(Protocol):
    """A base of an incremental restore point, opened and checked by the caller (section 28,
    R9a: its restore point digest is the one named, it is of the same run and not the object
    itself): where its data region lies, and its byte ranges."""

    @property
    def data_start(self) -> int: ...

    @property
    def index_offset(self) -> int: ...

    def read_range(self, start: int, end: int) -> bytes: ...


class Bases(Protocol):
    """Opens the bases an incremental restore point names (the caller knows the store)."""

    def open(self, base: Base) -> BaseRegion: ...


BASE_READ_SPAN = 8 << 20
"""The most bytes of a run of referenced frames one ranged read of a base asks for."""


class BaseFrames:
    """The referenced frames of an incremental restore point, each base opened once. A run's
    consecutive frames are read with few ranged reads of its base (one request each on an
    object store): each read spans at most ``BASE_READ_SPAN`` bytes of the run (or one frame,
    if longer), so memory stays bounded; every frame is still checked on its own."""

    def __init__(self, manifest: Manifest, bases: Bases | None) -> None:
        self.manifest = manifest
        self.bases = bases
        self._open: dict[int, BaseRegion] = {}
        # The last span read: (base number, its first byte, its bytes).
        self._span: tuple[int, int, bytes] | None = None

    def region(self, entry: Entry, ref: Ref) -> tuple[BaseRegion, Base]:
        assert self.manifest.bases is not None
        base = self.manifest.bases[ref.base]
        region = self._open.get(ref.base)
        if region is None:
            if self.bases is None:
                raise IntegrityError(
                    f"chunks are in base {base.name}, which only a store can resolve",
                    member=entry.path,
                )
            region = self.bases.open(base)
            self._open[ref.base] = region
        if ref.offset < region.data_start or ref.offset + ref.length > region.index_offset:
            raise FramingError(
                f"a reference to bytes {ref.offset}..{ref.offset + ref.length} of base "
                f"{base.name} lies outside its data region "
                f"({region.data_start}..{region.index_offset})",
                member=entry.path,
            )
        return region, base

    def frame(self, entry: Entry, ref: Ref, index: int, at: int) -> bytes:
        """Chunk ``index``'s frame, which starts at byte ``at`` of the base ``ref`` names."""
        assert entry.delta is not None
        region, base = self.region(entry, ref)
        length = entry.delta.frame_length(index)
        end = at + CHUNK_HEADER.size + length
        span = self._span
        if (
            span is None
            or span[0] != ref.base
            or not span[1] <= at <= end <= span[1] + len(span[2])
        ):
            # This frame and the run's next whole ones, up to BASE_READ_SPAN bytes: the run
            # lies inside the base's data region (checked above).
            stop = end
            for i in range(index + 1, ref.first + ref.count):
                after = stop + CHUNK_HEADER.size + entry.delta.frame_length(i)
                if after - at > BASE_READ_SPAN:
                    break
                stop = after
            self._span = span = (ref.base, at, region.read_range(at, stop))
        data = span[2][at - span[1] : end - span[1]]
        if len(data) != CHUNK_HEADER.size + length:
            raise TruncatedRestorePoint(
                f"base {base.name} ends inside a referenced frame", member=entry.path
            )
        (found,) = CHUNK_HEADER.unpack_from(data)
        if found != length:
            raise FramingError(
                f"the frame at byte {at} of base {base.name} is {found} bytes, "
                f"the reference says {length}",
                member=entry.path,
            )
        return data[CHUNK_HEADER.size :]


def check_references(manifest: Manifest, bases: Bases) -> None:
    """R9a's checks that read no frame, for every run of every entry: its base opened by
    ``bases`` (which checks it is the one named) and the run's range inside that base's data
    region. Each frame is still checked when it is read (``BaseFrames.frame``)."""
    frames = BaseFrames(manifest, bases)
    for entry in manifest.payload or ():
        for ref in entry.delta.refs if entry.delta is not None else ():
            frames.region(entry, ref)
