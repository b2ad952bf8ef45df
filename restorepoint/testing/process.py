"""The end of a test worker process that runs a torch.distributed process group.

torch's gloo process group (2.13 on the CPU) can keep a work thread alive past
``destroy_process_group``: the group stays referenced (a ``DeviceMesh``, Accelerate's state) until
the interpreter finalizes. When that thread then drops the last reference to a tensor, it takes the
GIL; during finalization Python ends such a thread with ``pthread_exit``, whose unwinding crosses a
``noexcept`` frame of the group's run loop, and ``std::terminate`` aborts the process (SIGABRT,
"terminate called without an active exception") after its work is done and its exit code chosen.
A rank that had printed ``ok`` and returned 0, or raised ``SystemExit(42)`` to stop, then reads as
killed. Seen in this project's CI on rank 0 of the DCP and Accelerate jobs, about once in 30 runs
on a loaded 2-core machine, with the abort's thread ``pt_gloo_runloop`` in ``take_gil`` beneath
``Py_FinalizeEx``.

``exit_after(main)`` runs the worker's ``main``, ends the worker's own threads as the interpreter
would (thread pools told to end, non-daemon threads joined), flushes stdout and stderr, and ends the process with ``os._exit`` and the
code the interpreter would have used: no finalization, so no race.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["exit_after"]


def _code(value: object) -> int:
    """The exit status ``sys.exit(value)`` gives: None is 0, an int itself, anything else printed
    to stderr and 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def exit_after(main: Callable[[], object]) -> NoReturn:
    """Run ``main`` and end the process with its exit code, without the interpreter's
    finalization (see the module's docstring for why)."""
    try:
        code = _code(main())
    except SystemExit as exc:
        code = _code(exc.code)
    except BaseException:  # what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    # What the interpreter does before it finalizes: tell the thread pools to end (the callbacks
    # concurrent.futures registers) and join every non-daemon thread. ``threading._shutdown`` is
    # that step itself; where a Python lacks it, join the threads (an idle pool then blocks).
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing to say
            stream.flush()
    os._exit(code)
