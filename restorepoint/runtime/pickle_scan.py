"""The scan of a torch.save checkpoint: what loading it would build, checked before anything of
it is (``restorepoint.runtime.safe_load`` runs it before torch's weights-only unpickler).

The file must be a torch zip whose records are stored (not compressed), under one prefix, each
named once. Its ``data.pkl`` is read opcode by opcode (pickletools) on a symbolic stack: every
global it names must be on ``LEGACY_GLOBALS`` (or one a caller vouches for), called with
arguments of the shape that global takes; every storage must lie within its record; what the
pickle would build is summed (``MAX_PICKLE_BYTES``, ``MAX_PICKLE_ALLOCATION``, ``MAX_DEPTH``).
Anything else is refused as ``UnsafeCheckpoint`` naming what it asked for.
"""

from __future__ import annotations

import os
import pickletools
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections.abc import Sequence
from typing import Any

from ..errors import IntegrityError, UnsafeCheckpoint

__all__ = [
    "DTYPE_STATE",
    "LEGACY_GLOBALS",
    "MAX_DEPTH",
    "MAX_PICKLE_ALLOCATION",
    "MAX_PICKLE_BYTES",
    "NUMPY_RECONSTRUCT",
    "OBJECT_COST",
    "Refused",
    "refusal",
    "scan",
]


#: The pickle of a checkpoint (its ``data.pkl``; the tensors' bytes lie beside it) at most.
MAX_PICKLE_BYTES = 64 << 20
#: What the objects a pickle builds may take at most, estimated before any is built: each
#: object, container member and memo entry counts ``OBJECT_COST``, bytes and strings their
#: length. Storages are bounded apart: each by its record, all by the file.
MAX_PICKLE_ALLOCATION = 256 << 20
OBJECT_COST = 64
#: How deep containers may nest in a checkpoint.
MAX_DEPTH = 100

_STORAGES = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}  # fmt: skip
#: The globals a checkpoint may name (torch's weights-only set, narrowed to what a state dict
#: of dense tensors and plain data needs), each called only with the arguments it takes.
LEGACY_GLOBALS = (
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter",
    "torch.Size",
    "torch.device",
    "_codecs.encode",
    "builtins.bytearray",
    "builtins.set",
    "builtins.complex",
    *(f"torch.{name}Storage" for name in _STORAGES),
    "torch.UntypedStorage",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
)
NUMPY_RECONSTRUCT = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
DTYPE_STATE = (3, "<", None, None, None, -1, -1, 0)


class Refused(Exception):
    """What the scan refuses, and the globals it names."""

    def __init__(self, reason: str, names: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.names = list(names)


class _Global:
    def __init__(self, name: str) -> None:
        self.name = name


class _Mark:
    pass


class _Node:
    """An object the pickle builds: a container (``kind`` list/dict/set) or the result of a
    call (``kind`` the global's name), with what the checks need of it."""

    def __init__(self, kind: str, depth: int = 1, value: Any = None) -> None:
        self.kind = kind
        self.depth = depth
        self.value = value
        self.built = False


_MARK = _Mark()


class _Tuple(tuple):  # type: ignore[type-arg]
    """A tuple the pickle builds, its depth computed once (a tuple of a thousand references to
    one large tuple must not be walked a thousand times)."""

    depth: int

    @classmethod
    def of(cls, items: Sequence[Any]) -> _Tuple:
        t = cls(items)
        t.depth = 1 + max((_depth(v) for v in items), default=0)
        return t


def _depth(value: Any) -> int:
    if isinstance(value, (_Node, _Tuple)):
        return value.depth
    return 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Scan:
    def __init__(self, allowed: set[str], records: dict[str, int]) -> None:
        self.allowed = allowed
        self.records = records
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.cost = 0
        self.storages: dict[str, int] = {}

    def spend(self, n: int) -> None:
        self.cost += n
        if self.cost > MAX_PICKLE_ALLOCATION:
            raise Refused(f"it would build more than {MAX_PICKLE_ALLOCATION >> 20} MiB of objects")

    def push(self, value: Any) -> None:
        if _depth(value) > MAX_DEPTH:
            raise Refused(f"it nests deeper than {MAX_DEPTH}")
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise Refused("its pickle is malformed (the stack runs out)")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        items: list[Any] = []
        while True:
            if not self.stack:
                raise Refused("its pickle is malformed (no mark)")
            item = self.stack.pop()
            if item is _MARK:
                return items[::-1]
            items.append(item)

    def add(self, container: Any, items: Sequence[Any], kind: str) -> None:
        if not isinstance(container, _Node) or container.kind != kind:
            raise Refused(f"it adds to something that is not a {kind}")
        self.spend(OBJECT_COST * len(items))
        depth = 1 + max((_depth(v) for v in items), default=0)
        container.depth = max(container.depth, depth)
        if container.depth > MAX_DEPTH:
            raise Refused(f"it nests deeper than {MAX_DEPTH}")

    def run(self, data: bytes) -> None:  # noqa: PLR0912, PLR0915 - a case per opcode
        try:
            ops = pickletools.genops(data)
            for op, arg_, _ in ops:
                arg: Any = arg_
                name = op.name
                if name in ("PROTO", "FRAME"):
                    continue
                if name == "STOP":
                    return
                if name == "MARK":
                    self.stack.append(_MARK)
                elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                    self.push({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
                elif name in ("BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT"):
                    self.spend(32)
                    self.push(arg)
                elif name in ("BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "SHORT_BINSTRING"):
                    self.spend(len(arg) + 64)
                    self.push(arg)
                elif name in ("BINBYTES", "SHORT_BINBYTES", "BINBYTES8"):
                    self.spend(len(arg) + 64)
                    self.push(bytes(arg))
                elif name == "EMPTY_TUPLE":
                    self.push(_Tuple.of(()))
                elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                    n = int(name[-1])
                    items = [self.pop() for _ in range(n)][::-1]
                    self.spend(OBJECT_COST * (n + 1))
                    self.push(_Tuple.of(items))
                elif name == "TUPLE":
                    items = self.pop_mark()
                    self.spend(OBJECT_COST * (len(items) + 1))
                    self.push(_Tuple.of(items))
                elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
                    self.spend(OBJECT_COST)
                    kind = {"EMPTY_LIST": "list", "EMPTY_DICT": "dict", "EMPTY_SET": "set"}
                    self.push(_Node(kind[name]))
                elif name == "APPEND":
                    item = self.pop()
                    self.add(self.stack[-1] if self.stack else None, [item], "list")
                elif name == "APPENDS":
                    items = self.pop_mark()
                    self.add(self.stack[-1] if self.stack else None, items, "list")
                elif name == "SETITEM":
                    value, key = self.pop(), self.pop()
                    self.add(self.stack[-1] if self.stack else None, [key, value], "dict")
                elif name == "SETITEMS":
                    items = self.pop_mark()
                    self.add(self.stack[-1] if self.stack else None, items, "dict")
                elif name == "ADDITEMS":
                    items = self.pop_mark()
                    self.add(self.stack[-1] if self.stack else None, items, "set")
                elif name == "GLOBAL":
                    module, _, attr = str(arg).partition(" ")
                    # Python 2 names, mapped as torch's unpickler maps them (protocol 2).
                    if (module, attr) in NAME_MAPPING:
                        module, attr = NAME_MAPPING[(module, attr)]
                    elif module in IMPORT_MAPPING:
                        module = IMPORT_MAPPING[module]
                    full = f"{module}.{attr}"
                    if full not in self.allowed:
                        raise Refused("", [full])
                    self.push(_Global(full))
                elif name == "REDUCE":
                    args = self.pop()
                    func = self.pop()
                    self.push(self.reduce(func, args))
                elif name == "NEWOBJ":
                    args = self.pop()
                    cls = self.pop()
                    if not isinstance(cls, _Global) or cls.name in LEGACY_GLOBALS:
                        raise Refused("it makes an object of a class it may not name")
                    self.spend(OBJECT_COST)
                    self.push(_Node(cls.name, _depth(args)))  # the caller vouches for it
                elif name == "BUILD":
                    state = self.pop()
                    self.build(self.stack[-1] if self.stack else None, state)
                elif name == "BINPERSID":
                    self.push(self.persistent(self.pop()))
                elif name in ("BINPUT", "LONG_BINPUT"):
                    if not self.stack:
                        raise Refused("its pickle is malformed (memo of nothing)")
                    self.spend(OBJECT_COST)
                    self.memo[int(arg)] = self.stack[-1]
                elif name in ("BINGET", "LONG_BINGET"):
                    if int(arg) not in self.memo:
                        raise Refused("its pickle is malformed (memo entry missing)")
                    self.push(self.memo[int(arg)])
                elif name == "POP":
                    self.pop()
                elif name == "POP_MARK":
                    self.pop_mark()
                else:
                    raise Refused(
                        f"its pickle uses the opcode {name}, which a checkpoint needs not"
                    )
        except Refused:
            raise
        except (ValueError, EOFError, IndexError, KeyError, TypeError) as exc:
            raise Refused(f"its pickle is malformed ({type(exc).__name__})") from None
        raise Refused("its pickle is malformed (no STOP)")

    def reduce(self, func: Any, args: Any) -> Any:  # noqa: PLR0911, PLR0912 - a case per global
        if not isinstance(func, _Global) or not isinstance(args, tuple):
            raise Refused("it calls something that is not an admitted global")
        name = func.name
        self.spend(OBJECT_COST * (len(args) + 1))
        if name not in LEGACY_GLOBALS:
            return _Node(name, _depth(args))  # a caller's global: the caller vouches for it
        if name == "collections.OrderedDict" and args == ():
            return _Node("dict")
        if name == "torch._utils._rebuild_tensor_v2" and len(args) in (6, 7):
            storage, offset, size, stride, grad, hooks = args[:6]
            if (
                isinstance(storage, _Node)
                and storage.kind == "storage"
                and _is_int(offset)
                and offset >= 0
                and _ints(size)
                and _ints(stride)
                and len(size) == len(stride) <= 64
                and isinstance(grad, bool)
                and isinstance(hooks, _Node)
                and hooks.kind == "dict"
                and (len(args) == 6 or (isinstance(args[6], _Node) and args[6].kind == "dict"))
            ):
                return _Node("tensor")
        elif name == "torch._utils._rebuild_parameter" and len(args) == 3:
            data, grad, hooks = args
            if (
                isinstance(data, _Node)
                and data.kind == "tensor"
                and isinstance(grad, bool)
                and isinstance(hooks, _Node)
                and hooks.kind == "dict"
            ):
                return _Node("tensor")
        elif name == "torch.Size" and len(args) == 1 and _ints(args[0]):
            return _Node("size")
        elif name == "torch.device" and (
            len(args) in (1, 2) and isinstance(args[0], str) and len(args[0]) <= 64
        ):
            if len(args) == 1 or _is_int(args[1]):
                return _Node("device")
        elif name == "_codecs.encode" and len(args) == 2 and args[1] == "latin1":
            if isinstance(args[0], str):
                return _Node("bytes", 0, len(args[0]))
        elif name == "builtins.bytearray" and (
            args == () or (len(args) == 1 and _is_bytes(args[0]))
        ):
            # Never bytearray(n): n bytes from four in the file.
            return _Node("bytearray")
        elif name == "builtins.set" and (
            args == () or (len(args) == 1 and isinstance(args[0], _Node) and args[0].kind == "list")
        ):
            return _Node("set", _depth(args))
        elif name == "builtins.complex" and len(args) == 2:
            if all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                return _Node("complex", 0)
        elif name in NUMPY_RECONSTRUCT and len(args) == 3:
            cls, shape, code = args
            if (
                isinstance(cls, _Global)
                and cls.name == "numpy.ndarray"
                and shape == (0,)
                and _is_bytes(code)
                and _bytes_len(code) == 1
            ):
                return _Node("ndarray")
        elif name == "numpy.dtype" and args == ("u4", False, True):
            return _Node("dtype")
        raise Refused(f"it calls {name} with arguments that global does not take", [])

    def build(self, target: Any, state: Any) -> None:
        if not isinstance(target, _Node) or target.built:
            raise Refused("it sets the state of something that takes none")
        if target.kind == "dict" and (
            state is None or (isinstance(state, _Node) and state.kind == "dict")
        ):
            # An OrderedDict's attributes (a module's _metadata).
            target.depth = max(target.depth, _depth(state) + 1)
        elif (target.kind == "dtype" and state == DTYPE_STATE) or (
            target.kind == "ndarray"
            and (
                isinstance(state, tuple)
                and len(state) == 5
                and state[0] == 1
                and isinstance(state[1], tuple)
                and len(state[1]) == 1
                and _is_int(state[1][0])
                and isinstance(state[2], _Node)
                and state[2].kind == "dtype"
                and state[3] is False
                and _is_bytes(state[4])
                and _bytes_len(state[4]) == 4 * state[1][0]
            )
        ):
            pass
        elif target.kind not in {"dict", "dtype", "ndarray", "tensor", "size", "device", "bytes",
                                 "bytearray", "set", "complex", "storage", "list"}:  # fmt: skip
            pass  # a caller's global: the caller vouches for it
        else:
            raise Refused(f"it sets the state of a {target.kind} to what that takes not")
        target.built = True

    def persistent(self, pid: Any) -> _Node:
        """A storage: ``('storage', torch.XStorage, key, location, numel)``, lying whole in
        its record ``data/key``."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise Refused("it names a persistent object that is not a storage")
        _, cls, key, location, numel = pid
        if not (isinstance(cls, _Global) and isinstance(key, str) and isinstance(location, str)):
            raise Refused("it names a storage wrongly")
        kind = cls.name.removeprefix("torch.").removesuffix("Storage")
        size = 1 if kind == "Untyped" else _STORAGES.get(kind)
        if size is None or not _is_int(numel) or numel < 0:
            raise Refused("it names a storage wrongly")
        record = self.records.get(f"data/{key}")
        if record is None or numel * size > record:
            raise Refused(
                f"it declares a storage of {numel * size} bytes where its record holds "
                f"{record or 0}"
            )
        self.storages[key] = numel * size
        self.spend(OBJECT_COST)
        return _Node("storage", 0)


def _ints(value: Any) -> bool:
    return isinstance(value, tuple) and all(_is_int(v) and v >= 0 for v in value)


def _is_bytes(value: Any) -> bool:
    return isinstance(value, bytes) or (isinstance(value, _Node) and value.kind == "bytes")


def _bytes_len(value: Any) -> int:
    return len(value) if isinstance(value, bytes) else int(value.value)


def scan(path: str | os.PathLike[str], allowed: Sequence[str] = ()) -> None:
    """Refuse (UnsafeCheckpoint) a checkpoint file that is not a torch zip of stored records,
    or whose pickle names a global not on ``LEGACY_GLOBALS`` or ``allowed``, calls one with
    arguments it does not take, declares a storage beyond its record, or would build more
    than the caps allow; IntegrityError when it is not a readable file at all. Nothing of
    the file is built."""
    where = os.fspath(path)
    with open(where, "rb") as f:
        magic = f.read(4)
    if magic[:1] == b"\x80":
        raise UnsafeCheckpoint(
            "refused to load: it is a torch.save file of the format before 1.6 (not a zip), "
            "which the weights-only loader does not read",
            url=where,
        )
    try:
        with zipfile.ZipFile(where) as archive:
            infos = archive.infolist()
            names = [i.filename for i in infos]
            prefixes = {n.split("/", 1)[0] for n in names}
            if len(set(names)) != len(names) or len(prefixes) != 1 or not names:
                raise Refused("its records are not one archive, each named once")
            prefix = prefixes.pop() + "/"
            if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
                raise Refused("it holds a compressed record (torch stores them whole)")
            records = {i.filename.removeprefix(prefix): i.file_size for i in infos}
            if records.get("data.pkl", MAX_PICKLE_BYTES + 1) > MAX_PICKLE_BYTES:
                raise Refused(f"its pickle is missing or larger than {MAX_PICKLE_BYTES >> 20} MiB")
            data = archive.read(prefix + "data.pkl")
    except Refused as exc:
        raise refusal(where, exc) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise IntegrityError(
            f"not a readable checkpoint ({type(exc).__name__})", url=where
        ) from None
    try:
        _Scan({*LEGACY_GLOBALS, *allowed}, records).run(data)
    except Refused as exc:
        raise refusal(where, exc) from None


def refusal(path: str, exc: Refused) -> UnsafeCheckpoint:
    if exc.names:
        # Names from a hostile file: escaped (ascii) before they reach a terminal.
        what = ", ".join(ascii(name)[1:-1] for name in exc.names[:5])
        return UnsafeCheckpoint(
            f"refused to load: it asks for {what}, which is not tensors or plain data "
            "(loading it could run code; nothing of it was run)",
            url=path,
            found=exc.names,
        )
    return UnsafeCheckpoint(f"refused to load: {exc.reason} (nothing of it was built)", url=path)
