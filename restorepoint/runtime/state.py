"""What a snapshot holds, and how it is written: the tracked objects' state dicts and the RNG
states copied to CPU memory (the only pause of training), written as a snapshot file (tensors
in safetensors, the rest canonical JSON: ``snapshot_file``, spec section 26) to a temporary
file, fsynced and renamed over ``last.pt`` (a kill leaves the old file or the new one):
``save_image``, also after a publish that packed the snapshot from memory. The
names stay those of the torch.save files before them; a snapshot file is told from an older
pickle by its first bytes, and only an older one goes to the weights-only loader.

With a process group, what every rank holds alike (under DDP: the model, the optimizer, the
scheduler) is saved once, in a shared file named by its content (``shared-DIGEST.pt``), and each
rank's ``last.rankN.pt`` holds the rest (its RNG states, its position, any object that differs)
and names the shared file. The shared file is written first and an older one removed only
after the rank file that named it was replaced, so a kill leaves a pair that belongs together.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import random
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._direct import DirectWriter, replace_file
from ..errors import IncompatibleRestorePoint
from .capture import Buffers, Copies, storable
from .held import Held
from .safe_load import safe_load
from .snapshot_file import (
    SnapshotImage,
    is_snapshot_file,
    is_snapshot_head,
    read_snapshot_file,
    read_snapshot_held,
)

__all__ = [
    "STATE_FORMAT",
    "expected_reuse",
    "load_state",
    "read_state",
    "remove_other_shared",
    "rng_state",
    "save_image",
    "save_state",
    "set_rng",
    "shared_file",
    "split_shared",
    "state_digest",
    "stepped_bytes",
    "to_cpu",
]

STATE_FORMAT = "restorepoint.torch/1"
#: The shared file's name: what a rank file names is checked against it before it is opened.
_SHARED_NAME = re.compile(r"shared-[0-9a-f]{16}\.pt")


def to_cpu(
    value: Any, where: str = "", buffers: Buffers | None = None, copies: Copies | None = None
) -> Any:
    """A copy with every tensor copied to contiguous CPU memory: what a snapshot pauses for.
    A value a snapshot cannot store is refused here, when the snapshot is taken (UsageError
    naming its key path and type), never pickled. With ``copies``, the tensors hold their
    copies once ``copies.run()`` has run (the pause's copies of several values, made
    together on a few threads); without, they are made before this returns."""
    if copies is not None:
        return storable(value, where, buffers=buffers, copies=copies)
    mine = Copies()
    out = storable(value, where, buffers=buffers, copies=mine)
    mine.run()
    return out


def rng_state() -> dict[str, Any]:
    """Python's, numpy's (when imported), torch's and CUDA's (when present) RNG states, as
    tensors and plain data: numpy's as its bit generator's state dict, the key as a list of
    ints (never an ndarray)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        legacy = numpy.random.get_state(legacy=False)
        state["numpy"] = {
            **legacy,
            "state": {**legacy["state"], "key": [int(k) for k in legacy["state"]["key"]]},
        }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        saved = state["numpy"]
        if isinstance(saved, dict):
            key = numpy.asarray(saved["state"]["key"], dtype=numpy.uint32)
            saved = {**saved, "state": {**saved["state"], "key": key}}
        # An older snapshot's is numpy's legacy tuple (its key a uint32 array).
        numpy.random.set_state(saved)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def stepped_bytes(objects: Mapping[str, Any]) -> int | None:
    """The bytes of the tracked state that training changes at each step, as the tracked
    objects tell: the parameters of tracked modules that a tracked optimizer steps (those
    that need a gradient), and every tracked optimizer's state. Everything else (frozen
    parameters, buffers, schedulers, objects of other kinds) is counted as kept: a wrong guess
    here costs only the speed it would save (spec 28.4). None without a tracked optimizer:
    then nothing is known of what changes."""
    optimizers = [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]
    if not optimizers:
        return None
    stepped = {
        id(p)
        for optimizer in optimizers
        for group in optimizer.param_groups
        for p in group["params"]
        if isinstance(p, torch.Tensor) and p.requires_grad
    }
    modules = [o for o in objects.values() if isinstance(o, torch.nn.Module)]
    # Each parameter once, however many tracked modules share it.
    params = {id(p): p for m in modules for p in m.parameters() if id(p) in stepped}
    moments = [
        t
        for optimizer in optimizers
        for value in optimizer.state.values()
        if isinstance(value, Mapping)
        for t in value.values()
        if isinstance(t, torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in [*params.values(), *moments])


def expected_reuse(stepped: int | None, total: int) -> float | None:
    """The share of a restore point of ``total`` bytes that the next one would reuse when
    ``stepped`` of them change at every step (``stepped_bytes``): what a publisher tells its
    ``Rest`` (``Rest.expect``, spec 28.4). None when nothing is known."""
    if stepped is None or total <= 0:
        return None
    return min(1.0, max(0.0, 1 - stepped / total))


def save_state(state: Mapping[str, Any], target: Path, scratch: Path) -> None:
    """``state`` (as ``storable`` returned it) saved as a snapshot file (``save_image``)."""
    save_image(SnapshotImage(dict(state)), target, scratch)


def save_image(image: SnapshotImage, target: Path, scratch: Path) -> None:
    """The snapshot file of ``image`` to ``target`` (``_direct.replace_file``: a temporary file
    in ``scratch``, fsync, rename; the previous file or the new one whatever kills the
    process; StorageError on a full disk), each tensor copied from its memory without the GIL.

    Written past the page cache where the file system allows it: on a VM whose freed memory
    goes back to its host, the page cache's fresh pages and the writeback after them took the
    training thread's core beside a periodic publish (bench_resume.py at 1 GiB: 5.2% of its
    steps through the cache against 2.3% direct, docs/performance.md)."""
    head = (ctypes.c_ubyte * len(image.head)).from_buffer_copy(image.head)

    def fill(writer: DirectWriter) -> None:
        writer.write_memory(ctypes.addressof(head), len(image.head))
        for address, length in image.regions:
            writer.write_memory(address, length)

    replace_file(target, scratch, image.size, fill)


def read_state(
    path: Path,
    *,
    extra_globals: Sequence[Callable[..., Any]] = (),
    held: Mapping[Path, Held] | None = None,
) -> Any:
    """One snapshot file as it lies (a rank file still names its shared state): a snapshot
    file is parsed (JSON and safetensors, no unpickler), an older torch.save file goes to the
    weights-only loader (``safe_load``, with ``extra_globals``). A file in ``held`` (an import
    in memory: its verified bytes by the path the file will have) is read from there."""
    data = None if held is None else held.get(path)
    if data is not None:
        if not is_snapshot_head(data.read(0, 9)):
            # An older release's pickle: the weights-only loader reads files, so the import's
            # copy is read once it is in place.
            raise _NotHeld
        return read_snapshot_held(str(path), data)
    if is_snapshot_file(path):
        return read_snapshot_file(path)
    return safe_load(path, extra_globals=extra_globals)


class _NotHeld(Exception):
    """A held file that only a file can be read as (an older pickle)."""


def held_or_files(
    path: Path,
    held: Mapping[Path, Held] | None,
    land: Callable[[], None],
    extra_globals: Sequence[Callable[..., Any]] = (),
) -> Any:
    """``load_state`` from the held bytes; when they hold an older release's pickle, ``land``
    (the import's copy moved into place) and load the files."""
    try:
        return load_state(path, extra_globals=extra_globals, held=held)
    except _NotHeld:
        land()
        return load_state(path, extra_globals=extra_globals)


# -- what every rank holds alike --------------------------------------------------------------


def state_digest(value: Any) -> str | None:
    """A digest of a state dict's structure and bytes, equal on two ranks only when their
    states are bit for bit the same; None when a value can't be digested (never shared)."""
    h = hashlib.sha256()
    try:
        _feed(h, value)
    except (RuntimeError, TypeError, ValueError):
        return None
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().resolve_conj().resolve_neg()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        h.update(b"D%d;" % len(value))
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, (list, tuple)):
        h.update(b"%s%d;" % (b"L" if isinstance(value, list) else b"U", len(value)))
        for item in value:
            _feed(h, item)
    elif value is None or isinstance(value, (bool, int, float, str, bytes)):
        # repr of these is exact (a float's shortest round trip): equal repr, equal value.
        h.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        # Anything else could hold what its repr does not show: never shared.
        raise TypeError(type(value).__name__)


def shared_file(digests: Mapping[str, str]) -> str:
    """The shared file of these objects (name: digest), named by their content: every rank
    names the same file, and the same content keeps its name."""
    combined = hashlib.sha256(
        "".join(f"{name}={digest};" for name, digest in sorted(digests.items())).encode()
    )
    return f"shared-{combined.hexdigest()[:16]}.pt"


def split_shared(
    state: Mapping[str, Any], shared: Sequence[str], name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``state`` as the rank's own (naming the shared file ``name``) and the shared file's."""
    objects = state["objects"]
    own = {**state, "objects": {k: v for k, v in objects.items() if k not in shared}}
    own["shared"] = {"file": name, "objects": sorted(shared)}
    common = {
        "format": state["format"],
        "identity": state["identity"],
        "objects": {k: objects[k] for k in shared},
        "position": state["position"],
        "run": state["run"],
    }
    return own, common


def remove_other_shared(directory: Path, keep: str) -> None:
    """Older shared files: once the rank file naming ``keep`` is in place, nothing names
    them."""
    for path in directory.glob("shared-*.pt"):
        if path.name != keep and _SHARED_NAME.fullmatch(path.name):
            with contextlib.suppress(OSError):
                path.unlink()


def load_state(
    path: Path,
    *,
    extra_globals: Sequence[Callable[..., Any]] = (),
    held: Mapping[Path, Held] | None = None,
) -> Any:
    """A rank's (or a single process's) snapshot file (``read_state``), with the shared state
    it names merged back in; the shared file must be the same run's at the same position.
    ``held``: files of an import in memory, read from there (``read_state``)."""
    state = read_state(path, extra_globals=extra_globals, held=held)
    ref = state.get("shared") if isinstance(state, dict) else None
    if ref is None:
        return state
    name = ref.get("file") if isinstance(ref, dict) else None
    names = ref.get("objects") if isinstance(ref, dict) else None
    if not isinstance(name, str) or not _SHARED_NAME.fullmatch(name) or not isinstance(names, list):
        raise IncompatibleRestorePoint(
            "refusing to resume: the snapshot names its shared state wrongly", url=str(path)
        )
    try:
        common = read_state(path.parent / name, extra_globals=extra_globals, held=held)
    except FileNotFoundError:
        raise IncompatibleRestorePoint(
            f"refusing to resume: the shared state {name} the snapshot names is missing",
            url=str(path),
        ) from None
    if not (
        isinstance(common, dict)
        and isinstance(common.get("objects"), dict)
        and all(common.get(k) == state.get(k) for k in ("format", "identity", "position", "run"))
        and sorted(common["objects"]) == sorted(names)
    ):
        raise IncompatibleRestorePoint(
            f"refusing to resume: {name} is not the shared state of this snapshot", url=str(path)
        )
    return {**state, "objects": {**state["objects"], **common["objects"]}}
