"""Shared test setup. The real object-store servers (moto's S3 server, the fake-gcs-server
emulator) and their fixtures are the plugin in tests/_servers/ (``-p _servers``)."""

from __future__ import annotations

import pytest

# The conformance suites live in the package; their asserts should explain a failure as a
# test module's do. This must come before anything imports them.
pytest.register_assert_rewrite("restorepoint.testing")


_HANDLED = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")


@pytest.fixture(autouse=True)
def _signal_handlers_put_back():
    """Every test starts with the signal handlers the one before it found: a handler that a
    test's trainer or run left installed (a stop contract under test) would otherwise be the
    "earlier handler" of the next test in the same worker, which chains to it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for name in _HANDLED:
        signum = getattr(signal, name, None)
        if signum is not None:
            saved[signum] = signal.getsignal(signum)
    yield
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
