"""A URL -> its Location: the backend's class chosen by the URL's protocol, here and nowhere
else."""

from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError
from ._base import Location
from ._errors import missing_extra
from ._fsspec import FsspecLocation
from ._gcs import GCSLocation, gcs_credentials
from ._local import LocalLocation
from ._retry import store_options, take_over
from ._s3 import S3Location

__all__ = ["resolve"]

_ALIASES = {"s3a": "s3", "gs": "gcs", "local": "file"}
#: The backends with a class of their own; any other fsspec protocol is FsspecLocation.
_BACKENDS: dict[str, type[FsspecLocation]] = {"s3": S3Location, "gcs": GCSLocation}


def _protocol_of(url: str) -> str:
    if "://" not in url:
        return "file"
    proto = url.split("://", 1)[0].split("::", maxsplit=1)[0].lower()
    return _ALIASES.get(proto, proto)


def resolve(
    url: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None
) -> Location:
    """The Location for ``url``: a local path, file://, s3://, gs://, memory://, or any URL
    that fsspec knows. ``storage_options`` go to the fsspec filesystem (endpoint,
    credentials); fsspec's own configuration (``FSSPEC_S3_...`` variables) applies too. A
    Location passes through unchanged (tests wrap a backend, say, to count its bytes)."""
    if isinstance(url, Location):
        return url
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise UsageError("empty URL")
    protocol = _protocol_of(url)
    if protocol == "file" and "::" not in url:
        path = url[len("file://") :] if url.startswith("file://") else url
        return LocalLocation(url, path)
    try:
        import fsspec.core
    except ImportError as exc:  # pragma: no cover - fsspec is a runtime dependency
        raise missing_extra(protocol, exc) from exc
    options = dict(storage_options or {})
    if protocol == "gcs":
        options = gcs_credentials(url, options)
    if protocol in ("s3", "gcs"):
        options = store_options(protocol, options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise missing_extra(protocol, exc) from exc
    except ValueError as exc:
        raise UsageError(f"{url}: unsupported URL ({exc})") from exc
    fs_protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    name = _ALIASES.get(fs_protocol, fs_protocol)
    backend = _BACKENDS.get(name, FsspecLocation)
    if backend is not FsspecLocation:
        take_over(name, fs)
    return backend(url, fs, path)
