"""Golden vectors for the runtime's snapshot file (spec section 26), made and checked by
generate.py: valid snapshots, and one fault each in the structure's JSON, in the tensor
container (safetensors) and in the cross-references between them. Each vector is a file of
``snapshot/``, recorded in ``snapshot/index.json`` with the error class a reader must raise
(none: it must read), and for a valid one each tensor's dtype, shape and sha256."""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from restorepoint.format import canonical_dumps
from restorepoint.runtime.snapshot_file import (
    DTYPES,
    SNAPSHOT_FORMAT,
    read_snapshot_file,
    write_snapshot_file,
)

SNAPSHOTS = "snapshot"
SNAPSHOTS_INDEX = f"{SNAPSHOTS}/index.json"


@dataclass(frozen=True)
class SnapshotVector:
    name: str
    data: bytes
    fault: str
    expected_error: str | None = None
    #: valid vectors: what the reader must return
    value: Any = None

    @property
    def file(self) -> str:
        return f"{SNAPSHOTS}/{self.name}.safetensors"

    def record(self) -> dict[str, Any]:
        valid = self.expected_error is None
        out: dict[str, Any] = {
            "name": self.name,
            "kind": "snapshot",
            "file": self.file,
            "valid": valid,
            "expected_error": self.expected_error,
            "fault": self.fault,
        }
        if valid:
            out["tensors"] = {
                str(i): {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "sha256": _sha(t)}
                for i, t in enumerate(_tensors(self.value))
            }
        return out


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(_raw(t)).hexdigest()


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of ``value`` in the order the structure names them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_tensors(k), *_tensors(v))] + (
            _tensors(value._metadata) if getattr(value, "_metadata", None) is not None else []
        )
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _tensor(dtype: torch.dtype, shape: list[int], seed: int) -> torch.Tensor:
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = bytearray((seed * 37 + i * 11) % 251 for i in range(n))
    if dtype == torch.bool:
        raw = bytearray(b % 2 for b in raw)
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone()


def _state() -> dict[str, Any]:
    """A runtime snapshot's state with every kind of value the structure has."""
    model: Any = OrderedDict(
        [
            ("0.weight", _tensor(torch.float32, [3, 2], 1)),
            ("0.bias", _tensor(torch.bfloat16, [3], 2)),
            ("1.num_batches_tracked", _tensor(torch.int64, [], 3)),
            ("1.mask", _tensor(torch.bool, [2, 2], 4)),
            ("1.empty", _tensor(torch.float64, [0, 4], 5)),
        ]
    )
    model._metadata = {"": {"version": 1}, "1": {"version": 2}}
    optimizer = {
        "state": {
            0: {"step": _tensor(torch.float32, [], 6), "exp_avg": _tensor(torch.float16, [2], 7)}
        },
        "param_groups": [
            {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "amsgrad": False, "params": [0]}
        ],
    }
    return {
        "format": "restorepoint.torch/1",
        "objects": {"model": model, "optimizer": optimizer},
        "position": {"batch": 3, "epoch": 0, "step": 3},
        "rng": {
            "python": (3, (2147483648, 123456789, 624), None),
            "torch": _tensor(torch.uint8, [16], 8),
            "numpy": {
                "bit_generator": "MT19937",
                "gauss": 0.0,
                "has_gauss": 0,
                "state": {"key": [1, 4294967295], "pos": 624},
            },
        },
        "floats": [math.nan, math.inf, -math.inf, -0.0, 0.1, 1e300],
        "big": [2**53, -(2**64) + 1],
        "resubmit_count": 1,
        "name": "ünï\u2028",
    }


def _written(state: Any) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s"
        write_snapshot_file(state, path)
        return path.read_bytes()


def container(metadata: dict[str, str], tensors: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """A safetensors file laid out by hand: ``tensors`` as (name, dtype, shape, bytes) in
    that order, back to back."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset, data = 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"data_offsets": [offset, offset + len(raw)], "dtype": dtype, "shape": shape}
        offset += len(raw)
        data += raw
    text = canonical_dumps(header)
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def _snap(structure: Any, tensors: list[tuple[str, str, list[int], bytes]], **meta: str) -> bytes:
    text = structure if isinstance(structure, str) else canonical_dumps(structure).decode()
    return container({"format": SNAPSHOT_FORMAT, "structure": text, **meta}, tensors)


_T = {"dtype": "F32", "shape": [2], "tensor": "0"}
_F32 = ("0", "F32", [2], b"\x00\x00\x80\x3f\x00\x00\x00\x40")


def build() -> list[SnapshotVector]:
    state = _state()
    small = {"dict": [["w", _T]]}
    out = [
        SnapshotVector("valid-snapshot-state", _written(state), "none", value=state),
        SnapshotVector(
            "valid-snapshot-no-tensors",
            _written({"position": {"step": 0}}),
            "none",
            value={"position": {"step": 0}},
        ),
        # The structure's JSON.
        SnapshotVector(
            "snapshot-json-not-canonical",
            _snap('{"dict": [["w", {"dtype":"F32","shape":[2],"tensor":"0"}]]}', [_F32]),
            "the structure's JSON has white space (not canonical)",
            "MalformedManifest",
        ),
        SnapshotVector(
            "snapshot-json-unknown-node",
            _snap({"set": [1, 2]}, []),
            "an object of a kind the structure does not have",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-json-float-not-shortest",
            _snap({"float": "0.10"}, []),
            "a float not spelled as its shortest round trip",
            "IntegrityError",
        ),
        # The container.
        SnapshotVector(
            "snapshot-container-header-beyond-file",
            (10**6).to_bytes(8, "little") + _snap(small, [_F32])[8:],
            "the header length runs past the end of the file",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-container-data-short",
            _snap(small, [_F32])[:-4],
            "the last tensor's bytes end past the end of the file",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-container-other-format",
            container({"format": "restorepoint.snapshot/2", "structure": "null"}, []),
            "the metadata names another format",
            "IntegrityError",
        ),
        # The cross-references.
        SnapshotVector(
            "snapshot-tensor-missing",
            _snap({"dict": [["w", _T], ["b", {**_T, "tensor": "1"}]]}, [_F32]),
            "the structure names a tensor the file lacks",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-tensor-extra",
            _snap(small, [_F32, ("1", "F32", [1], b"\x00" * 4)]),
            "the file holds a tensor the structure does not name",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-tensor-dtype-disagrees",
            _snap({"dict": [["w", {**_T, "dtype": "I32"}]]}, [_F32]),
            "the structure's dtype of a tensor is not the file's",
            "IntegrityError",
        ),
        SnapshotVector(
            "snapshot-tensor-shape-disagrees",
            _snap({"dict": [["w", {**_T, "shape": [1, 2]}]]}, [_F32]),
            "the structure's shape of a tensor is not the file's",
            "IntegrityError",
        ),
    ]
    return out


def index_bytes(vectors: list[SnapshotVector]) -> bytes:
    text = json.dumps([v.record() for v in vectors], indent=2, ensure_ascii=False)
    return (text + "\n").encode()


def files(vectors: list[SnapshotVector]) -> dict[str, bytes]:
    """Path (relative to spec/vectors): bytes, the index included."""
    return {**{v.file: v.data for v in vectors}, SNAPSHOTS_INDEX: index_bytes(vectors)}


def same(a: Any, b: Any) -> bool:
    """Bit for bit: tensors by dtype, shape and bytes; floats by their spelling (nan, -0.0);
    containers by type, order and members."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a.dtype, a.shape) == (b.dtype, b.shape)
            and _raw(a) == _raw(b)
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
            and same(getattr(a, "_metadata", None), getattr(b, "_metadata", None))
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def outcome(v: SnapshotVector, checked_read: Callable[..., tuple[list[str], Any]]) -> list[str]:
    """Problems with what the reader makes of ``v``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "last.pt"
        path.write_bytes(v.data)
        problems, got = checked_read(v.name, v.expected_error, lambda: read_snapshot_file(path))
        if not problems and v.expected_error is None and not same(got, v.value):
            problems.append(f"{v.name}: the reader returns another state than was written")
    return problems
