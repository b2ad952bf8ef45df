"""restorepoint: versioned, verified restore points for ML training.

A trainer's checkpoint becomes one self-describing object (identity, position, a sha256 for
every payload file), published atomically to any fsspec URL, verified end to end, and imported
elsewhere only when it is compatible. See docs/api.md.
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    AlreadyExists,
    ConfigError,
    DecodeError,
    DestinationError,
    DigestMismatch,
    FramingError,
    IncompatibleRestorePoint,
    IntegrityError,
    LimitExceeded,
    MalformedManifest,
    MissingExtra,
    NotARestorePoint,
    NotFound,
    PermissionDenied,
    RestorePointError,
    SourceError,
    StorageError,
    StorageUnavailable,
    TrailingBytes,
    TruncatedRestorePoint,
    UnsafePath,
    UnsupportedFormat,
    UsageError,
)
from .format import Entry, Manifest, Position, Producer, Trainer, config_identity
from .ops import PackResult, VerifyReport, load_config, pack, read_manifest, verify

__all__ = [
    "AlreadyExists",
    "ConfigError",
    "DecodeError",
    "DestinationError",
    "DigestMismatch",
    "Entry",
    "FramingError",
    "IncompatibleRestorePoint",
    "IntegrityError",
    "LimitExceeded",
    "MalformedManifest",
    "Manifest",
    "MissingExtra",
    "NotARestorePoint",
    "NotFound",
    "PackResult",
    "PermissionDenied",
    "Position",
    "Producer",
    "RestorePointError",
    "SourceError",
    "StorageError",
    "StorageUnavailable",
    "TrailingBytes",
    "Trainer",
    "TruncatedRestorePoint",
    "UnsafePath",
    "UnsupportedFormat",
    "UsageError",
    "VerifyReport",
    "__version__",
    "config_identity",
    "load_config",
    "pack",
    "read_manifest",
    "verify",
]
