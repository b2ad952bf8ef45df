"""Storage: a URL becomes a Location that can be read in ranges and published to atomically.
Knows nothing of the restore-point format."""

from __future__ import annotations

from ._errors import translate, translating
from ._location import (
    PARTIAL_MARK,
    Abilities,
    FsspecLocation,
    LocalLocation,
    Location,
    ObjectInfo,
    ObjectReader,
    PendingUpload,
    Publisher,
    is_partial_name,
    resolve,
)

__all__ = [
    "PARTIAL_MARK",
    "Abilities",
    "FsspecLocation",
    "LocalLocation",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "PendingUpload",
    "Publisher",
    "is_partial_name",
    "resolve",
    "translate",
    "translating",
]
