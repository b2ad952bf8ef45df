"""Loading a torch.save checkpoint without letting it run code or take the machine's memory:
the one owner of "no pickle from a restore point runs code" (spec section 24) for the files
that are still pickles: snapshots of older releases and Lightning's ``.ckpt``. The runtime's
own snapshots hold no pickle (``snapshot_file``).

A pickle names functions to call when it is loaded, and the objects it builds take what memory
the file asks for. Before torch's weights-only unpickler runs, the file is checked whole
without building anything of it (``pickle_scan.scan``: the globals it names and their
arguments, its storages against their records, what it would build against
``MAX_PICKLE_ALLOCATION``). Anything else is refused as ``UnsafeCheckpoint`` (exit 1) naming
what it asked for; nothing of it is built, nothing is run.

numpy is admitted only for what older snapshots hold (numpy's RNG state: one array of uint32),
and only through stand-ins that take exactly that shape: a dtype is never constructed from
what the file says (no object dtype, no fields, offsets or flags).
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import IntegrityError, MissingExtra
from .pickle_scan import (
    DTYPE_STATE,
    LEGACY_GLOBALS,
    MAX_DEPTH,
    MAX_PICKLE_ALLOCATION,
    MAX_PICKLE_BYTES,
    NUMPY_RECONSTRUCT,
    Refused,
    refusal,
    scan,
)

__all__ = [
    "LEGACY_GLOBALS",
    "MAX_DEPTH",
    "MAX_PICKLE_ALLOCATION",
    "MAX_PICKLE_BYTES",
    "RUNTIME_GLOBALS",
    "check_loadable",
    "runtime_globals",
    "safe_load",
    "scan",
    "weights_only_loads",
]

#: What the allowlist admits beyond tensors and plain data, by name (for the docs).
RUNTIME_GLOBALS = (
    "numpy._core.multiarray._reconstruct (numpy.core.multiarray on numpy 1)",
    "numpy.ndarray",
    "numpy.dtype ('u4' only)",
)


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the runtime needs torch anyway
        raise MissingExtra("torch", "torch", "loading a checkpoint") from exc
    return torch


# -- the load: torch's weights-only unpickler, with stand-ins for numpy ----------------------


class _DType:
    """What ``numpy.dtype('u4', False, True)`` stands for; its state is checked, not set."""

    def __setstate__(self, state: Any) -> None:
        if state != DTYPE_STATE:
            raise pickle.UnpicklingError("a dtype state other than plain uint32")


class _Array:
    """What numpy's ``_reconstruct(ndarray, (0,), b'b')`` stands for: a 1-d uint32 array,
    made from its bytes by the caller (``_arrays``), never by numpy's unpickling."""

    value: Any = None

    def __setstate__(self, state: Any) -> None:
        import numpy

        if not (
            isinstance(state, tuple)
            and len(state) == 5
            and state[0] == 1
            and isinstance(state[2], _DType)
            and state[3] is False
            and isinstance(state[4], bytes)
            and len(state[4]) == 4 * state[1][0]
        ):
            raise pickle.UnpicklingError("an array other than plain uint32")
        self.value = numpy.frombuffer(state[4], dtype="<u4").copy()


def _reconstruct(cls: Any, shape: Any, code: Any) -> _Array:
    if not (isinstance(cls, type) and issubclass(cls, _NDArray)) or shape != (0,) or code != b"b":
        raise pickle.UnpicklingError("an array other than plain uint32")
    return _Array()


def _dtype(code: Any, align: Any, copy: Any) -> _DType:
    if (code, align, copy) != ("u4", False, True):
        raise pickle.UnpicklingError("a dtype other than plain uint32")
    return _DType()


class _NDArray:
    pass


def _named(obj: Any, name: str) -> Any:
    """``obj`` under the name a pickle gives what it stands in for: torch's allowlist looks a
    global up by ``__module__`` and ``__qualname__`` (every torch with ``safe_globals``)."""
    obj.__module__, _, obj.__qualname__ = name.rpartition(".")
    return obj


def _reconstruct_for(name: str) -> Any:
    def reconstruct(cls: Any, shape: Any, code: Any) -> _Array:
        return _reconstruct(cls, shape, code)

    return _named(reconstruct, name)


_STAND_INS = [
    *(_reconstruct_for(name) for name in NUMPY_RECONSTRUCT),
    _named(type("ndarray", (_NDArray,), {}), "numpy.ndarray"),
    _named(_dtype, "numpy.dtype"),
    _Array,
    _DType,
]


def runtime_globals() -> list[Any]:
    """The stand-ins, each under the name a pickle gives what it stands in for."""
    return list(_STAND_INS)


def _arrays(value: Any, depth: int = 0, done: dict[int, Any] | None = None) -> Any:
    """The loaded value with each stand-in array swapped for its numpy array; each container
    visited once, however often the pickle refers to it."""
    if isinstance(value, _Array):
        return value.value
    if depth > MAX_DEPTH or not isinstance(value, (dict, list, tuple)):
        return value
    done = {} if done is None else done
    if id(value) in done:
        return done[id(value)]
    done[id(value)] = value
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list, tuple, _Array)):
                value[key] = _arrays(item, depth + 1, done)
    elif isinstance(value, list):
        value[:] = [_arrays(item, depth + 1, done) for item in value]
    else:
        done[id(value)] = tuple(_arrays(item, depth + 1, done) for item in value)
    return done[id(value)]


@contextmanager
def _allowed(extra: Sequence[Callable[..., Any]]) -> Iterator[None]:
    torch = _torch()
    with torch.serialization.safe_globals([*runtime_globals(), *extra]):
        yield


#: torch's switches that make every torch.load weights-only, or not, whatever its caller asks.
_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_FORCE_NOT = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextmanager
def weights_only_loads(extra_globals: Sequence[Callable[..., Any]] = ()) -> Iterator[None]:
    """Every torch.load in the block loads with torch's weights-only unpickler, whatever its
    caller asks (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``; a ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` the
    user set is lifted meanwhile), with ``extra_globals`` admitted beside what the library
    admits itself: for a library that loads a restore point's pickles its own way after
    ``check_loadable`` passed them (Accelerate loads registered objects with
    ``weights_only=False``), so that no pickle runs code even if the scan and the full
    unpickler read a file differently. numpy's stand-ins are not admitted here: they make
    objects only ``safe_load`` turns back into arrays (Accelerate admits numpy's own, for its
    RNG states). The switch is the process's environment: a torch.load on another thread
    meanwhile is weights-only too."""
    torch = _torch()
    saved = {name: os.environ.get(name) for name in (_FORCE, _FORCE_NOT)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NOT, None)
    try:
        with torch.serialization.safe_globals(list(extra_globals)):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _name(g: Any) -> str:
    return g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}"


def safe_load(
    path: str | os.PathLike[str],
    *,
    extra_globals: Sequence[Callable[..., Any]] = (),
    mmap: bool = False,
) -> Any:
    """The checkpoint, loaded onto the CPU once ``scan`` has passed it: torch.load with
    ``weights_only=True``, numpy's stand-ins and ``extra_globals`` (classes a caller vouches
    for; the caller's responsibility). Raises UnsafeCheckpoint (exit 1) when the file asks for
    anything else, an IntegrityError when it is not a readable checkpoint at all."""
    torch = _torch()
    scan(path, [_name(g) for g in extra_globals])
    try:
        with _allowed(extra_globals):
            loaded = torch.load(os.fspath(path), map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        said = str(exc)
        asked = [a or b for a, b in re.findall(r"got <class '([^']+)'>|GLOBAL (\S+)", said)]
        raise refusal(os.fspath(path), Refused("torch's loader refused it", asked)) from None
    except FileNotFoundError:
        raise
    except (
        RuntimeError, EOFError, ValueError, OSError, TypeError, LookupError, ArithmeticError,
        AttributeError,
    ) as exc:  # fmt: skip
        # What torch's own calls raise on arguments the scan let through (set([[1]]), say).
        raise IntegrityError(
            f"not a readable checkpoint ({type(exc).__name__})", url=os.fspath(path)
        ) from None
    return _arrays(loaded)


def check_loadable(
    path: str | os.PathLike[str], *, extra_globals: Sequence[Callable[..., Any]] = ()
) -> None:
    """Refuse (UnsafeCheckpoint) a checkpoint that ``safe_load`` refuses, before a trainer
    that loads it its own way (Lightning) does; mmap, so the tensors of a large file are not
    read."""
    safe_load(path, extra_globals=extra_globals, mmap=True)
