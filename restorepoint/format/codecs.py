"""Payload codecs (spec section "Codecs"): small frozen dataclasses with validated parameters,
a dict round trip, and a registry by name.

A codec turns one chunk of plain bytes into its stored bytes and back. Decoding is bounded:
it never produces more than the chunk's declared plain length, whatever the stored bytes say,
so a decompression bomb costs nothing.

``planes`` chooses, chunk by chunk, how to store it: as is, as one zstd frame, or split into
byte planes (byte k of every W-byte element side by side) with each plane stored as is or as a
zstd frame. A one-byte mode at the start of each stored chunk says which. Float weights are
where this pays: the planes of sign and exponent compress about 2.8x, the mantissa planes not
at all, so they are stored as they are (docs/performance.md has the figures)."""

from __future__ import annotations

import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import zstandard

from .._posix import huge_buffer
from ..errors import DecodeError, MalformedManifest, UnsupportedFormat
from .limits import zstd_bound

__all__ = [
    "PLANES_FEATURE",
    "Codec",
    "Decoded",
    "NoneCodec",
    "PlanesCodec",
    "ZstdCodec",
    "codec_from_dict",
    "decode_into",
    "encode_raw_parts",
    "register_codec",
]

#: The required feature of restore points whose entries may use the planes codec.
PLANES_FEATURE = "planes/1"
#: A decoded chunk: bytes, or a read-only view of a buffer that nothing else references. A view
#: spares a copy of every chunk (a fresh 4 MiB buffer each: 30% fewer page faults in verify,
#: about 15% less time) and is as immutable to its consumer as bytes, which matters because a
#: chunk is handed out before its file's hash lane may have hashed it.
Decoded = bytes | memoryview


class Codec(Protocol):
    name: ClassVar[str]
    #: The required feature (spec section 12) an object must list to use this codec, or None.
    feature: ClassVar[str | None]

    def to_dict(self) -> dict[str, Any]: ...
    def encode(self, plain: bytes) -> bytes: ...
    def decode(self, stored: bytes, plain_length: int, *, held: bool = False) -> Decoded: ...
    def max_stored(self, plain_length: int) -> int: ...


@dataclass(frozen=True)
class NoneCodec:
    """Stored as is: the stored bytes are the plain bytes."""

    name: ClassVar[str] = "none"
    feature: ClassVar[str | None] = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoneCodec:
        _only_keys(data, {"name"})
        return cls()

    def encode(self, plain: bytes) -> bytes:
        return plain

    def decode(self, stored: bytes, plain_length: int, *, held: bool = False) -> bytes:
        if len(stored) != plain_length:
            raise DecodeError(f"stored chunk is {len(stored)} bytes, expected {plain_length}")
        return stored

    def max_stored(self, plain_length: int) -> int:
        return plain_length


_local = threading.local()


@dataclass(frozen=True)
class ZstdCodec:
    """One zstandard frame per chunk, with its content size, without zstd's own checksum (the
    payload's sha256 covers every byte, and a 32-bit frame checksum would add nothing)."""

    name: ClassVar[str] = "zstd"
    feature: ClassVar[str | None] = None
    level: int = 1

    def __post_init__(self) -> None:
        _check_level(self.level)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ZstdCodec:
        _only_keys(data, {"name", "level"})
        try:
            return cls(level=data.get("level", 1))
        except ValueError as exc:
            raise MalformedManifest(str(exc)) from exc

    def encode(self, plain: bytes) -> bytes:
        return bytes(_compressor(self.level).compress(plain))

    def decode(self, stored: bytes, plain_length: int, *, held: bool = False) -> bytes:
        return _zstd_decode(stored, plain_length)

    def max_stored(self, plain_length: int) -> int:
        return zstd_bound(plain_length)


# -- planes ---------------------------------------------------------------------------------

#: The mode byte that starts every stored chunk of the planes codec.
MODE_RAW = 0
MODE_ZSTD = 1
MODE_PLANES = 2
#: Element widths a planes chunk may declare (bf16/fp16, fp32/int32, fp64/int64).
PLANE_WIDTHS = (2, 4, 8)
#: Widths the writer's probe tries: checkpoints are fp32 and bf16/fp16; fp64 is rare.
PROBE_WIDTHS = (2, 4)
#: Mode, width and mask, and at most 3 more bytes per plane (a u32 length, at least one byte
#: saved by the frame after it): no stored chunk is longer than plain + 3 + 3 * 8.
PLANES_OVERHEAD = 3 + 3 * max(PLANE_WIDTHS)
_U32 = struct.Struct("<I")
#: The probe reads at most this many sample slices of this many bytes from a chunk: 64 KiB of
#: a 4 MiB chunk costs about 0.2 ms to try every mode on, 5% of encoding the chunk.
_SAMPLE_SLICES = 4
_SAMPLE_SLICE = 16 << 10
#: A part is compressed only when its sample shrinks by at least 1/32: mantissa planes of
#: trained weights shrink by 0.0%, exponent planes by 65%, JSON by half, so the threshold only
#: decides what is not worth a compression attempt.
_MIN_SAVING = 1 / 32


@dataclass(frozen=True)
class PlanesCodec:
    """Each chunk stored as is, as one zstd frame, or as byte planes (each as is or one zstd
    frame), whichever a probe of a sample of the chunk finds smallest. ``level`` is the zstd
    level of chunks compressed whole; byte planes are compressed for their entropy (few
    matches, small tables): no zstd level does better on them (docs/performance.md)."""

    name: ClassVar[str] = "planes"
    feature: ClassVar[str | None] = PLANES_FEATURE
    level: int = 1

    def __post_init__(self) -> None:
        _check_level(self.level)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanesCodec:
        _only_keys(data, {"name", "level"})
        try:
            return cls(level=data.get("level", 1))
        except ValueError as exc:
            raise MalformedManifest(str(exc)) from exc

    def encode(self, plain: bytes) -> bytes:
        return b"".join(encode_planes_parts(plain, self.level))

    def encode_parts(self, plain: bytes) -> list[bytes | memoryview]:
        """The stored bytes as pieces to write one after the other: a writer that does not
        seal them spares joining them (a copy of every chunk, and for a raw chunk the only
        one)."""
        return encode_planes_parts(plain, self.level)

    def decode(self, stored: bytes, plain_length: int, *, held: bool = False) -> Decoded:
        """``held``: the caller keeps the chunk (an import in memory), so a chunk of planes
        is merged into memory of its own in huge pages (``_merge``)."""
        return decode_planes(stored, plain_length, held=held)

    def max_stored(self, plain_length: int) -> int:
        return plain_length + PLANES_OVERHEAD


def split_planes(data: bytes | memoryview, width: int) -> list[bytes | memoryview]:
    """Byte plane k of ``data``: bytes k, k + W, k + 2W, ... of its first (len // W) * W bytes.

    Slicing bytes holds the GIL; numpy's shifts and copies release it, so a training thread
    or a second encoding thread runs beside them. numpy is used where a process has already
    imported it (a PyTorch run has) and never imported for this: in the CLI's pack, its
    import (45 ms idle, 0.2 s on loaded cores) cost more than the GIL did
    (docs/performance.md)."""
    count = len(data) // width
    numpy = sys.modules.get("numpy") if count >= _NUMPY_MIN else None
    if numpy is None:
        end = count * width
        if isinstance(data, memoryview):
            # A strided slice of a view is no buffer zstd or hashlib takes: copy each plane.
            return [data[k:end:width].tobytes() for k in range(width)]
        return [data[k:end:width] for k in range(width)]
    # Each element read as a little-endian integer of W bytes: plane k is the element shifted
    # right by 8k bits, narrowed to a byte. Shifts and narrowing copies of whole blocks are
    # vector loops, twice as fast as a strided byte copy (4.2 against 9.0 GB/s per core on
    # float32, docs/performance.md); a block (128 KiB of float32) stays in the core's cache.
    words = numpy.frombuffer(data, numpy.dtype(f"<u{width}"), count)
    planes = numpy.empty((width, count), numpy.uint8)
    shifted = numpy.empty(min(count, _BLOCK_ROWS), words.dtype)
    for start in range(0, count, _BLOCK_ROWS):
        block = words[start : start + _BLOCK_ROWS]
        end = start + len(block)
        numpy.copyto(planes[0, start:end], block, casting="unsafe")
        for k in range(1, width):
            scratch = shifted[: len(block)]
            numpy.right_shift(block, 8 * k, out=scratch)
            numpy.copyto(planes[k, start:end], scratch, casting="unsafe")
    return [memoryview(planes[k]).toreadonly() for k in range(width)]


def merge_planes(planes: list[bytes | memoryview], tail: bytes | memoryview) -> bytes:
    """The inverse of split_planes: interleave the planes, then append the tail."""
    width = len(planes)
    count = len(planes[0]) if planes else 0
    out = bytearray(count * width + len(tail))
    end = count * width
    for k, plane in enumerate(planes):
        out[k:end:width] = plane
    out[end:] = tail
    return bytes(out)


def _sample(plain: bytes) -> bytes:
    """Up to _SAMPLE_SLICES slices spread over the chunk, each starting at a multiple of 8 so
    that element boundaries (of widths 2, 4 and 8) stay where they are in the chunk."""
    if len(plain) <= _SAMPLE_SLICES * _SAMPLE_SLICE:
        return plain
    step = len(plain) // _SAMPLE_SLICES
    starts = [(i * step + (step - _SAMPLE_SLICE) // 2) & ~7 for i in range(_SAMPLE_SLICES)]
    return b"".join(plain[s : s + _SAMPLE_SLICE] for s in starts)


def _worth(stored: int, plain: int) -> bool:
    return stored < plain * (1 - _MIN_SAVING)


def encode_planes(plain: bytes, level: int) -> bytes:
    """The stored bytes of one chunk (spec section 7, codec planes)."""
    return b"".join(encode_planes_parts(plain, level))


def encode_planes_parts(plain: bytes, level: int) -> list[bytes | memoryview]:
    """The stored bytes of one chunk, in pieces: the probe tries zstd at ``level`` and byte
    planes of widths 2 and 4 on a sample, and the chunk is stored as the smallest, or as is
    when nothing saves 1/32."""
    sample = _sample(plain)
    whole = sample is plain
    frame = _compressor(level).compress(sample)
    best: tuple[int, int, int] = (len(frame) + 1, MODE_ZSTD, 0)
    plane_masks: dict[int, int] = {}
    for width in PROBE_WIDTHS:
        if len(sample) < 2 * width:
            continue
        size, mask = 3, 0
        for k, plane in enumerate(split_planes(sample, width)):
            packed = len(_plane_compressor().compress(plane))
            if _worth(packed + 4, len(plane)):
                size += packed + 4
                mask |= 1 << k
            else:
                size += len(plane)
        size += len(sample) % width
        plane_masks[width] = mask
        if mask and size < best[0]:
            best = (size, MODE_PLANES, width)
    size, mode, width = best
    if not _worth(size, len(sample)):
        return [_RAW, plain]
    if mode == MODE_ZSTD:
        if not whole:
            frame = _compressor(level).compress(plain)
        if len(frame) >= len(plain):
            return [_RAW, plain]
        return [_ZSTD, frame]
    return _planes_parts(plain, width, plane_masks[width])


_RAW = bytes([MODE_RAW])
_ZSTD = bytes([MODE_ZSTD])


def encode_raw_parts(plain: bytes) -> list[bytes | memoryview]:
    """The stored bytes of one chunk in mode 0 (raw), without a probe: what the adaptive
    chooser (format/adaptive.py) picks when compressing would slow the publish."""
    return [_RAW, plain]


def _encode_planes(plain: bytes, width: int, candidates: int) -> bytes:
    return b"".join(_planes_parts(plain, width, candidates))


def _planes_parts(plain: bytes, width: int, candidates: int) -> list[bytes | memoryview]:
    """Byte planes of ``width``; the planes in ``candidates`` compressed where that saves a
    byte (the spec requires it), the others stored as they are."""
    planes = split_planes(plain, width)
    parts: list[bytes | memoryview] = [b""]
    mask = 0
    for k, plane in enumerate(planes):
        if candidates >> k & 1:
            frame = _plane_compressor().compress(plane)
            if len(frame) < len(plane):
                mask |= 1 << k
                parts += [_U32.pack(len(frame)), frame]
                continue
        parts.append(plane)
    if not mask:
        return [_RAW, plain]
    parts.append(plain[len(plain) // width * width :])
    parts[0] = bytes([MODE_PLANES, width, mask])
    return parts


def decode_into(codec: Any, stored: bytes, plain_length: int, into: memoryview) -> Decoded:
    """One stored chunk decoded into ``into`` (writable, exactly ``plain_length`` bytes: its
    place in a buffer of its file's bytes), returned as a read-only view of it. A planes chunk
    is merged there straight (the merge is its one copy); any other chunk is decoded, then
    copied there."""
    if isinstance(codec, PlanesCodec):
        return decode_planes(stored, plain_length, into=into)
    return place(into, codec.decode(stored, plain_length))


def place(into: memoryview, data: Decoded) -> memoryview:
    """``data`` copied into ``into`` (as long), as a read-only view: numpy's copy, which
    releases the GIL, where the process has numpy and the chunk is not small."""
    if len(data) != len(into):
        raise DecodeError(f"a chunk decoded to {len(data)} bytes, expected {len(into)}")
    numpy = sys.modules.get("numpy") if len(data) >= _NUMPY_MIN else None
    if numpy is None:
        into[:] = data
    else:
        numpy.frombuffer(into, numpy.uint8)[:] = numpy.frombuffer(data, numpy.uint8)
    return into.toreadonly()


def decode_planes(  # noqa: PLR0912 - the decode steps of spec section 7, each with its own refusal
    stored: bytes, plain_length: int, *, held: bool = False, into: memoryview | None = None
) -> Decoded:
    """Decode one stored chunk of the planes codec into exactly ``plain_length`` bytes, or
    raise DecodeError. Every length is checked against the stored bytes and the plain length
    before anything is decoded; no frame may produce more than its plane's length. ``into``:
    where the plain bytes go (``decode_into``)."""
    if not stored:
        raise DecodeError("a planes chunk has no mode byte")
    mode = stored[0]
    view = memoryview(stored)
    if mode == MODE_RAW:
        if len(stored) != 1 + plain_length:
            raise DecodeError(
                f"a raw chunk stores {len(stored) - 1} bytes, expected {plain_length}",
                expected=plain_length,
                found=len(stored) - 1,
            )
        return view[1:] if into is None else place(into, view[1:])
    if mode == MODE_ZSTD:
        if len(stored) - 1 >= plain_length:
            raise DecodeError(
                f"a zstd chunk of {len(stored) - 1} bytes is not shorter than its "
                f"{plain_length} plain bytes"
            )
        whole = _zstd_decode(view[1:], plain_length)
        return whole if into is None else place(into, whole)
    if mode != MODE_PLANES:
        raise DecodeError(f"unknown chunk mode {mode}", found=mode)
    if len(stored) < 3:
        raise DecodeError("a planes chunk ends inside its header")
    width, mask = stored[1], stored[2]
    if width not in PLANE_WIDTHS:
        raise DecodeError(f"plane width {width} is not one of {PLANE_WIDTHS}", found=width)
    if mask >> width:
        raise DecodeError(f"plane mask {mask:#04x} names a plane beyond width {width}")
    count, rest = divmod(plain_length, width)
    pos = 3
    planes: list[Decoded] = []
    for k in range(width):
        if mask >> k & 1:
            if pos + 4 > len(stored):
                raise DecodeError(f"a planes chunk ends inside plane {k}'s length")
            (length,) = _U32.unpack_from(stored, pos)
            pos += 4
            if length >= count:
                raise DecodeError(
                    f"plane {k}'s frame of {length} bytes is not shorter than its {count} bytes"
                )
            if pos + length > len(stored):
                raise DecodeError(f"a planes chunk ends inside plane {k}")
            planes.append(_zstd_decode(view[pos : pos + length], count))
            pos += length
        else:
            if pos + count > len(stored):
                raise DecodeError(f"a planes chunk ends inside plane {k}")
            planes.append(view[pos : pos + count])
            pos += count
    if len(stored) - pos != rest:
        raise DecodeError(
            f"a planes chunk holds {len(stored) - pos} bytes after its planes, expected {rest}",
            expected=rest,
            found=len(stored) - pos,
        )
    return _merge(planes, view[pos:], count, width, held, into)


def _merge(  # noqa: PLR0913, PLR0917 - the planes, and where they go (held, into)
    planes: list[Decoded],
    tail: Decoded,
    count: int,
    width: int,
    held: bool = False,
    into: memoryview | None = None,
) -> Decoded:
    """The chunk: plane k back in its place (every width-th byte from byte k), then the tail.
    With numpy, strided copies that release the GIL, block by block: the merge is most of a
    planes decode, and holding the GIL in it left a reader's second core idle (verify, an
    import: 1.4 GB/s on two threads against 2.3 with numpy, docs/performance.md); into an
    uninitialised array, since every byte of it is written. Without numpy (it is no dependency
    of the format), slice assignments of a bytearray, which hold the GIL. numpy is imported at
    the first chunk that needs it, never by an object without planes."""
    end = count * width
    numpy = _numpy() if count >= _NUMPY_MIN else None
    if numpy is None:
        out = bytearray(end + len(tail))
        for k, plane in enumerate(planes):
            out[k:end:width] = plane
        out[end:] = tail
        return memoryview(out).toreadonly() if into is None else place(into, memoryview(out))
    # A chunk its caller holds (an import in memory keeps a file's chunks until its tensors
    # are made of them) is fresh memory whatever allocates it: a mapping of its own in huge
    # pages faults once per 2 MiB, not per 4 KiB, and goes back to the system with its last
    # view. A chunk that is let go at once (verify, an import to disk) reuses the allocator's
    # memory instead: a fresh mapping each time would fault every chunk in anew.
    # ``into``: the chunk's place in its file's bytes, where the merge writes it straight.
    fresh = into if into is not None else huge_buffer(end + len(tail)) if held else None
    array = (
        numpy.empty(end + len(tail), numpy.uint8)
        if fresh is None
        else numpy.frombuffer(fresh, numpy.uint8)
    )
    grid = array[:end].reshape(count, width)
    sources = [numpy.frombuffer(plane, numpy.uint8) for plane in planes]
    for start in range(0, count, _BLOCK_ROWS):
        block = grid[start : start + _BLOCK_ROWS]
        for k, source in enumerate(sources):
            block[:, k] = source[start : start + _BLOCK_ROWS]
    array[end:] = numpy.frombuffer(tail, numpy.uint8)
    return memoryview(array).toreadonly()


#: Below this many elements a slice assignment is as fast as numpy's call overhead.
_NUMPY_MIN = 1 << 14
#: Rows of the (elements, width) grid that the numpy merge copies at a time: blocks of 32 Ki
#: rows (128 KiB of a float32 chunk) stay in the core's cache, and cost 15% less CPU than one
#: strided copy of the whole chunk (2.3 against 1.9 GB/s per core, docs/performance.md).
_BLOCK_ROWS = 1 << 15
_NUMPY: list[Any] = []


def _numpy() -> Any:
    """numpy when it can be imported (once: about 45 ms), else None."""
    if not _NUMPY:
        try:
            import numpy

            _NUMPY.append(numpy)
        except ImportError:
            _NUMPY.append(None)
    return _NUMPY[0]


# -- zstd, shared ---------------------------------------------------------------------------


def _check_level(level: object) -> None:
    if not isinstance(level, int) or isinstance(level, bool) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an integer from -7 to 22, not {level!r}")


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # Compressors are not thread-safe; the pack pipeline compresses on a thread pool.
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    comp = cache.get(level)
    if comp is None:
        comp = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True
        )
    return comp


def _plane_compressor() -> zstandard.ZstdCompressor:
    """zstd tuned for byte planes: their gain is entropy, not repeats, so few and long matches
    (min_match 7, the smallest hash table) leave the literals to Huffman coding. On exponent
    planes of trained weights that is 2.9x at 1.2 GB/s, against 2.7x at 0.41 GB/s for level
    1 and 2.9x at 0.004 GB/s for level 19 (benchmarks/bench_planes.py)."""
    comp = getattr(_local, "plane_compressor", None)
    if comp is None:
        params = zstandard.ZstdCompressionParameters(
            write_checksum=0,
            write_content_size=1,
            strategy=zstandard.STRATEGY_FAST,
            window_log=17,
            hash_log=6,
            min_match=7,
            search_log=1,
            target_length=0,
        )
        comp = _local.plane_compressor = zstandard.ZstdCompressor(compression_params=params)
    return comp


def _zstd_decode(stored: bytes | memoryview, plain_length: int) -> bytes:
    """Exactly one zstd frame that declares and holds ``plain_length`` bytes, or DecodeError."""
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"not a zstd frame: {exc}") from exc
    if declared != plain_length:
        raise DecodeError(
            f"zstd frame declares {declared} bytes, expected {plain_length}",
            expected=plain_length,
            found=declared,
        )
    dec = getattr(_local, "decompressor", None)
    if dec is None:
        dec = _local.decompressor = zstandard.ZstdDecompressor()
    try:
        out = dec.decompress(stored, max_output_size=plain_length, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"zstd frame does not decode: {exc}") from exc
    if len(out) != plain_length:
        raise DecodeError(
            f"zstd frame decoded to {len(out)} bytes, expected {plain_length}",
            expected=plain_length,
            found=len(out),
        )
    return bytes(out)


_REGISTRY: dict[str, Any] = {
    NoneCodec.name: NoneCodec,
    PlanesCodec.name: PlanesCodec,
    ZstdCodec.name: ZstdCodec,
}


def register_codec(cls: Any) -> None:
    """Register a codec class (with ``name`` and ``from_dict``) for reading and writing."""
    _REGISTRY[cls.name] = cls


def codec_from_dict(data: Any) -> Codec:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise MalformedManifest("codec must be an object with a name")
    cls = _REGISTRY.get(data["name"])
    if cls is None:
        raise UnsupportedFormat(f"unknown codec {data['name']!r}")
    codec: Codec = cls.from_dict(data)
    return codec


def _only_keys(data: dict[str, Any], allowed: set[str]) -> None:
    extra = set(data) - allowed
    if extra:
        raise MalformedManifest(
            f"codec {data.get('name')!r} has unknown parameters {sorted(extra)}"
        )
