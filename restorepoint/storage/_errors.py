"""Translate at the boundary: fsspec, botocore, aiohttp and OS errors become restorepoint's
StorageError tree here and nowhere else, with ``raise ... from exc`` so the cause is kept."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import (
    AlreadyExists,
    MissingExtra,
    NotFound,
    PermissionDenied,
    RestorePointError,
    StorageError,
    StorageUnavailable,
    UsageError,
)

#: Which extra brings the fsspec implementation of a protocol.
EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}

#: What the one retry policy (``_retry.retriable``, which owns the transient network errors)
#: does not retry but the boundary still counts as unavailable: gcsfs's HttpError without a
#: status, and a RetryError raised once retries are spent.
_UNAVAILABLE_AFTER_RETRIES = {"HttpError", "RetryError"}


def _unavailable(exc: BaseException) -> bool:
    """A failure that a retry may cure: the network, a timeout, throttling, a server error."""
    from ._retry import retriable

    if retriable(exc):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _UNAVAILABLE_AFTER_RETRIES or isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = getattr(exc, "status", None)  # aiohttp's ClientResponseError
    return isinstance(status, int) and (status == 429 or 500 <= status <= 599)


def translate(exc: BaseException, url: str) -> RestorePointError:  # noqa: PLR0911 - one return per error class the boundary maps to
    """The StorageError (or MissingExtra) that stands for ``exc`` on ``url``."""
    if isinstance(exc, RestorePointError):
        return exc
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        # fsspec's http backend turns every failure of its info request into one, a refused
        # connection and a server error included: its cause tells them apart.
        cause = exc.__cause__
        if cause is not None and _unavailable(cause):
            reason = str(cause) or type(cause).__name__
            return StorageUnavailable(f"storage unreachable or failing ({reason})", url=url)
        return NotFound("not found", url=url)
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"permission denied ({detail})", url=url)
    if isinstance(exc, FileExistsError):
        return AlreadyExists("already exists", url=url)
    if _unavailable(exc):
        return StorageUnavailable(f"storage unreachable or failing ({detail})", url=url)
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return StorageError("no space left on the device", url=url)
        if exc.errno in (errno.EROFS,):
            return PermissionDenied("read-only file system", url=url)
        if exc.errno in (errno.ENOTDIR, errno.EISDIR):
            return StorageError(f"not a file ({detail})", url=url)
        return StorageError(detail, url=url)
    return StorageError(f"{type(exc).__name__}: {detail}", url=url)


@contextmanager
def translating(url: str) -> Iterator[None]:
    """Run a block of storage calls; what they raise leaves as a RestorePointError."""
    try:
        yield
    except RestorePointError:
        raise
    except (OSError, ValueError, RuntimeError, TimeoutError) as exc:
        raise translate(exc, url) from exc
    except Exception as exc:
        # botocore's ClientError and friends are plain Exceptions; anything an fsspec
        # implementation raises is a storage failure from our point of view.
        raise translate(exc, url) from exc


def missing_extra(protocol: str, exc: BaseException) -> RestorePointError:
    if protocol not in EXTRAS:
        # Not one of ours: pass on what fsspec says to install.
        return UsageError(f"{protocol}:// URLs need a package that is not installed ({exc})")
    module, extra = EXTRAS[protocol]
    err = MissingExtra(module, extra, f"{protocol}:// URLs")
    err.__cause__ = exc
    return err
