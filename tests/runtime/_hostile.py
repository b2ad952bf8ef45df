"""Hostile torch.save checkpoints, written opcode by opcode: the shapes an attacker who can
write to the store would give a resume (issue: the loader's holes). Each is a torch zip whose
``data.pkl`` holds ``{"objects": SHAPE}``; ``write`` also writes the records named."""

from __future__ import annotations

import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

PROTO = b"\x80\x02"
MARK, STOP, TUPLE, REDUCE, BUILD = b"(", b".", b"t", b"R", b"b"
TUPLE1, TUPLE3 = b"\x85", b"\x87"
TRUE, FALSE, NONE = b"\x88", b"\x89", b"N"
EMPTY_DICT, EMPTY_LIST, APPEND, SETITEM = b"}", b"]", b"a", b"s"
BINPERSID = b"Q"


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def integer(n: int) -> bytes:
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def value(v: object) -> bytes:
    """Any picklable value's opcodes (protocol 2, as torch.save writes), without PROTO/STOP:
    its memo indices start at 0, so only one such value goes into a pickle."""
    return pickle.dumps(v, protocol=2)[2:-1]


def dtype(code: str) -> bytes:
    return glob("numpy", "dtype") + text(code) + FALSE + TRUE + TUPLE3 + REDUCE


def dtype_state(*fields: bytes) -> bytes:
    return MARK + b"".join(fields) + TUPLE + BUILD


#: name -> the opcodes of the value, and the records beside data.pkl.
SHAPES: dict[str, tuple[bytes, dict[str, bytes]]] = {
    # numpy.dtype('O') by REDUCE alone: an object array's dtype.
    "object-dtype-by-reduce": (dtype("O"), {}),
    # The uint32 dtype's BUILD given fields: an object field at offset 0.
    "uint32-object-field": (
        dtype("u4")
        + dtype_state(
            integer(3),
            text("|"),
            NONE,
            text("f") + TUPLE1,
            EMPTY_DICT + text("f") + dtype("O") + integer(0) + b"\x86" + SETITEM,
            integer(8),
            integer(1),
            integer(0x3F),
        ),
        {},
    ),
    "field-offset-out-of-range": (
        dtype("u4")
        + dtype_state(
            integer(3),
            text("|"),
            NONE,
            text("f") + TUPLE1,
            EMPTY_DICT + text("f") + dtype("u4") + integer(2**40) + b"\x86" + SETITEM,
            integer(4),
            integer(1),
            integer(0),
        ),
        {},
    ),
    "dtype-flags": (
        dtype("u4")
        + dtype_state(
            integer(3), text("<"), NONE, NONE, NONE, integer(-1), integer(-1), integer(0x3F)
        ),
        {},
    ),
    # 1 GiB from a file of a few hundred bytes.
    "bytearray-bomb": (glob("builtins", "bytearray") + integer(2**30) + TUPLE1 + REDUCE, {}),
    "bytes-bomb": (glob("builtins", "bytes") + integer(2**30) + TUPLE1 + REDUCE, {}),
    "storage-larger-than-file": (
        glob("torch._utils", "_rebuild_tensor_v2")
        + MARK
        + MARK
        + text("storage")
        + glob("torch", "FloatStorage")
        + text("0")
        + text("cpu")
        + integer(2**30)
        + TUPLE
        + BINPERSID
        + integer(0)
        + integer(2**30)
        + TUPLE1
        + integer(1)
        + TUPLE1
        + FALSE
        + glob("collections", "OrderedDict")
        + b")"
        + REDUCE
        + TUPLE
        + REDUCE,
        {"data/0": b"\x00" * 4},
    ),
    "deep-nesting": (EMPTY_LIST * 5000 + APPEND * 4999, {}),
}


def pickle_of(body: bytes) -> bytes:
    return PROTO + EMPTY_DICT + text("objects") + body + SETITEM + STOP


def write(path: Path, data_pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A torch zip as torch.save lays it out: stored records under one prefix."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for name, raw in (records or {}).items():
            archive.writestr(f"archive/{name}", raw)
        archive.writestr("archive/version", "3\n")
    return path


def shape(name: str) -> Callable[[Path], Path]:
    body, records = SHAPES[name]
    return lambda path: write(path, pickle_of(body), records)
