"""Decoding into a place (an import in memory without a copy decodes each file into one buffer
of its own, so that tensors can be made of it without copying): every codec and every mode of
planes writes exactly the bytes its decode returns, into the place it is given and nowhere
else; every fault is refused as it is without a place; and the payload decoder places each
file's chunks where they lie in the file, checked by the file's sha256 as before."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from restorepoint import DecodeError, IntegrityError
from restorepoint.format import NoneCodec, PayloadDecoder, ZstdCodec, read_manifest
from restorepoint.format import codecs as planes
from restorepoint.format.codecs import decode_into
from restorepoint.format.decoder import PLACED_DEPTH

from .test_pipeline import budget_peaks
from .test_planes import CODEC, FAULTS, FILES, SAMPLE, _Bytes, anything, forged_object, weights


def into(codec: object, plain: bytes) -> memoryview:
    """``plain`` encoded by ``codec``, then decoded into a place of its own, checked to be
    that place's bytes, read-only."""
    stored = codec.encode(plain)  # type: ignore[attr-defined]
    place = memoryview(bytearray(len(plain) + 2))[1:-1]
    got = decode_into(codec, stored, len(plain), place)
    assert isinstance(got, memoryview) and got.readonly
    assert bytes(got) == bytes(place) == plain
    return got


@given(data=st.one_of(weights, anything))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_every_codec_decodes_into_its_place_what_it_decodes(data: bytes) -> None:
    for codec in (CODEC, NoneCodec(), ZstdCodec(1)):
        into(codec, data)


@pytest.mark.parametrize("numpy", [True, False])
def test_every_planes_mode_decodes_into_its_place(
    numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raw, whole zstd and planes chunks (the last both merged by numpy and by slices),
    beside bytes that must stay as they were."""
    monkeypatch.setattr(planes, "_NUMPY", [] if numpy else [None])
    monkeypatch.setattr(planes, "_NUMPY_MIN", 16)
    for name, plain in FILES.items():
        stored = CODEC.encode(plain)
        buffer = bytearray(b"\xaa" * (len(plain) + 8))
        got = decode_into(CODEC, stored, len(plain), memoryview(buffer)[4:-4])
        assert bytes(got) == plain, name
        assert buffer[:4] == buffer[-4:] == b"\xaa" * 4, name


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_every_fault_is_a_decode_error_with_a_place_too(name: str) -> None:
    stored, message = FAULTS[name]
    with pytest.raises(DecodeError, match=message):
        decode_into(CODEC, stored, len(SAMPLE), memoryview(bytearray(len(SAMPLE))))


def test_a_chunk_of_another_length_than_its_place_is_refused() -> None:
    with pytest.raises(DecodeError, match="decoded to 3 bytes, expected 4"):
        decode_into(NoneCodec(), b"abc", 3, memoryview(bytearray(4)))


def decode_placed(
    data: bytes, place: Callable[[object], memoryview | None] | None
) -> tuple[dict[str, list[memoryview]], list[str]]:
    head, manifest = read_manifest(_Bytes(data))
    stream = io.BytesIO(data)
    stream.seek(head.data_start)
    chunks: dict[str, list[memoryview]] = {}
    verified: list[str] = []
    for entry, chunk in PayloadDecoder(manifest, stream, threads=3, places=place).events():
        if chunk is None:
            verified.append(entry.path)
        else:
            assert isinstance(chunk, memoryview) and chunk.readonly
            chunks.setdefault(entry.path, []).append(chunk)
    return chunks, verified


def test_the_decoder_places_each_file_where_its_bytes_lie() -> None:
    """Every chunk is decoded into its place in its file's buffer and given as a view of it;
    a file of no bytes asks for no place; the files verify as without places."""
    files = {**FILES, "empty": b"", "big.bin": FILES["weights.bin"] * 3}
    buffers: dict[str, bytearray] = {}

    def place(entry: object) -> memoryview:
        path = entry.path  # type: ignore[attr-defined]
        buffers[path] = bytearray(entry.size)  # type: ignore[attr-defined]
        return memoryview(buffers[path])

    chunks, verified = decode_placed(forged_object(files), place)
    assert sorted(verified) == sorted(files)
    assert sorted(buffers) == sorted(p for p in files if files[p])
    for path, data in files.items():
        if data:
            assert bytes(buffers[path]) == data
            assert b"".join(chunks[path]) == data
    assert len(chunks["big.bin"]) > 2
    # A view of the place, not a copy: a change to the buffer is a change to the chunk.
    first = chunks["big.bin"][1]
    buffers["big.bin"][len(chunks["big.bin"][0])] ^= 0xFF
    assert first[0] == files["big.bin"][len(chunks["big.bin"][0])] ^ 0xFF


def test_placed_chunks_are_still_checked_by_the_files_digest() -> None:
    data = bytearray(forged_object(FILES))
    _, manifest = read_manifest(_Bytes(bytes(data)))
    assert manifest.payload is not None
    weights_entry = next(e for e in manifest.payload if e.path == "weights.bin")
    # A mantissa byte of the last chunk: the codec decodes it, the file's sha256 refuses it.
    data[weights_entry.offset + weights_entry.stored_size - 100] ^= 0x01
    with pytest.raises(IntegrityError):
        decode_placed(bytes(data), lambda e: memoryview(bytearray(e.size)))  # type: ignore[attr-defined]


def test_a_place_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="a place of"):
        decode_placed(forged_object(FILES), lambda e: memoryview(bytearray(3)))


def test_with_places_the_decoder_reads_ahead_within_its_deeper_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decoded bytes have their place whatever the depth, so the window is PLACED_DEPTH
    chunks per thread (stored bytes read ahead), never more; without places it stays 2."""
    peaks = budget_peaks(monkeypatch)
    files = {"big.bin": FILES["weights.bin"] * 30}
    data = forged_object(files)
    _, manifest = read_manifest(_Bytes(data))
    chunk = manifest.chunk_size
    assert len(files["big.bin"]) > 3 * PLACED_DEPTH * chunk
    chunks, _ = decode_placed(data, lambda e: memoryview(bytearray(e.size)))  # type: ignore[attr-defined]
    assert b"".join(chunks["big.bin"]) == files["big.bin"]
    assert max(peaks) <= PLACED_DEPTH * 3 * chunk
    peaks.clear()
    decode_placed(data, None)
    assert max(peaks) <= 2 * 3 * chunk
