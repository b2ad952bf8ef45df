"""Shared test setup. The real object-store servers (moto's S3 server, the fake-gcs-server
emulator) and their fixtures are the plugin in tests/_servers/ (``-p _servers``)."""

from __future__ import annotations

import pytest

# The conformance suites live in the package; their asserts should explain a failure as a
# test module's do. This must come before anything imports them.
pytest.register_assert_rewrite("restorepoint.testing")
