"""GCS: its credentials, found before gcsfs would look for them the slow way, and reads pinned
to the generation they opened (spec 15.4)."""

from __future__ import annotations

import os
from typing import Any, BinaryIO, ClassVar

from ..errors import NotFound, PermissionDenied, StorageUnavailable
from ._base import Abilities, ObjectReader
from ._errors import translating
from ._fsspec import _STREAM_BLOCK, FsspecLocation, RangeStream, _FsspecReader, whole

__all__ = ["GCSLocation", "gcs_credentials"]


#: gcsfs's default scope (its ``access="full_control"``).
_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage."


def gcs_credentials(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """gcs:// options with the credentials found, or one line saying there are none.

    Given no token, gcsfs tries every source in turn and ends with a GCE VM's metadata
    server, which it asks again and again (15 s where there is none, before it falls back to
    anonymous access; a private bucket then fails after six more tries, logging a traceback).
    google.auth finds the same credentials (the environment, gcloud's, the metadata server,
    whose absence it notices with short timeouts) at once, and none found is refused now, as on
    S3; a public bucket is read with an explicit ``token="anon"`` (``FSSPEC_GCS_TOKEN=anon``).
    A token given in any way, an endpoint of another server, or STORAGE_EMULATOR_HOST (an
    emulator) leave gcsfs to itself."""
    import fsspec.config

    given = {**fsspec.config.conf.get("gs", {}), **fsspec.config.conf.get("gcs", {}), **options}
    if "token" in given or "endpoint_url" in given or os.environ.get("STORAGE_EMULATOR_HOST"):
        return options
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:  # pragma: no cover - gcsfs depends on it; let gcsfs say what is missing
        return options
    scope = _GCS_SCOPE + str(given.get("access", "full_control"))
    try:
        credentials, project = google.auth.default(scopes=[scope])
    except google.auth.exceptions.DefaultCredentialsError:
        raise PermissionDenied(
            "no Google Cloud credentials found (set GOOGLE_APPLICATION_CREDENTIALS, run "
            "`gcloud auth application-default login`, or run on a VM with a service account; "
            "for a public bucket, FSSPEC_GCS_TOKEN=anon)",
            url=url,
        ) from None
    except google.auth.exceptions.GoogleAuthError as exc:
        raise PermissionDenied(f"Google Cloud credentials unusable ({exc})", url=url) from None
    found: dict[str, Any] = {**options, "token": credentials}
    if project and "project" not in given:
        found["project"] = project
    return found


class _PinnedGCSReader(_FsspecReader):
    """A GCS object read as the one generation it was when the reader opened it: every range,
    the payload stream's too, names that generation. An object replaced meanwhile is then
    either still read whole (a bucket that keeps noncurrent generations) or gone (404), which
    is StorageUnavailable: a retry reads the new object, whole."""

    def __init__(self, url: str, fs: Any, path: str) -> None:
        super().__init__(url, fs, path)
        generation = self.info.get("generation")
        self._generation = str(generation) if generation else None

    def read_range(self, start: int, end: int) -> bytes:
        end = min(end, self._size)
        if end <= start:
            return b""
        if self._generation is None:
            return super().read_range(start, end)
        from fsspec.asyn import sync

        try:
            with translating(self.url):
                data = sync(
                    self.fs.loop,
                    self.fs._cat_file_sequential,
                    self.path,
                    start=start,
                    end=end,
                    generation=self._generation,
                )
            return whole(bytes(data), end - start, self.url)
        except NotFound as exc:
            raise StorageUnavailable(
                "the object was replaced while it was read (its generation is gone); read it again",
                url=self.url,
            ) from exc

    def open_stream(self, start: int) -> BinaryIO:
        return RangeStream(self, start, _STREAM_BLOCK)  # type: ignore[return-value]


class GCSLocation(FsspecLocation):
    """gs:// (and gcs://) through gcsfs: a resumable upload completed only at the end. gcsfs
    can ask for a create-only upload, but the GCS emulator does not honour it, so nothing here
    declares or relies on it."""

    abilities: ClassVar[Abilities] = Abilities(deferred_commit=True, pinned_reads=True)

    def reader(self) -> ObjectReader:
        return _PinnedGCSReader(self.url, self.fs, self.path)

    @property
    def protocol(self) -> str:
        return "gcs"
