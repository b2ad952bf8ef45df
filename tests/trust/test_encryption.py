"""Encrypted payloads: every recipient opens them, nobody else does, the head stays readable
for the gate, the ciphertext hides the plaintext, and every attack on the chunk stream (built so
that only the AEAD can catch it, or where the layout catches it first, named as such) is
refused before a byte reaches DEST. Decryption streams in bounded memory."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import restorepoint
from restorepoint import (
    DecryptionError,
    Expectations,
    FramingError,
    IntegrityError,
    Trust,
    UnsupportedFormat,
    UsageError,
)
from restorepoint.format import manifest as manifest_module
from restorepoint.testing import Parts, assemble
from restorepoint.testing.forge import ForgedEntry, encrypt
from restorepoint.trust import FEATURE, SCHEME, PublicKey, key_id, raw_public

from . import CHUNK, pack

MARKER = b"restorepoint plaintext marker: if you can read this, it leaked!!"
assert len(MARKER) == 64
FILE_KEY = bytes(range(32))


def public(key: X25519PrivateKey) -> PublicKey:
    return PublicKey("encryption", raw_public(key))


@pytest.fixture(scope="module")
def alice() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


@pytest.fixture(scope="module")
def bob() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


@pytest.fixture(scope="module")
def carol() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def opener(key: X25519PrivateKey | None) -> Trust:
    return Trust(identity=key)


def rnd(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    # Uncompressible, with the marker in the middle of a chunk: store-only and zstd alike
    # would show it in the clear without encryption.
    (root / "model.pt").write_bytes(rnd(CHUNK + 1000, 1) + MARKER * 4 + rnd(2 * CHUNK, 2))
    (root / "sub").mkdir()
    (root / "sub" / "state.json").write_bytes(b'{"step": 7, "marker": "' + MARKER + b'"}')
    (root / "empty.bin").write_bytes(b"")
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- recipients -----------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1])
def test_one_recipient_verifies_and_imports(
    tmp_path: Path, source: Path, alice: X25519PrivateKey, level: int
) -> None:
    url = tmp_path / "rp.rp"
    pack(source, url, encrypt_to=[public(alice)], level=level)
    report = restorepoint.verify(str(url), trust=opener(alice))
    assert report.to_dict()["encrypted"] is True
    assert report.bytes == sum(len(v) for v in tree(source).values())
    restorepoint.import_restore_point(str(url), tmp_path / "dest", trust=opener(alice))
    assert tree(tmp_path / "dest") == tree(source)


def test_two_recipients_each_open_it(
    tmp_path: Path, source: Path, alice: X25519PrivateKey, bob: X25519PrivateKey
) -> None:
    url = tmp_path / "rp.rp"
    result = pack(source, url, encrypt_to=[public(alice), public(bob)])
    stanzas = result.manifest.encryption["recipients"]  # type: ignore[index]
    assert [s["keyid"] for s in stanzas] == [public(alice).key_id, public(bob).key_id]
    assert len({s["ephemeral"] for s in stanzas}) == 2  # an ephemeral key each
    for name, key in (("alice", alice), ("bob", bob)):
        restorepoint.verify(str(url), trust=opener(key))
        restorepoint.import_restore_point(str(url), tmp_path / name, trust=opener(key))
        assert tree(tmp_path / name) == tree(source)


def test_a_key_id_is_only_a_hint(tmp_path: Path, alice: X25519PrivateKey) -> None:
    # A stanza whose key id names someone else is still tried: the AEAD decides.
    parts = Parts.sample()
    encrypt(parts, [public(alice)])
    parts.head["encryption"]["recipients"][0]["keyid"] = "0" * 16
    url = tmp_path / "rp.rp"
    url.write_bytes(assemble(parts))
    assert restorepoint.verify(str(url), trust=opener(alice)).files == 3


def test_a_third_key_is_refused_and_nothing_is_written(
    tmp_path: Path,
    source: Path,
    alice: X25519PrivateKey,
    bob: X25519PrivateKey,
    carol: X25519PrivateKey,
) -> None:
    url = tmp_path / "rp.rp"
    pack(source, url, encrypt_to=[public(alice), public(bob)])
    with pytest.raises(DecryptionError, match=f"key {public(carol).key_id}.*not a recipient"):
        restorepoint.verify(str(url), trust=opener(carol))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(DecryptionError, match="not a recipient"):
        restorepoint.import_restore_point(str(url), work / "dest", trust=opener(carol))
    assert snapshot(work) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rp.rp", "work"]


def test_no_identity_is_refused_and_nothing_is_written(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    url = tmp_path / "rp.rp"
    pack(source, url, encrypt_to=[public(alice)])
    with pytest.raises(DecryptionError, match="--identity"):
        restorepoint.verify(str(url))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(DecryptionError, match="--identity"):
        restorepoint.import_restore_point(str(url), work / "dest")
    assert snapshot(work) == []


def test_an_identity_for_an_unencrypted_one_is_harmless(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    url = tmp_path / "rp.rp"
    pack(source, url)
    assert restorepoint.verify(str(url), trust=opener(alice)).to_dict()["encrypted"] is False


def test_encrypting_to_a_signing_key_is_a_usage_error(tmp_path: Path, source: Path) -> None:
    with pytest.raises(UsageError, match="X25519"):
        pack(source, tmp_path / "rp.rp", encrypt_to=[PublicKey("signing", b"\x01" * 32)])
    assert list(tmp_path.iterdir()) == []


# -- what stays readable, what does not -----------------------------------------------------


def test_the_head_stays_readable_without_a_key(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    url = str(tmp_path / "rp.rp")
    pack(source, Path(url), encrypt_to=[public(alice)], level=0)
    head = restorepoint.read_manifest(url, head_only=True)
    assert head.payload is None
    assert head.position.step == 7
    assert FEATURE == "encryption/1"
    assert "encryption/1" in head.required_features
    assert head.encryption is not None
    assert head.encryption["scheme"] == SCHEME == "x25519-hkdf-aes256gcm-stream/1"
    (stanza,) = head.encryption["recipients"]
    assert stanza["type"] == "X25519"
    assert stanza["keyid"] == key_id(raw_public(alice))
    assert len(base64.b64decode(stanza["ephemeral"])) == 32
    assert len(base64.b64decode(stanza["wrapped_key"])) == 32 + 16
    # The gate needs no key, and neither does the index (paths, sizes, digests).
    assert restorepoint.check(url, Expectations(terms={"torch": "2.13.0"})).compatible
    full = restorepoint.read_manifest(url)
    assert full.payload is not None
    assert [e.path for e in full.payload] == ["empty.bin", "model.pt", "sub/state.json"]
    # Each chunk carries a 16-byte tag: model.pt's four store-only chunks take 4 * (4 + 16) more.
    model = next(e for e in full.payload if e.path == "model.pt")
    assert model.stored_size == model.size + 4 * (4 + 16)


def test_the_ciphertext_does_not_contain_the_plaintext(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    clear = tmp_path / "clear.rp"
    pack(source, clear, level=0)
    assert MARKER in clear.read_bytes()  # the control: the marker is there to be found
    for level in (0, 1):
        sealed = tmp_path / f"sealed-{level}.rp"
        pack(source, sealed, encrypt_to=[public(alice)], level=level)
        data = sealed.read_bytes()
        assert MARKER not in data
        assert MARKER[:16] not in data
        assert b"marker" not in data


def test_each_restore_point_gets_its_own_file_key(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    first, second = tmp_path / "1.rp", tmp_path / "2.rp"
    pack(source, first, encrypt_to=[public(alice)], level=0)
    pack(source, second, encrypt_to=[public(alice)], level=0)
    a, b = restorepoint.read_manifest(str(first)), restorepoint.read_manifest(str(second))
    assert a.encryption != b.encryption
    ra, rb = a.payload[1], b.payload[1]  # type: ignore[index]
    assert (
        first.read_bytes()[ra.offset : ra.offset + 200]
        != (second.read_bytes()[rb.offset : rb.offset + 200])
    )


def test_an_old_reader_without_the_feature_refuses(
    tmp_path: Path, source: Path, alice: X25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "rp.rp")
    pack(source, Path(url), encrypt_to=[public(alice)])
    monkeypatch.setattr(manifest_module, "KNOWN_FEATURES", frozenset())
    for read in (
        lambda: restorepoint.verify(url, trust=opener(alice)),
        lambda: restorepoint.read_manifest(url, head_only=True),
        lambda: restorepoint.check(url, Expectations(terms={"torch": "2.13.0"})),
    ):
        with pytest.raises(IntegrityError) as info:
            read()
        assert type(info.value) is UnsupportedFormat
        assert "encryption/1" in str(info.value)


# -- stream attacks, forged -----------------------------------------------------------------

FILES = {
    "a.bin": rnd(2 * CHUNK, 3),
    "stream.bin": rnd(3 * CHUNK + 100, 4),
    "z.txt": b"the last entry\n",
}


def forged(
    key: X25519PrivateKey,
    *,
    final: Callable[[int, int, int], bool] | None = None,
    rp_id: str = "0123456789abcdef0123456789abcdef",
) -> Parts:
    """The forge's sample with FILES, store-only, encrypted to ``key`` with a fixed file key."""
    parts = Parts.sample(files=dict(FILES), id=rp_id)
    encrypt(parts, [public(key)], file_key=FILE_KEY, final=final)
    return parts


def entry(parts: Parts, path: str) -> ForgedEntry:
    return next(e for e in parts.entries if e.path == path)


def refused(
    tmp_path: Path, parts: Parts | bytes, key: X25519PrivateKey, cls: type[IntegrityError]
) -> IntegrityError:
    """Verify and import must both refuse with exactly ``cls``; DEST stays absent."""
    data = parts if isinstance(parts, bytes) else assemble(parts)
    url = tmp_path / "attacked.rp"
    url.write_bytes(data)
    with pytest.raises(IntegrityError) as info:
        restorepoint.verify(str(url), trust=opener(key))
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    with pytest.raises(IntegrityError) as imported:
        restorepoint.import_restore_point(str(url), work / "dest", trust=opener(key))
    assert type(imported.value) is cls
    assert snapshot(work) == []
    return info.value


def test_the_forged_stream_is_sound(tmp_path: Path, alice: X25519PrivateKey) -> None:
    # The control for every attack below: untouched, the forged object verifies and imports.
    url = tmp_path / "rp.rp"
    url.write_bytes(assemble(forged(alice)))
    report = restorepoint.verify(str(url), trust=opener(alice))
    assert report.bytes == sum(len(v) for v in FILES.values())
    restorepoint.import_restore_point(str(url), tmp_path / "dest", trust=opener(alice))
    assert tree(tmp_path / "dest") == FILES


def test_truncated_stream_sizes_adjusted(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    e = entry(parts, "stream.bin")
    e.stored_chunks.pop()
    e.size = 3 * CHUNK
    e.sha256 = hashlib.sha256(FILES["stream.bin"][: 3 * CHUNK]).hexdigest()
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert exc.member == "stream.bin"


def test_truncated_stream_size_kept_is_caught_by_the_framing(
    tmp_path: Path, alice: X25519PrivateKey
) -> None:
    parts = forged(alice)
    entry(parts, "stream.bin").stored_chunks.pop()
    # Four chunks declared, three framed: the frame reader runs out before the AEAD is asked.
    exc = refused(tmp_path, parts, alice, FramingError)
    assert exc.member == "stream.bin"


def test_missing_final_chunk(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice, final=lambda _entry, _index, _count: False)
    exc = refused(tmp_path, parts, alice, DecryptionError)
    # a.bin comes first and its last chunk is not final either.
    assert (exc.member, "chunk 1 " in str(exc)) == ("a.bin", True)
    parts = forged(alice, final=lambda position, i, n: i == n - 1 and position != 1)
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 3 " in str(exc)) == ("stream.bin", True)


def test_two_final_chunks(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice, final=lambda position, i, n: i == n - 1 or (position, i) == (1, 1))
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 1 " in str(exc)) == ("stream.bin", True)


def test_reordered_chunks(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    chunks = entry(parts, "stream.bin").stored_chunks
    chunks[0], chunks[1] = chunks[1], chunks[0]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 0 " in str(exc)) == ("stream.bin", True)


def test_duplicated_chunk_in_place_of_another(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    chunks = entry(parts, "stream.bin").stored_chunks
    chunks[2] = chunks[1]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 2 " in str(exc)) == ("stream.bin", True)


def test_duplicated_chunk_inserted(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    e = entry(parts, "stream.bin")
    e.stored_chunks.insert(1, e.stored_chunks[0])
    # The size kept: five frames for four chunks cannot fit the entry's bounds (layout).
    refused(tmp_path, parts, alice, FramingError)
    # The size grown by a chunk (and the digest made to match): only the AEAD can tell.
    e.size += CHUNK
    plain = FILES["stream.bin"]
    e.sha256 = hashlib.sha256(plain[:CHUNK] + plain).hexdigest()
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert exc.member == "stream.bin"


def test_chunk_spliced_from_another_file(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    entry(parts, "stream.bin").stored_chunks[1] = entry(parts, "a.bin").stored_chunks[1]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 1 " in str(exc)) == ("stream.bin", True)


def test_chunk_spliced_from_another_restore_point(tmp_path: Path, alice: X25519PrivateKey) -> None:
    # The worst case: the same recipient, the same file key, path, position and size; only
    # the restore point's id differs, and the AEAD's associated data binds it.
    other = forged(alice, rp_id="fedcba9876543210fedcba9876543210")
    parts = forged(alice)
    entry(parts, "stream.bin").stored_chunks[2] = entry(other, "stream.bin").stored_chunks[2]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 2 " in str(exc)) == ("stream.bin", True)


def test_restore_point_relabelled_with_another_id(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    parts.head["id"] = "fedcba9876543210fedcba9876543210"  # head and index both
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert exc.member == "a.bin"


def test_wrapped_key_of_another_restore_point(tmp_path: Path, alice: X25519PrivateKey) -> None:
    # Alice can open the other stanza, but it holds another file key: no chunk opens with it.
    other = Parts.sample(files=dict(FILES))
    encrypt(other, [public(alice)], file_key=bytes(32))
    parts = forged(alice)
    parts.head["encryption"] = other.head["encryption"]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert (exc.member, "chunk 0 " in str(exc)) == ("a.bin", True)


def test_flipped_ciphertext_byte(tmp_path: Path, alice: X25519PrivateKey) -> None:
    for chunk, at in ((0, 0), (2, 1000), (3, -1), (3, 50)):  # the tag, too
        parts = forged(alice)
        chunks = entry(parts, "stream.bin").stored_chunks
        sealed = bytearray(chunks[chunk])
        sealed[at] ^= 0x01
        chunks[chunk] = bytes(sealed)
        exc = refused(tmp_path, parts, alice, DecryptionError)
        assert (exc.member, f"chunk {chunk} " in str(exc)) == ("stream.bin", True)


def test_chunk_cut_below_the_tag(tmp_path: Path, alice: X25519PrivateKey) -> None:
    parts = forged(alice)
    chunks = entry(parts, "z.txt").stored_chunks
    chunks[0] = chunks[0][:5]  # shorter than a tag: nothing to authenticate with
    exc = refused(tmp_path, parts, alice, DecryptionError)
    assert exc.member == "z.txt"


@pytest.mark.parametrize("dropped", ["a.bin", "z.txt"])
def test_dropped_entry(tmp_path: Path, alice: X25519PrivateKey, dropped: str) -> None:
    parts = forged(alice)
    parts.entries = [e for e in parts.entries if e.path != dropped]
    exc = refused(tmp_path, parts, alice, DecryptionError)
    # Every later entry moved, and every earlier one belongs to a payload of three entries.
    assert (exc.member, "chunk 0 " in str(exc)) == (parts.entries[0].path, True)


def test_payload_without_encryption_in_the_head_is_not_decrypted(
    tmp_path: Path, alice: X25519PrivateKey
) -> None:
    # Stripping the head's encryption leaves sealed chunks to be read as plain: each one is 16
    # bytes longer than its plain size, which the layout of a store-only entry rules out.
    parts = forged(alice)
    parts.head["encryption"] = None
    parts.head["required_features"] = []
    refused(tmp_path, parts, alice, FramingError)


# -- stream attacks by surgery on real objects ----------------------------------------------


def frames(data: bytes, offset: int, stored_size: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk frame (header included) of an entry's region."""
    out = []
    pos = offset
    while pos < offset + stored_size:
        n = int.from_bytes(data[pos : pos + 4], "little")
        out.append((pos, pos + 4 + n))
        pos += 4 + n
    assert pos == offset + stored_size
    return out


def model_frames(url: Path) -> list[tuple[int, int]]:
    manifest = restorepoint.read_manifest(str(url))
    e = next(e for e in manifest.payload or [] if e.path == "model.pt")
    return frames(url.read_bytes(), e.offset, e.stored_size)


def test_surgery_reordered_frames(tmp_path: Path, source: Path, alice: X25519PrivateKey) -> None:
    url = tmp_path / "real.rp"
    pack(source, url, encrypt_to=[public(alice)], level=0)
    data = url.read_bytes()
    (a0, a1), (b0, b1) = model_frames(url)[:2]
    assert a1 - a0 == b1 - b0  # two full chunks: swapping them moves no offset
    swapped = data[:a0] + data[b0:b1] + data[a0:a1] + data[b1:]
    exc = refused(tmp_path, swapped, alice, DecryptionError)
    assert (exc.member, "chunk 0 " in str(exc)) == ("model.pt", True)


def test_surgery_frame_from_another_restore_point(
    tmp_path: Path, source: Path, alice: X25519PrivateKey
) -> None:
    first, second = tmp_path / "1.rp", tmp_path / "2.rp"
    pack(source, first, encrypt_to=[public(alice)], level=0)
    pack(source, second, encrypt_to=[public(alice)], level=0)
    s0, s1 = model_frames(first)[1]
    o0, o1 = model_frames(second)[1]
    assert (s0, s1) == (o0, o1)
    data = first.read_bytes()
    spliced = data[:s0] + second.read_bytes()[o0:o1] + data[s1:]
    exc = refused(tmp_path, spliced, alice, DecryptionError)
    assert (exc.member, "chunk 1 " in str(exc)) == ("model.pt", True)


def test_surgery_flipped_byte(tmp_path: Path, source: Path, alice: X25519PrivateKey) -> None:
    url = tmp_path / "real.rp"
    pack(source, url, encrypt_to=[public(alice)])
    start, end = model_frames(url)[-1]
    data = bytearray(url.read_bytes())
    data[(start + end) // 2] ^= 0x40
    exc = refused(tmp_path, bytes(data), alice, DecryptionError)
    assert exc.member == "model.pt"


# -- bounded memory -------------------------------------------------------------------------

LARGE = 100 << 20
LARGE_CHUNK = 1 << 20


def test_decrypting_a_large_restore_point_stays_in_bounded_memory(
    tmp_path: Path, alice: X25519PrivateKey
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    block = os.urandom(1 << 20)
    with open(src / "weights.bin", "wb") as f:
        for _ in range(LARGE >> 20):
            f.write(block)
    url = tmp_path / "large.rp"
    restorepoint.pack(
        src, str(url), position=1, level=0, chunk_size=LARGE_CHUNK, threads=2,
        encrypt_to=[public(alice)],
    )  # fmt: skip
    (src / "weights.bin").unlink()
    tracemalloc.start()
    try:
        report = restorepoint.verify(str(url), trust=opener(alice), threads=2)
        verify_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        restorepoint.import_restore_point(
            str(url), tmp_path / "dest", trust=opener(alice), threads=2
        )
        import_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"peak: verify {verify_peak >> 20} MiB, import {import_peak >> 20} MiB")
    assert report.bytes == LARGE
    assert (tmp_path / "dest" / "weights.bin").stat().st_size == LARGE
    # A handful of chunks in flight, never the payload: 2 * threads chunks, plus buffers.
    assert verify_peak < LARGE // 6
    assert import_peak < LARGE // 6
