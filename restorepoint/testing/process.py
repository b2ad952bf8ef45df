"""The end of a test worker process that runs a torch.distributed process group.

torch's gloo process group (2.13 on the CPU) can keep its run-loop threads alive past
``destroy_process_group``: the group stays referenced (by a ``DeviceMesh``, by Accelerate's state)
until the interpreter finalizes. A run-loop thread that then drops the last reference to a tensor
takes the GIL; during finalization Python ends such a thread with ``pthread_exit``, whose unwinding
crosses a ``noexcept`` frame of the run loop, and ``std::terminate`` aborts the process (SIGABRT,
"terminate called without an active exception") after its work is done and its exit code chosen:
a rank that printed ``ok`` and returned 0 (or stopped with 42) reads as killed. Seen on rank 0 of
the DCP and ``accelerate launch`` test jobs, in CI and in a clean-clone run; in a loop of the DCP
job's ranks on a loaded 2-core machine, 3 times in about 100 runs, with the aborting thread
``pt_gloo_runloop`` in ``take_gil`` while the main thread was in ``Py_FinalizeEx``.

``exit_after(main)`` runs the worker's ``main``, ends the worker's own threads as the interpreter
would (thread pools told to end, non-daemon threads joined), flushes stdout and stderr, and ends
the process with ``os._exit`` and the code the interpreter would have used: no finalization, so
nothing for the run loop to abort.
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
