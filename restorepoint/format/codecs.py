"""Payload codecs (spec section "Codecs"): small frozen dataclasses with validated parameters,
a dict round trip, and a registry by name.

A codec turns one chunk of plain bytes into its stored bytes and back. Decoding is bounded:
it never produces more than the chunk's declared plain length, whatever the stored bytes say,
so a decompression bomb costs nothing."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import zstandard

from ..errors import DecodeError, MalformedManifest, UnsupportedFormat
from .limits import zstd_bound

__all__ = ["Codec", "NoneCodec", "ZstdCodec", "codec_from_dict", "register_codec"]


class Codec(Protocol):
    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...
    def encode(self, plain: bytes) -> bytes: ...
    def decode(self, stored: bytes, plain_length: int) -> bytes: ...
    def max_stored(self, plain_length: int) -> int: ...


@dataclass(frozen=True)
class NoneCodec:
    """Stored as is: the stored bytes are the plain bytes."""

    name: ClassVar[str] = "none"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoneCodec:
        _only_keys(data, {"name"})
        return cls()

    def encode(self, plain: bytes) -> bytes:
        return plain

    def decode(self, stored: bytes, plain_length: int) -> bytes:
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
    level: int = 1

    def __post_init__(self) -> None:
        if (
            not isinstance(self.level, int)
            or isinstance(self.level, bool)
            or not -7 <= self.level <= 22
        ):
            raise ValueError(f"zstd level must be an integer from -7 to 22, not {self.level!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ZstdCodec:
        _only_keys(data, {"name", "level"})
        try:
            return cls(level=data.get("level", 1))
        except ValueError as exc:
            raise MalformedManifest(str(exc)) from exc

    def _compressor(self) -> zstandard.ZstdCompressor:
        # Compressors are not thread-safe; the pack pipeline compresses on a thread pool.
        cache = getattr(_local, "compressors", None)
        if cache is None:
            cache = _local.compressors = {}
        comp = cache.get(self.level)
        if comp is None:
            comp = cache[self.level] = zstandard.ZstdCompressor(
                level=self.level, write_checksum=False, write_content_size=True
            )
        return comp

    def encode(self, plain: bytes) -> bytes:
        return bytes(self._compressor().compress(plain))

    def decode(self, stored: bytes, plain_length: int) -> bytes:
        try:
            declared = zstandard.frame_content_size(stored)
        except zstandard.ZstdError as exc:
            raise DecodeError(f"not a zstd frame: {exc}") from exc
        if declared != plain_length:
            raise DecodeError(
                f"zstd frame declares {declared} bytes, the chunk holds {plain_length}",
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

    def max_stored(self, plain_length: int) -> int:
        return zstd_bound(plain_length)


_REGISTRY: dict[str, Any] = {NoneCodec.name: NoneCodec, ZstdCodec.name: ZstdCodec}


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
