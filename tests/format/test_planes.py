"""The planes codec (spec section 7): byte planes round trip bit for bit, the probe chooses what
it should, decoding is bounded, every fault is refused with its class, and on real trained
weights it packs smaller than zstd alone."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import restorepoint
from restorepoint import DecodeError, IntegrityError, MalformedManifest, UnsupportedFormat
from restorepoint.format import (
    PLANES_FEATURE,
    PayloadDecoder,
    PlanesCodec,
    Writer,
    ZstdCodec,
    codec_from_dict,
    read_head,
    read_manifest,
)
from restorepoint.format import codecs as planes
from restorepoint.format import manifest as manifest_module
from restorepoint.ops.pack import describe
from restorepoint.testing import ForgedEntry, Parts, assemble
from restorepoint.testing.weights import write_checkpoint

CODEC = PlanesCodec(1)
CHUNK = 65536


def floats32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


#: Weights-like float32: small magnitudes, so the exponent bytes repeat and compress.
weights = st.lists(
    st.floats(min_value=-2.0, max_value=2.0, width=32, allow_nan=False), max_size=5000
).map(floats32)
#: Any bytes, of any length (not a multiple of the width, too).
anything = st.binary(max_size=20000)


def modes(stored: bytes) -> tuple[int, ...]:
    """The mode byte, and for planes its width and mask."""
    return (stored[0], stored[1], stored[2]) if stored[0] == planes.MODE_PLANES else (stored[0],)


# -- the transform ---------------------------------------------------------------------------


def test_plane_k_holds_byte_k_of_every_element_and_the_tail_stays_last() -> None:
    data = bytes(range(18))
    assert planes.split_planes(data, 4) == [
        bytes([0, 4, 8, 12]),
        bytes([1, 5, 9, 13]),
        bytes([2, 6, 10, 14]),
        bytes([3, 7, 11, 15]),
    ]
    stored = planes._encode_planes(data * 1000 + bytes([16, 17]), 4, 0b1000)
    assert modes(stored)[:2] == (planes.MODE_PLANES, 4)
    assert stored.endswith(bytes([16, 17]))


@given(data=anything | weights, width=st.sampled_from(planes.PLANE_WIDTHS))
def test_merge_undoes_split(data: bytes, width: int) -> None:
    split = planes.split_planes(data, width)
    assert {len(p) for p in split} <= {len(data) // width}
    assert planes.merge_planes(list(split), data[len(data) // width * width :]) == data


@pytest.mark.parametrize("width", planes.PLANE_WIDTHS)
@pytest.mark.parametrize("offset", [0, 1])
def test_numpys_split_is_the_slices_split(width: int, offset: int) -> None:
    """Where the process has numpy, a large chunk is split by shifts of little-endian words
    narrowed to bytes: each plane is byte k of every element, as the slices make it, for
    every width, with a tail, from memory aligned or not (a view one byte in)."""
    pytest.importorskip("numpy")
    size = (3 << 20) // width * width + width - 1  # past a block of rows, and a tail
    data = os.urandom(size + offset)[offset:]
    view = memoryview(bytearray(b"\0" * offset + data))[offset:].toreadonly()
    end = size // width * width
    expected = [data[k:end:width] for k in range(width)]
    assert len(data) // width >= planes._NUMPY_MIN
    for source in (data, view):
        assert [bytes(p) for p in planes.split_planes(source, width)] == expected
    tail = data[end:]
    assert planes.merge_planes(planes.split_planes(data, width), tail) == data


# -- round trips -----------------------------------------------------------------------------


@given(data=anything | weights)
@settings(max_examples=300)
def test_decode_of_encode_is_the_identity(data: bytes) -> None:
    stored = CODEC.encode(data)
    assert len(stored) <= CODEC.max_stored(len(data))
    assert CODEC.decode(stored, len(data)) == data


@given(data=anything | weights)
def test_the_pieces_a_writer_writes_are_the_stored_bytes(data: bytes) -> None:
    parts = CODEC.encode_parts(data)
    assert b"".join(parts) == CODEC.encode(data)
    if parts[0] == bytes([planes.MODE_RAW]):
        assert parts[1] is data  # stored as it is: not even a copy


@given(data=anything | weights)
def test_a_read_only_view_encodes_as_its_bytes_do(data: bytes) -> None:
    # A publish from memory hands the codec views of the snapshot's memory, not bytes: small
    # chunks (whose planes are sliced, not copied by numpy) and large ones encode alike.
    view = memoryview(bytearray(data)).toreadonly()
    assert b"".join(CODEC.encode_parts(view)) == CODEC.encode(data)
    assert [bytes(p) for p in planes.split_planes(view, 4)] == [
        bytes(p) for p in planes.split_planes(data, 4)
    ]


@given(
    data=anything | weights,
    width=st.sampled_from(planes.PLANE_WIDTHS),
    candidates=st.integers(0, 255),
)
@settings(max_examples=300)
def test_every_width_and_mask_round_trips(data: bytes, width: int, candidates: int) -> None:
    stored = planes._encode_planes(data, width, candidates & ((1 << width) - 1))
    assert len(stored) <= CODEC.max_stored(len(data))
    assert CODEC.decode(stored, len(data)) == data


@given(data=anything, width=st.sampled_from(planes.PLANE_WIDTHS))
def test_planes_stored_as_they_are_round_trip(data: bytes, width: int) -> None:
    # A writer never makes a planes chunk without a compressed plane, but a reader reads one.
    end = len(data) // width * width
    stored = bytes([planes.MODE_PLANES, width, 0]) + b"".join(planes.split_planes(data, width))
    assert CODEC.decode(stored + data[end:], len(data)) == data


@given(level=st.integers(-7, 22))
def test_the_codec_object_round_trips_and_the_level_only_says_how(level: int) -> None:
    codec = codec_from_dict({"level": level, "name": "planes"})
    assert codec == PlanesCodec(level)
    assert codec.to_dict() == {"level": level, "name": "planes"}
    data = floats32([0.001 * i for i in range(3000)])
    assert PlanesCodec(1).decode(codec.encode(data), len(data)) == data


@pytest.mark.parametrize(
    "value",
    [
        {"level": 1, "name": "planes", "width": 4},
        {"level": 23, "name": "planes"},
        {"level": "1", "name": "planes"},
        {"level": True, "name": "planes"},
    ],
)
def test_codec_objects_are_closed_and_checked(value: dict[str, Any]) -> None:
    with pytest.raises(MalformedManifest):
        codec_from_dict(value)


# -- the probe -------------------------------------------------------------------------------


def test_incompressible_chunks_are_stored_as_they_are() -> None:
    data = os.urandom(1 << 20)
    stored = CODEC.encode(data)
    assert modes(stored) == (planes.MODE_RAW,)
    assert len(stored) == len(data) + 1


def test_text_is_compressed_whole() -> None:
    data = b'{"step": 1500, "loss": 0.25, "lr": 0.0003}\n' * 3000
    stored = CODEC.encode(data)
    assert modes(stored) == (planes.MODE_ZSTD,)
    assert len(stored) < len(data) // 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights") / "checkpoint"
    sizes = write_checkpoint(root)
    assert sum(sizes.values()) > 130 << 20
    return root


def chunks_of(path: Path, size: int = 4 << 20) -> list[bytes]:
    data = path.read_bytes()
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_the_probe_splits_float32_weights_in_four_and_bfloat16_in_two(checkpoint: Path) -> None:
    fp32 = [modes(CODEC.encode(c)) for c in chunks_of(checkpoint / "model" / "encoder.pt")]
    bf16 = [modes(CODEC.encode(c)) for c in chunks_of(checkpoint / "model-bf16" / "encoder.pt")]
    # Every full chunk of tensor data: byte planes, and the sign-and-exponent plane (the last,
    # little-endian) compressed; the mantissa planes of float32 stay as they are.
    assert all(m[:2] == (planes.MODE_PLANES, 4) and m[2] & 0b1000 for m in fp32[1:-1]), fp32
    assert sum(m[2] == 0b1000 for m in fp32) >= len(fp32) - 3
    assert all(m == (planes.MODE_PLANES, 2, 0b10) for m in bf16[1:-1]), bf16


def test_real_weights_round_trip_bit_for_bit(checkpoint: Path) -> None:
    for path in sorted(checkpoint.rglob("*.pt")):
        for chunk in chunks_of(path):
            assert CODEC.decode(CODEC.encode(chunk), len(chunk)) == chunk


@pytest.mark.parametrize("width", [2, 4])
def test_numpy_and_slices_merge_the_same_bytes(
    checkpoint: Path, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large chunks are merged with numpy (the GIL released, block by block, into an
    uninitialised array), small ones and a process without numpy by slices of a bytearray:
    the same plain bytes either way. Lengths with a tail, and past a block of rows."""
    pytest.importorskip("numpy")
    data = (checkpoint / ("model" if width == 4 else "model-bf16") / "encoder.pt").read_bytes()
    rows = planes._NUMPY_MIN + planes._BLOCK_ROWS + 7
    for n in (rows * width, rows * width + width - 1, 4 << 20):
        chunk = data[:n]
        parts = planes._planes_parts(chunk, width, (1 << width) - 1)
        assert parts[0][0] == planes.MODE_PLANES
        stored = b"".join(parts)
        for numpy in (True, False):
            monkeypatch.setattr(planes, "_NUMPY", [] if numpy else [None])
            decoded = planes.decode_planes(stored, n)
            assert isinstance(decoded, memoryview) and decoded.readonly
            assert decoded == chunk


@pytest.mark.parametrize("width", [2, 4, 8])
def test_numpy_and_slices_split_the_same_planes(
    checkpoint: Path, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the process has numpy already (a PyTorch run), large chunks are split with
    numpy's strided copies, which release the GIL, block by block; elsewhere by slices of
    bytes: the same planes, and the same stored bytes, either way. Lengths with a tail, and
    past a block of rows."""
    numpy = pytest.importorskip("numpy")
    data = (checkpoint / "model" / "encoder.pt").read_bytes()
    rows = planes._NUMPY_MIN + planes._BLOCK_ROWS + 7
    for n in (rows * width, rows * width + width - 1, 4 << 20):
        chunk = data[:n]
        end = n // width * width
        expected = [chunk[k:end:width] for k in range(width)]
        monkeypatch.setitem(sys.modules, "numpy", numpy)
        split = planes.split_planes(chunk, width)
        assert all(isinstance(p, memoryview) and p.readonly for p in split)
        assert [bytes(p) for p in split] == expected
        with_numpy = b"".join(planes._planes_parts(chunk, width, (1 << width) - 1))
        monkeypatch.delitem(sys.modules, "numpy")
        assert planes.split_planes(chunk, width) == expected
        assert b"".join(planes._planes_parts(chunk, width, (1 << width) - 1)) == with_numpy
        assert planes.decode_planes(with_numpy, n) == chunk


def test_the_split_never_imports_numpy() -> None:
    """A process without numpy loaded (the CLI's pack) splits by slices and does not import
    it: its import costs the pack more than the GIL does (docs/performance.md)."""
    code = (
        "import sys, restorepoint.format.codecs as c\n"
        "data = bytes(range(256)) * (1 << 14)\n"
        "assert len(c.split_planes(data, 4)[0]) == len(data) // 4\n"
        "c.encode_planes_parts(data, 1)\n"
        "print('numpy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "False"


def test_real_weights_pack_smaller_than_with_zstd_alone(checkpoint: Path, tmp_path: Path) -> None:
    sizes = {}
    for name in ("model", "model-bf16"):
        for codec in ("auto", "zstd"):
            result = restorepoint.pack(
                checkpoint / name, str(tmp_path / f"{name}-{codec}.rp"), position=0, codec=codec
            )
            sizes[name, codec] = result.size
            report = restorepoint.verify(str(tmp_path / f"{name}-{codec}.rp"))
            assert report.bytes == result.bytes
    # Measured with zstandard 0.25: float32 1.217x against 1.092x, bfloat16 1.489x against
    # 1.282x; the bounds leave room for another zstd release.
    assert sizes["model", "auto"] < 0.93 * sizes["model", "zstd"]
    assert sizes["model-bf16", "auto"] < 0.90 * sizes["model-bf16", "zstd"]


def test_the_whole_checkpoint_is_at_least_ten_percent_smaller(
    checkpoint: Path, tmp_path: Path
) -> None:
    auto = restorepoint.pack(checkpoint, str(tmp_path / "auto.rp"), position=0)
    zstd = restorepoint.pack(checkpoint, str(tmp_path / "zstd.rp"), position=0, codec="zstd")
    assert auto.size < 0.9 * zstd.size
    assert auto.manifest.required_features == (PLANES_FEATURE,)
    assert restorepoint.verify(str(tmp_path / "auto.rp")).digest == auto.digest


# -- faults ----------------------------------------------------------------------------------

SAMPLE = floats32([((i * 7919) % 2000 - 1000) / 4096 for i in range(4096)]) + b"tail!"
GOOD = planes._encode_planes(SAMPLE, 4, 0b1100)


def test_the_sample_is_a_planes_chunk_with_two_compressed_planes() -> None:
    assert modes(GOOD) == (planes.MODE_PLANES, 4, 0b1100)
    assert CODEC.decode(GOOD, len(SAMPLE)) == SAMPLE


def _frame_of(plane: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(plane)


def _planes_chunk(parts: list[bytes], width: int = 4, mask: int = 0b1000) -> bytes:
    return bytes([planes.MODE_PLANES, width, mask]) + b"".join(parts)


COUNT = len(SAMPLE) // 4
RAW = planes.split_planes(SAMPLE, 4)
FRAME3 = _frame_of(RAW[3])
TAIL = SAMPLE[4 * COUNT :]

FAULTS: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "no mode byte"),
    "unknown mode": (b"\x03" + SAMPLE, "unknown chunk mode 3"),
    "raw one byte short": (b"\x00" + SAMPLE[:-1], "a raw chunk stores"),
    "raw one byte long": (b"\x00" + SAMPLE + b"x", "a raw chunk stores"),
    "zstd not shorter": (b"\x01" + SAMPLE, "not shorter than its"),
    "zstd declares another size": (
        b"\x01" + _frame_of(SAMPLE[:-1]),
        "zstd frame declares",
    ),
    "zstd trailing byte": (b"\x01" + _frame_of(SAMPLE) + b"\x00", "does not decode"),
    "header cut": (bytes([planes.MODE_PLANES, 4]), "ends inside its header"),
    "width 3": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3, TAIL], 3),
        "width",
    ),
    "width 0": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3, TAIL], 0),
        "width",
    ),
    "width 16": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3, TAIL], 16),
        "width",
    ),
    "mask beyond width": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3, TAIL], 4, 0b11000),
        "beyond width",
    ),
    "raw plane cut": (_planes_chunk([RAW[0], RAW[1][:10]], 4, 0), "ends inside plane 1"),
    "length cut": (_planes_chunk([*RAW[:3], b"\x01\x00"]), "inside plane 3's length"),
    "frame cut": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3[:-3]]),
        "ends inside plane 3",
    ),
    "frame not shorter than its plane": (
        _planes_chunk([*RAW[:3], struct.pack("<I", COUNT), RAW[3], TAIL]),
        "not shorter than its",
    ),
    "frame of another plane length": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(f := _frame_of(RAW[3][:-1]))), f, TAIL]),
        "zstd frame declares",
    ),
    "frame not zstd": (
        _planes_chunk([*RAW[:3], struct.pack("<I", 100), b"\x00" * 100, TAIL]),
        "not a zstd frame",
    ),
    "tail missing": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3]),
        "after its planes",
    ),
    "tail long": (
        _planes_chunk([*RAW[:3], struct.pack("<I", len(FRAME3)), FRAME3, TAIL + b"!"]),
        "after its planes",
    ),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_every_fault_is_a_decode_error(name: str) -> None:
    stored, message = FAULTS[name]
    with pytest.raises(DecodeError, match=message):
        CODEC.decode(stored, len(SAMPLE))


@given(offset=st.integers(0, len(GOOD) - 1), mask=st.integers(1, 255))
@settings(max_examples=500)
def test_a_flipped_byte_is_refused_or_decodes_to_the_plain_length(offset: int, mask: int) -> None:
    """The codec alone cannot tell a flipped mantissa byte (the file's sha256 does, R10); what
    it must never do is produce another length, or fail with anything but DecodeError."""
    damaged = bytearray(GOOD)
    damaged[offset] ^= mask
    try:
        out = CODEC.decode(bytes(damaged), len(SAMPLE))
    except DecodeError:
        return
    assert len(out) == len(SAMPLE)


@given(cut=st.integers(0, len(GOOD) - 1))
def test_every_truncation_is_refused(cut: int) -> None:
    with pytest.raises(DecodeError):
        CODEC.decode(GOOD[:cut], len(SAMPLE))


# -- corruption through the reader: never accepted with wrong bytes ---------------------------


def forged_object(files: dict[str, bytes]) -> bytes:
    parts = Parts.sample(files={})
    parts.head["required_features"] = [PLANES_FEATURE]
    parts.entries = [
        ForgedEntry.from_bytes(p, files[p], codec=CODEC.to_dict(), chunk_size=CHUNK)
        for p in sorted(files)
    ]
    return assemble(parts)


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def size(self) -> int:
        return len(self.data)

    def read_range(self, start: int, end: int) -> bytes:
        return self.data[start:end]


def read_all(data: bytes) -> dict[str, bytes]:
    head, manifest = read_manifest(_Bytes(data))
    stream = io.BytesIO(data)
    stream.seek(head.data_start)
    out: dict[str, list[bytes]] = {}
    for entry, chunk in PayloadDecoder(manifest, stream, threads=2).events():
        parts = out.setdefault(entry.path, [])
        if chunk is not None:
            parts.append(chunk)
    return {path: b"".join(parts) for path, parts in out.items()}


FILES = {
    "weights.bin": floats32([((i * 104729) % 5000 - 2500) / 8192 for i in range(20000)]),
    "state.json": b'{"step": 1500, "lr": 0.0003}\n' * 40,
    "noise.bin": b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(100)),
}
OBJECT = forged_object(FILES)


def test_the_forged_object_reads_back_and_uses_every_mode() -> None:
    assert read_all(OBJECT) == FILES
    found = {modes(CODEC.encode(FILES["weights.bin"][i : i + CHUNK]))[0] for i in (0, CHUNK)}
    found.add(modes(CODEC.encode(FILES["state.json"]))[0])
    found.add(modes(CODEC.encode(FILES["noise.bin"]))[0])
    assert found == {planes.MODE_RAW, planes.MODE_ZSTD, planes.MODE_PLANES}


@given(position=st.integers(0, 10**9), mask=st.integers(1, 255))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_a_flipped_stored_byte_is_never_accepted(position: int, mask: int) -> None:
    _, manifest = read_manifest(_Bytes(OBJECT))
    assert manifest.payload is not None
    start = manifest.payload[0].offset
    end = start + sum(e.stored_size for e in manifest.payload)
    damaged = bytearray(OBJECT)
    damaged[start + position % (end - start)] ^= mask
    with pytest.raises(IntegrityError):
        read_all(bytes(damaged))


# -- bounded decoding ------------------------------------------------------------------------


def _traced(stored: bytes, plain_length: int) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError):
            CODEC.decode(stored, plain_length)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_plane_that_declares_a_bomb_is_refused_before_it_is_decoded() -> None:
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    stored = _planes_chunk([*RAW[:3], struct.pack("<I", len(bomb)), bomb, TAIL])
    assert len(bomb) < COUNT
    assert _traced(stored, len(SAMPLE)) < 1 << 20


def test_a_plane_that_hides_a_bomb_stops_at_its_plane_length() -> None:
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    assert bomb[4] >> 6 == 2  # a 4-byte content size after the descriptor and window bytes
    lying = bomb[:6] + COUNT.to_bytes(4, "little") + bomb[10:]
    stored = _planes_chunk([*RAW[:3], struct.pack("<I", len(lying)), lying, TAIL])
    assert _traced(stored, len(SAMPLE)) < 1 << 20


def test_a_whole_chunk_bomb_is_refused() -> None:
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    assert _traced(b"\x01" + bomb, 4 << 20) < 1 << 20
    lying = bomb[:6] + (4 << 20).to_bytes(4, "little") + bomb[10:]
    assert _traced(b"\x01" + lying, 4 << 20) < 6 << 20


def test_the_bound_is_the_plain_length_plus_27() -> None:
    assert CODEC.max_stored(0) == 27
    assert CODEC.max_stored(1 << 26) == (1 << 26) + 27
    # Width 8 with every plane compressed: 3 + 8 * 4 bytes of lengths and header.
    data = bytes(800) + b"abcdefg"
    parts = []
    for plane in planes.split_planes(data, 8):
        frame = _frame_of(plane)
        assert len(frame) < len(plane)
        parts += [struct.pack("<I", len(frame)), frame]
    stored = _planes_chunk([*parts, data[800:]], 8, 0xFF)
    assert CODEC.decode(stored, len(data)) == data
    assert len(stored) <= CODEC.max_stored(len(data))


# -- the required feature --------------------------------------------------------------------


def test_a_reader_without_the_feature_refuses_at_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w.bin").write_bytes(FILES["weights.bin"])
    dest = tmp_path / "rp.rp"
    restorepoint.pack(tmp_path / "src", str(dest), position=3)
    monkeypatch.setattr(manifest_module, "KNOWN_FEATURES", frozenset({"encryption/1"}))
    with pytest.raises(UnsupportedFormat, match="planes/1"):
        read_head(_Bytes(dest.read_bytes()))  # the gate's read: the head alone
    with pytest.raises(UnsupportedFormat, match="planes/1"):
        restorepoint.check(str(dest), restorepoint.Expectations())
    with pytest.raises(UnsupportedFormat, match="planes/1"):
        restorepoint.verify(str(dest))


def test_an_entry_of_codec_planes_needs_the_feature_in_the_head() -> None:
    parts = Parts.sample(files={})
    parts.entries = [ForgedEntry.from_bytes("w.bin", SAMPLE, codec=CODEC.to_dict())]
    with pytest.raises(MalformedManifest, match="planes/1"):
        read_all(assemble(parts))


def test_the_writer_refuses_codec_planes_without_the_feature() -> None:
    head = describe(position=0)
    with pytest.raises(ValueError, match="planes/1"):
        Writer(io.BytesIO(), head, CODEC)
    Writer(io.BytesIO(), head, ZstdCodec(1))


def test_the_feature_alone_changes_nothing_for_other_codecs(tmp_path: Path) -> None:
    # Declared up front by pack (the head is written before any chunk is probed), it is
    # harmless for a payload that ends up using no planes chunk, or none at all.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "noise.bin").write_bytes(os.urandom(100_000))
    result = restorepoint.pack(tmp_path / "src", str(tmp_path / "rp.rp"), position=0)
    assert result.manifest.required_features == (PLANES_FEATURE,)
    assert result.size < 100_000 + 2000
    payload = restorepoint.verify(str(tmp_path / "rp.rp")).manifest.payload
    assert payload is not None
    assert (
        payload[0].sha256
        == hashlib.sha256((tmp_path / "src" / "noise.bin").read_bytes()).hexdigest()
    )


def test_the_spec_example_decodes() -> None:
    text = (Path(__file__).resolve().parents[2] / "spec" / "restorepoint-v1.md").read_text()
    shown = "`02 04 00` `00 04 08 0c` `01 05 09 0d` `02 06 0a 0e` `03 07 0b 0f` `10 11`"
    assert f"21 bytes {shown}" in " ".join(text.split())
    stored = bytes.fromhex(shown.replace("`", ""))
    assert len(stored) == 21
    assert CODEC.decode(stored, 18) == bytes(range(18))
