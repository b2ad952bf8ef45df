"""The crash suites' S3 fixtures, behind the fault proxy when ``RESTOREPOINT_CRASH_FAULTS`` asks
(tests/crash/_faults.py); as the plugin's otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _servers.s3 import s3_env_for, s3_options

from . import _faults


@pytest.fixture
def s3_storage_options(
    request: pytest.FixtureRequest, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    if not _faults.rate():
        yield s3_server.storage_options()
        return
    proxy = request.getfixturevalue("s3_fault_proxy")
    for name, value in _faults.POLICY_ENV.items():
        monkeypatch.setenv(name, value)
    proxy.set(_faults.faults(seed=hash(request.node.name) & 0xFFFF))
    _faults.current[0] = proxy
    try:
        yield s3_options(proxy.endpoint)
    finally:
        _faults.current[0] = None
        print(f"\nfault proxy: {proxy.requests} requests, injected {dict(proxy.injected)}")


@pytest.fixture
def s3_env(s3_storage_options: dict[str, Any]) -> dict[str, str]:
    env = s3_env_for(s3_storage_options)
    if _faults.rate():
        env.update(_faults.POLICY_ENV)
    return env
