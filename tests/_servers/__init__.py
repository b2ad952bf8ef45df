"""The real object-store servers the tests use, as a pytest plugin (``-p _servers`` in
pyproject.toml): moto's S3 server and the fake-gcs-server emulator on 127.0.0.1, their fixtures
(a server per session and worker, a fresh bucket per test, the environment for a subprocess),
a fault-injecting proxy in front of each (``faults``), and the markers ``s3`` and ``gcs``,
whose tests are skipped with the reason where a server cannot start here."""

from __future__ import annotations

import pytest

from .faults import _gcs_proxy, _s3_proxy, gcs_fault_proxy, s3_capped, s3_fault_proxy
from .gcs import (
    gcs_bucket,
    gcs_env,
    gcs_env_factory,
    gcs_server,
    gcs_storage_options,
    gcs_unavailable,
)
from .s3 import (
    s3_bucket,
    s3_client,
    s3_env,
    s3_env_factory,
    s3_options_factory,
    s3_server,
    s3_storage_options,
    s3_unavailable,
)

__all__ = [
    "_gcs_proxy",
    "_s3_proxy",
    "gcs_bucket",
    "gcs_env",
    "gcs_env_factory",
    "gcs_fault_proxy",
    "gcs_server",
    "gcs_storage_options",
    "s3_bucket",
    "s3_capped",
    "s3_client",
    "s3_env",
    "s3_env_factory",
    "s3_fault_proxy",
    "s3_options_factory",
    "s3_server",
    "s3_storage_options",
]


def pytest_configure(config: pytest.Config) -> None:
    # gcsfs hands aiohttp each resumable-upload chunk (16 MiB here) as bytes, and aiohttp warns
    # about any bytes body over 1 MiB. With warnings as errors the warning is raised inside
    # the upload and fails the publish; it says nothing about restorepoint. Ini lines added
    # later take precedence over the "error" of pyproject.toml.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Sending a large body directly with raw bytes:ResourceWarning",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, unavailable in (("s3", s3_unavailable), ("gcs", gcs_unavailable)):
        marked = [item for item in items if item.get_closest_marker(marker) is not None]
        if not marked:
            continue
        reason = unavailable()
        if reason is not None:
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=reason))
