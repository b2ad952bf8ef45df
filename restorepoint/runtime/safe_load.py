"""Loading a checkpoint file without letting it run code: the one owner of "no pickle from a
restore point runs code" (spec section 24).

``torch.save`` writes a pickle, and a pickle names functions to call when it is loaded: a
``last.pt`` made with ``torch.save({"objects": Evil()})``, ``Evil.__reduce__`` returning
``(os.system, (...))``, runs that command in a full ``torch.load``. Every load of a
checkpoint here is ``weights_only=True``: tensors and plain data (dicts, lists, tuples, numbers,
strings), and beyond that only the explicit, minimal allowlist of what the runtime itself saves
(numpy's RNG state, an array of uint32). Anything else is refused as ``UnsafeCheckpoint`` before
any of it is built, naming what it asked for; nothing is run.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import IntegrityError, MissingExtra, UnsafeCheckpoint

__all__ = ["RUNTIME_GLOBALS", "check_loadable", "runtime_globals", "safe_load"]

#: What the allowlist admits beyond torch's own weights-only set, by name (for the docs).
RUNTIME_GLOBALS = (
    "numpy._core.multiarray._reconstruct (numpy.core.multiarray on numpy 1)",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
)


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the runtime needs torch anyway
        raise MissingExtra("torch", "torch", "loading a checkpoint") from exc
    return torch


def runtime_globals() -> list[Callable[..., Any]]:
    """The allowlist itself: numpy's RNG state is ``('MT19937', uint32 array, int, int,
    float)``, and an array unpickles through numpy's reconstruct function, the ndarray and
    dtype classes and the uint32 dtype class. No other dtype: an object array would unpickle
    arbitrary objects. Empty where numpy is not installed (then the runtime saves no numpy
    state either)."""
    try:
        import numpy
    except ImportError:
        return []
    core = getattr(numpy, "_core", None) or numpy.core
    out: list[Callable[..., Any]] = [core.multiarray._reconstruct, numpy.ndarray, numpy.dtype]
    dtypes = getattr(numpy, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "UInt32DType"):
        out.append(dtypes.UInt32DType)
    return out


@contextmanager
def _allowed(extra: Sequence[Callable[..., Any]]) -> Iterator[None]:
    torch = _torch()
    with torch.serialization.safe_globals([*runtime_globals(), *extra]):
        yield


def _unsafe(path: str | os.PathLike[str], exc: BaseException) -> IntegrityError:
    """What a refused weights-only load means: a checkpoint that asks for something it may not
    have (UnsafeCheckpoint, naming it), or one whose pickle is broken (IntegrityError)."""
    torch = _torch()
    try:
        asked = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a torch zip at all (a legacy pickle, or garbage)
        asked = []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in runtime_globals()}
    asked = [name for name in asked if name not in allowed]
    said = str(exc)
    if not asked:
        # A class it would build (an object array's dtype), or a global a legacy pickle names.
        asked = [a or b for a, b in re.findall(r"got <class '([^']+)'>|GLOBAL (\S+)", said)]
    if not asked and not any(word in said for word in ("global", "Can only build", "allowlist")):
        return IntegrityError(
            "not a readable checkpoint (its pickle is broken)", url=os.fspath(path)
        )
    # Names from a hostile file: escaped (ascii) before they reach a terminal.
    what = ", ".join(ascii(name)[1:-1] for name in asked[:5]) or "a global it may not name"
    if len(asked) > 5:
        what += f" and {len(asked) - 5} more"
    return UnsafeCheckpoint(
        f"refused to load: it asks for {what}, which is not tensors or plain data "
        "(loading it could run code; nothing of it was run)",
        url=os.fspath(path),
        found=asked or None,
    )


def safe_load(
    path: str | os.PathLike[str],
    *,
    extra_globals: Sequence[Callable[..., Any]] = (),
    mmap: bool = False,
) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU, with the runtime's allowlist and
    ``extra_globals`` (classes a caller vouches for; the caller's responsibility). Raises
    UnsafeCheckpoint (exit 1) when the file asks for anything else, an IntegrityError when it
    is not a readable checkpoint at all."""
    torch = _torch()
    try:
        with _allowed(extra_globals):
            return torch.load(os.fspath(path), map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise _unsafe(path, exc) from None
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise IntegrityError(
            f"not a readable checkpoint ({type(exc).__name__})", url=os.fspath(path)
        ) from None


def check_loadable(
    path: str | os.PathLike[str], *, extra_globals: Sequence[Callable[..., Any]] = ()
) -> None:
    """Refuse (UnsafeCheckpoint) a checkpoint that a weights-only load refuses, before a
    trainer that loads it its own way (Lightning) does; mmap, so the tensors of a large file
    are not read."""
    safe_load(path, extra_globals=extra_globals, mmap=True)
