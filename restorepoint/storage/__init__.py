"""Storage: a URL becomes a Location that can be read in ranges and published to atomically.
Knows nothing of the restore-point format.

One module per backend: ``_local`` (POSIX files), ``_fsspec`` (any fsspec URL), ``_s3`` and
``_gcs`` (what is theirs alone); ``_base`` holds the protocols and values they share,
``_resolve`` picks the backend for a URL, ``_names`` makes and parses temporary names,
``_errors`` translates every library's errors into restorepoint's, and ``_retry`` is the one
retry policy (tries, backoff, timeouts, the deadline) of the object-store backends."""

from __future__ import annotations

from ._base import Abilities, Location, ObjectInfo, ObjectReader, PendingUpload, Publisher
from ._errors import translate, translating
from ._fsspec import FsspecLocation
from ._gcs import GCSLocation
from ._local import LocalLocation
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
from ._resolve import resolve
from ._retry import (
    RetryPolicy,
    deadline_left,
    policy,
    set_store_deadline,
    store_deadline,
    watch_store_deadline,
)
from ._s3 import S3Location

__all__ = [
    "OLD_MARK",
    "PARTIAL_MARK",
    "STAGING_MARK",
    "Abilities",
    "FsspecLocation",
    "GCSLocation",
    "LocalLocation",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "PendingUpload",
    "Publisher",
    "RetryPolicy",
    "S3Location",
    "TempName",
    "deadline_left",
    "is_partial_name",
    "leftover_name",
    "parse_leftover",
    "parse_partial",
    "partial_name",
    "policy",
    "resolve",
    "set_store_deadline",
    "store_deadline",
    "this_host",
    "translate",
    "translating",
    "watch_store_deadline",
]
