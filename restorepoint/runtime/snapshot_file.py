"""The runtime's snapshot file (spec section 26): a safetensors file whose tensors are every
tensor of the state, and whose ``__metadata__`` holds the rest of the state as canonical JSON
(the *structure*). Reading it parses JSON and safetensors only: no unpickler runs.

The structure is a tree of JSON values: null, true, false, strings, integers within
±(2**53-1) and arrays (Python lists) stand for themselves; every other value is a JSON object
with one tag member (and, for a tensor, its dtype and shape)::

    {"dict": [[key, value], ...]}            a dict, in its order; keys are strings or integers
    {"dict": [...], "metadata": value}       an OrderedDict with ``_metadata`` (a module's)
    {"tuple": [value, ...]}                  a tuple
    {"float": "0.001"}                       a float: its shortest round trip, or nan/inf/-inf
    {"int": "-18446744073709551615"}         an integer beyond ±(2**53-1)
    {"dtype": "F32", "shape": [2, 3], "tensor": "0"}    a tensor, by its name in the file

Tensor names are "0", "1", ... in the order the structure names them; each is named exactly
once, with the dtype and shape the file records for it.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from .._posix import HUGE_ADVICE, advise_huge_pages, populate
from ..errors import IntegrityError, MissingExtra, UsageError, at_url
from ..format._json import CanonicalizationError, canonical_dumps, strict_loads
from ..format.limits import MAX_SAFE_INTEGER
from ..ops._source import PiecesReader
from .held import Fill, Held, Share

__all__ = [
    "DTYPES",
    "MAX_INT_DIGITS",
    "MAX_STATE_DEPTH",
    "SNAPSHOT_FORMAT",
    "ImageReader",
    "SnapshotImage",
    "is_snapshot_file",
    "is_snapshot_head",
    "read_snapshot_file",
    "read_snapshot_held",
    "refuse",
    "write_snapshot_file",
]

#: ``__metadata__["format"]`` of every snapshot file.
SNAPSHOT_FORMAT = "restorepoint.snapshot/1"
#: How deep values nest in a snapshot (a dict in a dict counts two); an optimizer's state is 5.
#: Each level is three levels of the structure's JSON, which a reader limits to 64.
MAX_STATE_DEPTH = 16
#: The longest integer a structure spells as a string: 2**128 has 39 digits.
MAX_INT_DIGITS = 40
#: safetensors' own limit on the header, which holds the structure.
MAX_HEADER_BYTES = 100_000_000

#: torch dtype <-> safetensors dtype name: the dtypes a snapshot stores.
DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.complex64: "C64",
}
for _name, _code in (
    ("uint64", "U64"),
    ("uint32", "U32"),
    ("uint16", "U16"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code
_CODES = {code: dtype for dtype, code in DTYPES.items()}
_FLOAT = re.compile(r"-?(?:nan|inf|[0-9]+\.[0-9]+(?:e[-+][0-9]+)?|[0-9]+e[-+][0-9]+)")
_INT = re.compile(r"-?[1-9][0-9]*")


def _safetensors() -> Any:
    try:
        import safetensors
        import safetensors.torch
    except ImportError as exc:  # pragma: no cover - an install of the torch extra has it
        raise MissingExtra("safetensors", "torch", "a snapshot") from exc
    return safetensors


# -- what may be stored ------------------------------------------------------------------------


def refuse(where: str, value: Any) -> UsageError:
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return UsageError(
        f"cannot snapshot: the state at {where or '(root)'} is a {name}, which a snapshot does "
        "not store; make state_dict() return tensors and plain data (dict, list, tuple, str, "
        "int, float, bool, None) (docs/adapters.md, 'What a snapshot stores')"
    )


# -- writing -----------------------------------------------------------------------------------


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:  # noqa: PLR0911 - a case per node
    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = value
        return {"dtype": DTYPES[value.dtype], "shape": list(value.shape), "tensor": name}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if abs(value) <= MAX_SAFE_INTEGER else {"int": str(value)}
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, dict):
        node: dict[str, Any] = {
            "dict": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]
        }
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            node["metadata"] = _encode(meta, tensors)
        return node
    if isinstance(value, list):
        return [_encode(item, tensors) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, tensors) for item in value]}
    raise refuse("", value)  # storable() refused it already where the state was taken


class SnapshotImage:
    """A snapshot file's bytes as they lie in memory: the header, made once, and each tensor's
    memory in file order. The one layout of the snapshot file: ``write`` puts it in a file,
    ``open`` reads it as a stream (what a publish packs straight from the snapshot's copy in
    memory, with no file written and read back first), and both give the same bytes.

    The safetensors layout is made here rather than by safetensors' own writer, which needs
    numpy (torch's CPU wheel runs without it): an 8-byte little-endian header length, the
    header (canonical JSON, padded with spaces to a multiple of 8), then each tensor's bytes,
    read from its memory without a copy, widest dtype first so that every tensor starts
    aligned to its element size, and no gap between them."""

    def __init__(self, state: Any) -> None:
        """The image of ``state`` (as ``storable`` returned it); the tensors are referred to,
        not copied: they must not change while the image is read."""
        tensors: dict[str, torch.Tensor] = {}
        try:
            structure = canonical_dumps(_encode(state, tensors)).decode("utf-8")
        except CanonicalizationError as exc:
            raise UsageError(f"cannot snapshot: {exc}") from None
        order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), int(n)))
        header: dict[str, Any] = {
            "__metadata__": {"format": SNAPSHOT_FORMAT, "structure": structure}
        }
        offset = 0
        #: (address, size) of each tensor's bytes, in file order; the empty ones left out.
        self.regions: list[tuple[int, int]] = []
        for name in order:
            t = tensors[name]
            size = t.numel() * t.element_size()
            header[name] = {
                "data_offsets": [offset, offset + size],
                "dtype": DTYPES[t.dtype],
                "shape": list(t.shape),
            }
            offset += size
            if size:
                # Contiguous, on the CPU: storable made it so.
                self.regions.append((t.data_ptr(), size))
        raw = canonical_dumps(header)
        raw += b" " * (-len(raw) % 8)
        self.head = len(raw).to_bytes(8, "little") + raw
        #: The file's size in bytes.
        self.size = len(self.head) + offset
        # Held, so that the memory the regions name stays the tensors'.
        self._tensors = tensors

    def write(self, f: BinaryIO) -> None:
        """The whole file into ``f``, each tensor from its memory (no copy)."""
        f.write(self.head)
        for address, size in self.regions:
            f.write((ctypes.c_ubyte * size).from_address(address))

    def open(self) -> BinaryIO:
        """The file's bytes as a stream read from memory."""
        return cast(BinaryIO, ImageReader(self))


class ImageReader(PiecesReader):
    """A snapshot image read in order, each read one copy out of the tensors' memory into a
    read-only, bytes-like buffer of its own.

    One buffer per read, filled piece by piece: one copy of each byte, whatever tensors the
    read spans (measured: a third less CPU than a copy per piece joined; a view of a tensor's
    memory instead was slower while chunks were named, since the copy brings the chunk into
    the cache for the passes after it, and is no faster now: docs/performance.md). Neither its
    allocation nor the copies hold the GIL for long: torch.empty does not zero it (a
    bytearray's zero fill of 16 MiB held the GIL for about 9 ms, which the training thread
    waited out at its next operations), and ctypes.memmove runs without the GIL."""

    def __init__(self, image: SnapshotImage) -> None:
        super().__init__([image.head, *image.regions])
        self._image = image

    def allocate(self, size: int) -> tuple[int, memoryview]:
        buffer = torch.empty(size, dtype=torch.uint8)
        return buffer.data_ptr(), _view(buffer.data_ptr(), size, buffer)

    def fetch(self, into: int, address: int, length: int) -> None:
        ctypes.memmove(into, address, length)


def _view(address: int, size: int, owner: object) -> memoryview:
    """A read-only view of ``size`` bytes at ``address`` that keeps ``owner`` (what holds that
    memory) alive as long as the view or a slice of it lives. It is bytes-like to everything
    a pack does with a chunk (hashing, encoding, writing)."""
    array = (ctypes.c_char * size).from_address(address)
    array.owner = owner  # type: ignore[attr-defined]
    return memoryview(array).cast("B").toreadonly()


def write_snapshot_file(state: Any, path: Path) -> None:
    """Write ``state`` (as ``storable`` returned it) to ``path`` (``SnapshotImage.write``);
    the caller fsyncs and renames."""
    image = SnapshotImage(state)
    with open(path, "wb") as f:
        image.write(f)


# -- reading -----------------------------------------------------------------------------------


def is_snapshot_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is in the snapshot format rather than an older torch.save file (a
    zip, "PK"; or a bare pickle, whose ninth byte is its magic number's): by its first bytes
    (the header opens with "{" after its 8-byte length), never by its name."""
    with open(path, "rb") as f:
        return is_snapshot_head(f.read(9))


def is_snapshot_head(head: bytes) -> bool:
    """``is_snapshot_file`` on the first nine bytes of a file."""
    return len(head) == 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def _bad(path: str | os.PathLike[str], what: str) -> IntegrityError:
    return IntegrityError(f"not a sound snapshot: {what}", url=os.fspath(path))


class _Decoder:
    """Decodes the structure, checking it against the file's tensors (name: dtype, shape);
    ``load`` gives the value that stands in a tensor's place."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        tensors: Mapping[str, tuple[str, list[int]]],
        load: Callable[[str], Any] = str,
    ) -> None:
        self.path = path
        self.tensors = tensors
        self.load = load
        self.named: list[str] = []

    def value(self, node: Any, depth: int) -> Any:  # noqa: PLR0911, PLR0912 - a case per node
        if depth > MAX_STATE_DEPTH:
            raise _bad(self.path, f"the structure nests deeper than {MAX_STATE_DEPTH}")
        if node is None or isinstance(node, (bool, str)):
            return node
        if isinstance(node, int):
            return node
        if isinstance(node, list):
            return [self.value(item, depth + 1) for item in node]
        if not isinstance(node, dict):
            raise _bad(self.path, f"a {type(node).__name__} in the structure")
        keys = sorted(node)
        if keys == ["dtype", "shape", "tensor"]:
            return self.tensor(node)
        if keys == ["float"] and isinstance(node["float"], str):
            text = node["float"]
            if not _FLOAT.fullmatch(text) or repr(float(text)) != text:
                raise _bad(self.path, f"a float spelled {text!a}")
            return float(text)
        if keys == ["int"] and isinstance(node["int"], str):
            text = node["int"]
            if (
                not _INT.fullmatch(text)
                or len(text.lstrip("-")) > MAX_INT_DIGITS
                or abs(int(text)) <= MAX_SAFE_INTEGER
            ):
                raise _bad(self.path, f"an integer spelled {text[:50]!a}")
            return int(text)
        if keys == ["tuple"] and isinstance(node["tuple"], list):
            return tuple(self.value(item, depth + 1) for item in node["tuple"])
        if keys in (["dict"], ["dict", "metadata"]) and isinstance(node["dict"], list):
            out: dict[Any, Any] = {}
            for pair in node["dict"]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _bad(self.path, "a dict member that is not a [key, value] pair")
                key = self.value(pair[0], depth + 1)
                if isinstance(key, bool) or not isinstance(key, (str, int)) or key in out:
                    raise _bad(
                        self.path,
                        f"a dict key {ascii(key)[:50]} (not a string or integer, or twice)",
                    )
                out[key] = self.value(pair[1], depth + 1)
            if "metadata" in node:
                ordered: Any = OrderedDict(out)
                ordered._metadata = self.value(node["metadata"], depth + 1)
                return ordered
            return out
        raise _bad(self.path, f"an object with members {keys[:5]!a} in the structure")

    def tensor(self, node: Mapping[str, Any]) -> Any:
        name, dtype, shape = node["tensor"], node["dtype"], node["shape"]
        if not isinstance(name, str) or name != str(len(self.named)):
            raise _bad(self.path, f"tensor {name!a} named out of order")
        if name not in self.tensors:
            raise _bad(self.path, f"the structure names tensor {name}, which the file lacks")
        if [dtype, shape] != list(self.tensors[name]):
            raise _bad(
                self.path,
                f"tensor {name} is {dtype!a} {shape!a} in the structure and "
                f"{self.tensors[name][0]} {self.tensors[name][1]} in the file",
            )
        self.named.append(name)
        return self.load(name)


def read_snapshot_file(path: str | os.PathLike[str]) -> Any:
    """The state a snapshot file holds, every tensor read into memory of its own (nothing
    refers to the file afterwards).

    Raises IntegrityError (MalformedManifest for the structure's JSON) when the file is not a
    sound snapshot: not a safetensors file, another format, a structure that is not canonical
    JSON of the grammar above, or a tensor the structure and the file disagree about."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _bad(path, f"not a safetensors file ({ascii(str(exc))[1:-1][:200]})") from None
    _check_length(path, prefix, size)
    node, shapes = _checked(path, path)
    # Checked whole (safetensors checked the container, the structure was checked against it)
    # before a tensor is read.
    with open(path, "rb") as raw:
        length = int.from_bytes(raw.read(8), "little")
        if length > MAX_HEADER_BYTES:
            raise _bad(path, "its header length is beyond the file")

        def fill(offset: int, out: memoryview) -> int:
            raw.seek(offset)
            return raw.readinto(out) or 0

        reader = _Reader(path, raw.read(length), shapes, fill)
        return _Decoder(path, shapes, reader.tensor).value(node, 0)


def read_snapshot_held(name: str, data: Held) -> Any:
    """The state of a snapshot file held in memory (``name`` is what errors call it), checked
    exactly as ``read_snapshot_file`` checks a file: safetensors checks the container on the
    header alone (a file of the header and a hole as long as the tensors' bytes, so nothing
    is copied for it), the structure is checked against it, and only then is a tensor made.
    Every tensor gets memory of its own, made in the order of its bytes, and the bytes are
    forgotten as they are copied: the held bytes and the state are never both held whole."""
    prefix = data.read(0, 8)
    _check_length(name, prefix, data.size)
    length = int.from_bytes(prefix, "little")
    header = data.read(8, 8 + length)
    with _header_file(prefix + header, data.size) as path:
        node, shapes = _checked(name, path)

    with Fill(data) as fill:
        reader = _Reader(name, header, shapes, fill, getattr(data, "share", None))
        made: dict[str, torch.Tensor] = {}
        for tensor in sorted(shapes, key=reader.begin):
            made[tensor] = reader.tensor(tensor)
            data.forget(reader.end(tensor))
    data.forget(data.size)
    return _Decoder(name, shapes, made.__getitem__).value(node, 0)


def _check_length(path: str | os.PathLike[str], prefix: bytes, size: int) -> None:
    if len(prefix) < 8 or int.from_bytes(prefix, "little") > min(MAX_HEADER_BYTES, size - 8):
        raise _bad(path, "its header length is beyond the file")


@contextmanager
def _header_file(header: bytes, size: int) -> Iterator[str]:
    """A file holding ``header`` and then a hole up to ``size`` bytes: what safetensors opens
    to check a container whose bytes are in memory (it maps the file and reads the header;
    the hole costs neither memory nor disk). In memory where the system can (memfd), else a
    temporary file."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("restorepoint-snapshot-header", os.MFD_CLOEXEC)
        try:
            view = memoryview(header)
            while view:
                view = view[os.write(fd, view) :]
            os.ftruncate(fd, size)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(prefix="restorepoint-header-") as f:  # pragma: no cover
        f.write(header)
        f.truncate(size)
        f.flush()
        yield f.name


def _checked(
    shown: str | os.PathLike[str], path: str | os.PathLike[str]
) -> tuple[Any, dict[str, tuple[str, list[int]]]]:
    """The container (safetensors opens ``path``), its format and the structure against its
    tensors, checked; the structure's JSON and each tensor's dtype and shape. ``shown`` is
    what errors call the file."""
    safetensors = _safetensors()
    try:
        handle = safetensors.safe_open(os.fspath(path), framework="pt", device="cpu")
    except FileNotFoundError:
        raise
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise _bad(shown, f"not a safetensors file ({ascii(first)[1:-1]})") from None
    with handle as f:
        metadata = f.metadata() or {}
        if sorted(metadata) != ["format", "structure"] or metadata["format"] != SNAPSHOT_FORMAT:
            found = ascii(metadata.get("format"))[:60]
            raise _bad(shown, f"its format is {found}, not {SNAPSHOT_FORMAT}")
        shapes: dict[str, tuple[str, list[int]]] = {}
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            view = f.get_slice(name)
            shapes[name] = (view.get_dtype(), list(view.get_shape()))
        with at_url(os.fspath(shown)):
            node = strict_loads(metadata["structure"].encode("utf-8"), "snapshot structure")
        checked = _Decoder(shown, shapes)
        checked.value(node, 0)
        extra = sorted(set(shapes) - set(checked.named), key=lambda n: (len(n), n))
        if extra:
            raise _bad(
                shown,
                f"the file holds tensor {ascii(extra[0])[1:-1]}, which the structure does not name",
            )
    return node, shapes


class _Reader:
    """Each tensor read into memory of its own, by its offsets in the header that safetensors
    has checked. Not a mapping of the file: an optimizer's load_state_dict keeps the tensors
    it is given, and training state backed by the file would change if the file were
    rewritten in place (cp, rsync --inplace), or fault (SIGBUS) if it were truncated; and
    faulting a mapping in page by page is several times slower than reading it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: bytes,
        shapes: Mapping[str, tuple[str, list[int]]],
        fill: Callable[[int, memoryview], int],
        share: Share | None = None,
    ) -> None:
        self.path, self.shapes, self.fill, self.share = path, shapes, fill, share
        self.base = 8 + len(header)
        try:
            self.header = json.loads(header)
        except (ValueError, RecursionError):
            raise _bad(path, "its header changed while it was read") from None

    def _offsets(self, name: str) -> tuple[int, int]:
        entry = self.header.get(name) if isinstance(self.header, dict) else None
        begin, end = (entry.get("data_offsets") if isinstance(entry, dict) else None) or (0, 0)
        return (begin, end) if isinstance(begin, int) and isinstance(end, int) else (0, 0)

    def begin(self, name: str) -> int:
        return self._offsets(name)[0]

    def end(self, name: str) -> int:
        """Where the tensor's bytes end, from the start of the file."""
        return self.base + self._offsets(name)[1]

    def tensor(self, name: str) -> torch.Tensor:
        # Checked again on what this open of the file says (it may have been replaced since
        # safetensors read it): the bytes read are exactly the tensor's.
        entry = self.header.get(name) if isinstance(self.header, dict) else None
        dtype, shape = self.shapes[name]
        if not isinstance(entry, dict) or [entry.get("dtype"), entry.get("shape")] != [
            dtype,
            shape,
        ]:
            raise _bad(self.path, "its header changed while it was read")
        code = _CODES[dtype]
        begin, end = entry.get("data_offsets") or (None, None)
        size = math.prod(shape) * code.itemsize
        if not (
            isinstance(begin, int) and isinstance(end, int) and begin >= 0 and end - begin == size
        ):
            raise _bad(self.path, "its header changed while it was read")
        shared = self._shared(code, shape, self.base + begin, size)
        if shared is not None:
            return shared
        t = torch.empty(shape, dtype=code)
        if size >= HUGE_ADVICE:
            advise_huge_pages(t.data_ptr(), size)
        else:
            # Huge pages cannot back it: its pages faulted in by one call, not one by one.
            populate(t.data_ptr(), size)
        if size:
            view = memoryview((ctypes.c_ubyte * size).from_address(t.data_ptr())).cast("B")
            if self.fill(self.base + begin, view) != size:
                raise _bad(self.path, f"tensor {name} is cut short")
        return t

    def _shared(
        self, dtype: torch.dtype, shape: list[int], start: int, size: int
    ) -> torch.Tensor | None:
        """A tensor of ``dtype`` and ``shape`` made of the held bytes themselves, without a
        copy, where the held bytes can be shared (``Contents.share``); at an address its
        elements may not lie at (not a multiple of their size), a copy of them. Its memory is
        the buffer the import decoded into. When the last tensor that refers to that memory
        goes (a model's, once the model has copied it into its parameters), its whole pages
        are given back to the system."""
        if self.share is None or not size:
            return None
        try:
            got = self.share(start, start + size)
        except ValueError:  # safetensors refuses overlapping tensors: defence in depth
            raise _bad(self.path, "two of its tensors share bytes") from None
        if got is None:
            return None
        view, release = got
        t = torch.frombuffer(view, dtype=dtype).reshape(shape)
        if t.data_ptr() % dtype.itemsize:
            return t.clone()  # misaligned: a copy, as a fill would make (the view goes)
        if release is not None:
            weakref.finalize(view, release).atexit = False
        return t
