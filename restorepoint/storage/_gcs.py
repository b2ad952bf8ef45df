"""GCS: its credentials, found before gcsfs would look for them the slow way."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ..errors import PermissionDenied
from ._base import Abilities
from ._fsspec import FsspecLocation

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


class GCSLocation(FsspecLocation):
    """gs:// (and gcs://) through gcsfs: a resumable upload completed only at the end. gcsfs
    can ask for a create-only upload, but the GCS emulator does not honour it, so nothing here
    declares or relies on it."""

    abilities: ClassVar[Abilities] = Abilities(deferred_commit=True)

    @property
    def protocol(self) -> str:
        return "gcs"
