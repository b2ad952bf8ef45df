"""restorepoint: versioned, verified restore points for ML training.

A trainer's checkpoint becomes one self-describing object (identity, position, a sha256 for
every payload file), published atomically to any fsspec URL, verified end to end, and imported
elsewhere only when it is compatible. See docs/api.md.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ._lazy import load as _load
from ._lazy import names as _names
from ._version import __version__
from .errors import (
    AlreadyExists,
    ConfigError,
    DecodeError,
    DecryptionError,
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
    SignatureError,
    SourceError,
    StorageError,
    StorageUnavailable,
    TrailingBytes,
    TruncatedRestorePoint,
    UnsafeCheckpoint,
    UnsafePath,
    UnsupportedFormat,
    UsageError,
)

if TYPE_CHECKING:
    from .format import Entry, Manifest, Position, Producer, Trainer, config_identity
    from .ops import (
        CheckResult,
        Expectations,
        ImportResult,
        Mismatch,
        PackResult,
        PruneReport,
        StoreEntry,
        VerifyReport,
        check,
        handoff_document,
        import_restore_point,
        latest,
        list_store,
        load_config,
        load_expectations,
        pack,
        prune,
        read_manifest,
        verify,
        write_handoff,
    )
    from .trust import Trust

# torch's CPU wheel warns once, from C++, when it is imported without numpy ("Failed to
# initialize NumPy"): nothing a restorepoint user can act on (restorepoint needs no numpy, and
# the runtime saves numpy's RNG only where numpy is installed). The demo and the runtime, which
# import torch after restorepoint, keep it off the terminal; no other warning is touched.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

#: Where each public name lives: imported on first use, so that ``import restorepoint`` (and
#: the CLI's start) costs no more than the errors and the version.
_LAZY: dict[str, str] = {
    "Entry": "format",
    "Manifest": "format",
    "Position": "format",
    "Producer": "format",
    "Trainer": "format",
    "config_identity": "format",
    "CheckResult": "ops",
    "Expectations": "ops",
    "ImportResult": "ops",
    "Mismatch": "ops",
    "PackResult": "ops",
    "PruneReport": "ops",
    "StoreEntry": "ops",
    "VerifyReport": "ops",
    "check": "ops",
    "handoff_document": "ops",
    "import_restore_point": "ops",
    "latest": "ops",
    "list_store": "ops",
    "load_config": "ops",
    "load_expectations": "ops",
    "pack": "ops",
    "prune": "ops",
    "read_manifest": "ops",
    "verify": "ops",
    "write_handoff": "ops",
    "Trust": "trust",
}

__all__ = [
    "AlreadyExists",
    "CheckResult",
    "ConfigError",
    "DecodeError",
    "DecryptionError",
    "DestinationError",
    "DigestMismatch",
    "Entry",
    "Expectations",
    "FramingError",
    "ImportResult",
    "IncompatibleRestorePoint",
    "IntegrityError",
    "LimitExceeded",
    "MalformedManifest",
    "Manifest",
    "Mismatch",
    "MissingExtra",
    "NotARestorePoint",
    "NotFound",
    "PackResult",
    "PermissionDenied",
    "Position",
    "Producer",
    "PruneReport",
    "RestorePointError",
    "SignatureError",
    "SourceError",
    "StorageError",
    "StorageUnavailable",
    "StoreEntry",
    "TrailingBytes",
    "Trainer",
    "TruncatedRestorePoint",
    "Trust",
    "UnsafeCheckpoint",
    "UnsafePath",
    "UnsupportedFormat",
    "UsageError",
    "VerifyReport",
    "__version__",
    "check",
    "config_identity",
    "handoff_document",
    "import_restore_point",
    "latest",
    "list_store",
    "load_config",
    "load_expectations",
    "pack",
    "prune",
    "read_manifest",
    "verify",
    "write_handoff",
]


def __getattr__(name: str) -> Any:
    return _load(name, _LAZY, globals())


def __dir__() -> list[str]:
    return _names(globals())
