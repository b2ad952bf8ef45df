"""The one exception tree of restorepoint.

Every error the library raises on purpose is a ``RestorePointError``. Each class maps to one
exit code of the CLI (spec, "Error classes"); the class name is the stable, machine-readable
error class printed by ``--json`` and expected by the golden vectors::

    RestorePointError
    ├── UsageError                      exit 2: the caller asked for something impossible
    │   ├── ConfigError                 a config file that cannot be read or is not JSON data
    │   ├── SourceError                 a pack source that cannot be packed as it is
    │   ├── DestinationError            an import destination that cannot be used as it is
    │   └── MissingExtra                an optional dependency is not installed (pip hint)
    ├── IntegrityError                  exit 1: the object is not a sound restore point
    │   ├── NotARestorePoint            wrong magic: not this format at all
    │   ├── UnsupportedFormat           unknown major version or unknown required feature
    │   ├── TruncatedRestorePoint       the object ends before its structure does
    │   ├── TrailingBytes               bytes after the footer
    │   ├── MalformedManifest           head or index not canonical, not valid, inconsistent
    │   │   ├── LimitExceeded           a declared size or count beyond the spec's limits
    │   │   └── UnsafePath              a payload path the path rules forbid
    │   ├── FramingError                chunk frames or offsets that do not add up
    │   ├── DecodeError                 a codec failed on stored bytes
    │   ├── DigestMismatch              a sha256 differs from the one recorded
    │   ├── SignatureError              a signature invalid, untrusted, or missing when required
    │   ├── DecryptionError             no key opens it, or a chunk does not authenticate
    │   └── UnsafeCheckpoint            a payload file that would run code when loaded
    ├── IncompatibleRestorePoint        exit 3: sound, but refused by the import gate
    └── StorageError                    exit 4: the store failed; .retryable: may a retry help
        ├── NotFound                    also a FileNotFoundError
        ├── PermissionDenied            also a PermissionError
        ├── AlreadyExists               also a FileExistsError
        └── StorageUnavailable          network, throttling, server errors (retryable)

Errors carry context (``url``, ``member`` for a payload file, ``offset``, ``expected`` and
``found``) so that a message names exactly what failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

__all__ = [
    "EXIT_CODES",
    "AlreadyExists",
    "ConfigError",
    "DecodeError",
    "DecryptionError",
    "DestinationError",
    "DigestMismatch",
    "FramingError",
    "IncompatibleRestorePoint",
    "IntegrityError",
    "LimitExceeded",
    "MalformedManifest",
    "MissingExtra",
    "NotARestorePoint",
    "NotFound",
    "PermissionDenied",
    "RestorePointError",
    "SignatureError",
    "SourceError",
    "StorageError",
    "StorageUnavailable",
    "TrailingBytes",
    "TruncatedRestorePoint",
    "UnsafeCheckpoint",
    "UnsafePath",
    "UnsupportedFormat",
    "UsageError",
    "at_url",
    "error_class",
]


class RestorePointError(Exception):
    """Base of every error restorepoint raises on purpose."""

    exit_code: ClassVar[int] = 1

    def __init__(  # noqa: PLR0913 - the context every error carries (url, member, offset, expected, found)
        self,
        message: str,
        *,
        url: str | None = None,
        member: str | None = None,
        offset: int | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.member = member
        self.offset = offset
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        parts = []
        if self.url is not None:
            parts.append(self.url)
        if self.member is not None:
            parts.append(self.member)
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message

    def to_dict(self) -> dict[str, Any]:
        """The error as data, as ``--json`` prints it."""
        out: dict[str, Any] = {"class": error_class(self), "message": str(self)}
        for name in ("url", "member", "offset", "expected", "found"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["exit_code"] = self.exit_code
        return out


def error_class(exc: BaseException) -> str:
    """The stable error-class name of an exception (its class name)."""
    return type(exc).__name__


@contextmanager
def at_url(url: str) -> Iterator[None]:
    """Name ``url`` in any RestorePointError raised by the block that does not name one."""
    try:
        yield
    except RestorePointError as exc:
        if exc.url is None:
            exc.url = url
        raise


# exit 2 ---------------------------------------------------------------------------------------


class UsageError(RestorePointError):
    """The caller asked for something that cannot be done as asked."""

    exit_code = 2


class ConfigError(UsageError):
    """A config file that cannot be parsed, or holds values JSON cannot represent."""


class SourceError(UsageError):
    """A pack source that cannot be packed: a special file, an unsafe name, a file that changed."""


class DestinationError(UsageError):
    """An import destination that cannot be used as it is (not empty, not a directory)."""


class MissingExtra(UsageError):
    """An optional dependency is missing; the message is the one-line install hint."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        super().__init__(f"{feature} needs {module}: pip install 'restorepoint[{extra}]'")
        self.module = module
        self.extra = extra


# exit 1 ---------------------------------------------------------------------------------------


class IntegrityError(RestorePointError):
    """The object is not a sound restore point: corrupt, truncated, tampered or unsupported."""

    exit_code = 1


class NotARestorePoint(IntegrityError):
    """The object does not start with the restore-point magic."""


class UnsupportedFormat(IntegrityError):
    """An unknown major format version, or a required feature this reader does not know."""


class TruncatedRestorePoint(IntegrityError):
    """The object ends before the structure it declares."""


class TrailingBytes(IntegrityError):
    """Bytes follow the footer: something was appended to a complete restore point. (Extra
    bytes inside a chunk are a DecodeError, inside an entry's region a FramingError.)"""


class MalformedManifest(IntegrityError):
    """The head or the index is not canonical JSON, breaks the schema, or contradicts itself."""


class LimitExceeded(MalformedManifest):
    """A declared size, count or length beyond the spec's limits."""


class UnsafePath(MalformedManifest):
    """A payload path the path rules forbid (traversal, absolute, duplicate, ...)."""


class FramingError(IntegrityError):
    """Chunk frames, offsets or stored sizes that do not add up."""


class DecodeError(IntegrityError):
    """A codec could not decode stored bytes, or decoded to the wrong length."""


class DigestMismatch(IntegrityError):
    """A sha256 differs from the one recorded (head, index or a payload file)."""


class SignatureError(IntegrityError):
    """A signature that does not verify, names other content, is made by a key that is not
    trusted, or is missing where one is required."""


class DecryptionError(IntegrityError):
    """The identity given is not a recipient, or an encrypted chunk does not authenticate
    (wrong key, or a stream truncated, reordered, duplicated, spliced or altered)."""


class UnsafeCheckpoint(IntegrityError):
    """A checkpoint file (a pickle: ``torch.save``, Lightning's ``.ckpt``) that holds more than
    tensors and plain data: loading it would run code it names (``os.system``, any class it
    imports). Refused before anything of it is loaded; ``found`` names what it asks for."""


# exit 3 ---------------------------------------------------------------------------------------


class IncompatibleRestorePoint(RestorePointError):
    """A sound restore point that the import gate refuses. ``mismatches`` lists why, as data
    (field, expected, found); ``details`` as one human-readable line per mismatch."""

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        mismatches: Any = None,
        details: list[str] | None = None,
    ) -> None:
        super().__init__(message, url=url)
        self.mismatches = mismatches if mismatches is not None else []
        self.details = details if details is not None else []

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["mismatches"] = self.mismatches
        return out


# exit 4 ---------------------------------------------------------------------------------------


class StorageError(RestorePointError):
    """The storage failed: not found, unreachable, permission. ``retryable`` is a hint."""

    exit_code = 4
    retryable: bool = False


class NotFound(StorageError, FileNotFoundError):
    """Nothing at that URL."""


class PermissionDenied(StorageError, PermissionError):
    """The store refused access."""


class AlreadyExists(StorageError, FileExistsError):
    """A create-only write found an object already there."""


class StorageUnavailable(StorageError):
    """A transient failure: network, throttling, server error. Trying again may help."""

    retryable = True


EXIT_CODES: dict[str, int] = {
    "ok": 0,
    "integrity": IntegrityError.exit_code,
    "usage": UsageError.exit_code,
    "incompatible": IncompatibleRestorePoint.exit_code,
    "storage": StorageError.exit_code,
}
