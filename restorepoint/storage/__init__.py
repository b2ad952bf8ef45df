"""Storage: a URL becomes a Location that can be read in ranges and published to atomically.
Knows nothing of the restore-point format."""

from __future__ import annotations

from ._errors import translate, translating
from ._location import (
    Abilities,
    FsspecLocation,
    LocalLocation,
    Location,
    ObjectInfo,
    ObjectReader,
    PendingUpload,
    Publisher,
    resolve,
)
from ._names import (
    OLD_MARK,
    PARTIAL_MARK,
    STAGING_MARK,
    TempName,
    is_partial_name,
    leftover_name,
    parse_leftover,
    parse_partial,
    partial_name,
    this_host,
)

__all__ = [
    "OLD_MARK",
    "PARTIAL_MARK",
    "STAGING_MARK",
    "Abilities",
    "FsspecLocation",
    "LocalLocation",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "PendingUpload",
    "Publisher",
    "TempName",
    "is_partial_name",
    "leftover_name",
    "parse_leftover",
    "parse_partial",
    "partial_name",
    "resolve",
    "this_host",
    "translate",
    "translating",
]
