"""Signed restore points, through the library on real packs: validity is always checked, trust
as the policy says, and no change to the signature block, no borrowed or forged statement, no
signature made for another payload type is ever accepted. The signature is checked before the
head is believed, and a gate with a signature policy still reads a bounded amount."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import restorepoint
from restorepoint import (
    Expectations,
    IntegrityError,
    MalformedManifest,
    SignatureError,
    Trust,
    UsageError,
)
from restorepoint.format.limits import GATE_PREFIX_MAX
from restorepoint.format.reader import TAIL_READ
from restorepoint.ops import open_head, open_manifest
from restorepoint.testing import Parts, assemble
from restorepoint.trust import PAYLOAD_TYPE, key_id, pae, raw_public, signature_block, statement

from . import (
    CHUNK,
    Bytes,
    digests,
    head_bytes,
    pack,
    regions,
    signature_of,
    with_head,
    with_signature,
)

OTHER_ID = "fedcba9876543210fedcba9876543210"


@pytest.fixture(scope="module")
def signer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def stranger() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def kid(key: Ed25519PrivateKey) -> str:
    return key_id(raw_public(key))


def trusting(*keys: Ed25519PrivateKey, require: bool = False) -> Trust:
    return Trust(trusted=tuple(raw_public(k) for k in keys), require_signature=require)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    (root / "model.pt").write_bytes(os.urandom(3 * CHUNK + 123))
    (root / "sub").mkdir()
    (root / "sub" / "state.json").write_bytes(b'{"step": 7}')
    return root


@pytest.fixture(scope="module")
def signed(
    source: Path, signer: Ed25519PrivateKey, tmp_path_factory: pytest.TempPathFactory
) -> bytes:
    """The bytes of a real restore point signed by ``signer``."""
    dest = tmp_path_factory.mktemp("signed") / "rp.rp"
    pack(source, dest, sign=[signer])
    return dest.read_bytes()


def put(tmp_path: Path, data: bytes, name: str = "rp.rp") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# -- valid, trusted, untrusted, unsigned ----------------------------------------------------


def test_signed_pack_verifies_without_and_with_trust(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    url = put(tmp_path, signed)
    plain = restorepoint.verify(url)
    assert plain.signed_by == (kid(signer),)
    assert plain.trusted_by == ()
    for trust in (trusting(signer), trusting(signer, require=True)):
        report = restorepoint.verify(url, trust=trust)
        assert report.signed_by == (kid(signer),)
        assert report.trusted_by == (kid(signer),)
        assert report.to_dict()["trusted_by"] == [kid(signer)]


def test_the_block_is_what_the_spec_describes(signed: bytes, signer: Ed25519PrivateKey) -> None:
    block = json.loads(signature_of(signed))
    assert set(block) == {"payload_type", "signatures", "statement"}
    assert block["payload_type"] == PAYLOAD_TYPE
    head_sha, index_sha = digests(signed)
    rp_id = json.loads(head_bytes(signed))["id"]
    body = base64.b64decode(block["statement"])
    assert body == statement(rp_id, head_sha, index_sha)
    assert json.loads(body) == {
        "format": "restorepoint/1",
        "head_sha256": head_sha,
        "id": rp_id,
        "index_sha256": index_sha,
    }
    (sig,) = block["signatures"]
    assert sig["keyid"] == kid(signer)
    assert base64.b64decode(sig["public_key"]) == raw_public(signer)
    # Ed25519 is deterministic: the signature is the signer's over the PAE of the statement.
    assert base64.b64decode(sig["sig"]) == signer.sign(pae(PAYLOAD_TYPE, body))


def test_require_signature_without_trusted_keys_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--require-signature needs --trust"):
        Trust(require_signature=True)


@pytest.mark.parametrize("require", [False, True])
def test_signed_by_an_untrusted_key_is_refused(
    tmp_path: Path,
    source: Path,
    signer: Ed25519PrivateKey,
    stranger: Ed25519PrivateKey,
    require: bool,
) -> None:
    url = str(tmp_path / "rp.rp")
    pack(source, Path(url), sign=[stranger])
    with pytest.raises(SignatureError, match=f"not signed by a trusted key.*{kid(stranger)}"):
        restorepoint.verify(url, trust=trusting(signer, require=require))
    # Valid, though: without a policy it verifies, and names its signer.
    assert restorepoint.verify(url).signed_by == (kid(stranger),)


def test_unsigned_with_require_is_refused(
    tmp_path: Path, source: Path, signer: Ed25519PrivateKey
) -> None:
    url = str(tmp_path / "rp.rp")
    pack(source, Path(url))
    with pytest.raises(SignatureError, match="required and the restore point is unsigned"):
        restorepoint.verify(url, trust=trusting(signer, require=True))
    # Trusted keys without --require-signature judge a signature only where there is one.
    report = restorepoint.verify(url, trust=trusting(signer))
    assert report.signed_by == report.trusted_by == ()


def test_two_signers_one_trusted(
    tmp_path: Path, source: Path, signer: Ed25519PrivateKey, stranger: Ed25519PrivateKey
) -> None:
    url = str(tmp_path / "rp.rp")
    pack(source, Path(url), sign=[stranger, signer])
    report = restorepoint.verify(url, trust=trusting(signer, require=True))
    assert report.signed_by == (kid(stranger), kid(signer))
    assert report.trusted_by == (kid(signer),)
    both = restorepoint.verify(url, trust=trusting(signer, stranger))
    assert both.trusted_by == (kid(stranger), kid(signer))


def test_an_empty_signature_list_is_refused(tmp_path: Path, signed: bytes) -> None:
    block = json.loads(signature_of(signed))
    block["signatures"] = []
    empty = json.dumps(block, separators=(",", ":"), sort_keys=True).encode()
    with pytest.raises(SignatureError, match="holds no signature"):
        restorepoint.verify(put(tmp_path, with_signature(signed, empty)))


# -- tampering ------------------------------------------------------------------------------


def test_every_byte_flip_in_the_signature_block_is_refused(
    signed: bytes, signer: Ed25519PrivateKey
) -> None:
    r = regions(signed)
    assert r.signature_length > 200
    policies = [Trust(), trusting(signer, require=True)]
    for pos in range(r.signature_start, r.footer_start):
        for mask in (0x01, 0x80):
            data = bytearray(signed)
            data[pos] ^= mask
            for trust in policies:
                with pytest.raises(IntegrityError) as info:
                    open_manifest(Bytes(bytes(data)), trust, need_key=True)
                # Inside the block, whatever the byte, the signature check is what refuses.
                assert type(info.value) is SignatureError, (pos, mask, str(info.value))


def test_a_block_copied_from_another_restore_point_is_refused(
    tmp_path: Path, source: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    other = tmp_path / "other.rp"
    pack(source, other, position=8, sign=[signer])
    borrowed = with_signature(signed, signature_of(other.read_bytes()))
    url = put(tmp_path, borrowed)
    for trust in (Trust(), trusting(signer, require=True)):
        with pytest.raises(SignatureError, match="names other content"):
            restorepoint.verify(url, trust=trust)
    with pytest.raises(SignatureError, match="names other content"):
        restorepoint.check(url, Expectations(), trust=trusting(signer, require=True))


def test_a_statement_with_another_id_but_the_right_digests_is_refused(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    head_sha, index_sha = digests(signed)
    forged = signature_block(statement(OTHER_ID, head_sha, index_sha), [signer])
    url = put(tmp_path, with_signature(signed, forged))
    for trust in (Trust(), trusting(signer, require=True)):
        with pytest.raises(SignatureError, match="another restore point id") as info:
            restorepoint.verify(url, trust=trust)
        assert info.value.found == OTHER_ID
    with pytest.raises(SignatureError, match="another restore point id"):
        restorepoint.check(url, Expectations(), trust=trusting(signer))


def test_a_statement_in_another_format_is_refused(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    head_sha, index_sha = digests(signed)
    rp_id = json.loads(head_bytes(signed))["id"]
    for body in (
        json.dumps(
            {"format": "restorepoint/2", "head_sha256": head_sha, "id": rp_id,
             "index_sha256": index_sha}, separators=(",", ":"),
        ).encode(),
        json.dumps(
            {"extra": 1, "format": "restorepoint/1", "head_sha256": head_sha, "id": rp_id,
             "index_sha256": index_sha}, separators=(",", ":"),
        ).encode(),
        b'{"format": "restorepoint/1"}',
    ):  # fmt: skip
        url = put(tmp_path, with_signature(signed, signature_block(body, [signer])))
        with pytest.raises(SignatureError):
            restorepoint.verify(url, trust=trusting(signer))


def test_a_signature_made_for_another_payload_type_is_refused(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    block = json.loads(signature_of(signed))
    body = base64.b64decode(block["statement"])
    other_type = "application/vnd.in-toto+json"
    sig = base64.b64encode(signer.sign(pae(other_type, body))).decode()
    block["signatures"][0]["sig"] = sig
    # Under our payload type, the signature (over the other type's PAE) does not verify.
    ours = json.dumps(block, separators=(",", ":"), sort_keys=True).encode()
    url = put(tmp_path, with_signature(signed, ours))
    with pytest.raises(SignatureError, match="does not verify"):
        restorepoint.verify(url)
    # Declared as what it is, the block is refused for its type before any key is tried.
    block["payload_type"] = other_type
    theirs = json.dumps(block, separators=(",", ":"), sort_keys=True).encode()
    url = put(tmp_path, with_signature(signed, theirs))
    with pytest.raises(SignatureError, match="wrong payload type") as info:
        restorepoint.verify(url, trust=trusting(signer, require=True))
    assert info.value.found == other_type


def test_the_signature_is_checked_before_the_head_is_parsed_forged(
    tmp_path: Path, signer: Ed25519PrivateKey
) -> None:
    parts = Parts.sample()
    original = parts.copy()
    original.signers = [signer]
    original_head_sha = digests(assemble(original))[0]
    # A non-canonical head, its digest recomputed: refused as malformed when unsigned...
    parts.head_bytes = json.dumps(parts.head, sort_keys=True).encode()
    with pytest.raises(MalformedManifest):
        restorepoint.verify(put(tmp_path, assemble(parts), "unsigned.rp"))
    # ...but signed over the original head's digest, the signature is what refuses it.
    parts.signer = lambda _head, index: signature_block(
        statement(parts.head["id"], original_head_sha, index), [signer]
    )
    url = put(tmp_path, assemble(parts))
    for trust in (Trust(), trusting(signer, require=True)):
        with pytest.raises(IntegrityError) as info:
            restorepoint.verify(url, trust=trust)
        assert type(info.value) is SignatureError, str(info.value)
    with pytest.raises(IntegrityError) as info:
        restorepoint.check(url, Expectations(), trust=trusting(signer))
    assert type(info.value) is SignatureError
    # The gate without a signature policy reads the head only, and finds it malformed.
    with pytest.raises(MalformedManifest):
        restorepoint.check(url, Expectations())


def test_the_signature_is_checked_before_the_head_is_parsed_surgery(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    head = json.loads(head_bytes(signed))
    reordered = json.dumps(
        dict(reversed(list(head.items()))), separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert reordered != head_bytes(signed)
    data = with_head(signed, reordered)  # the same length: every offset still holds
    with pytest.raises(MalformedManifest):
        restorepoint.verify(put(tmp_path, with_signature(data, b""), "unsigned.rp"))
    url = put(tmp_path, data)
    for trust in (Trust(), trusting(signer, require=True)):
        with pytest.raises(IntegrityError) as info:
            open_manifest(Bytes(data), trust, need_key=True)
        assert type(info.value) is SignatureError
        with pytest.raises(IntegrityError) as info:
            restorepoint.verify(url, trust=trust)
        assert type(info.value) is SignatureError
    with pytest.raises(IntegrityError) as info:
        open_head(Bytes(data), trusting(signer, require=True))
    assert type(info.value) is SignatureError


# -- the gate and import --------------------------------------------------------------------


def test_check_with_a_policy(
    tmp_path: Path, source: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    url = put(tmp_path, signed)
    expect = Expectations(terms={"torch": "2.13.0"})
    assert restorepoint.check(url, expect, trust=trusting(signer, require=True)).compatible
    unsigned = tmp_path / "unsigned.rp"
    pack(source, unsigned)
    with pytest.raises(SignatureError, match="unsigned"):
        restorepoint.check(str(unsigned), expect, trust=trusting(signer, require=True))
    # A broken signature is refused by the gate when it checks signatures at all.
    data = bytearray(signed)
    data[regions(signed).footer_start - 10] ^= 0x01
    url = put(tmp_path, bytes(data), "broken.rp")
    with pytest.raises(SignatureError):
        restorepoint.check(url, expect, trust=trusting(signer))


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_import_of_an_unsigned_one_with_require_writes_nothing(
    tmp_path: Path, source: Path, signer: Ed25519PrivateKey
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    unsigned = tmp_path / "unsigned.rp"
    pack(source, unsigned)
    before = snapshot(work)
    with pytest.raises(SignatureError):
        restorepoint.import_restore_point(
            str(unsigned), work / "dest", trust=trusting(signer, require=True)
        )
    assert snapshot(work) == before == []


def test_import_of_a_signed_one_with_require(
    tmp_path: Path, source: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    url = put(tmp_path, signed)
    result = restorepoint.import_restore_point(
        url, tmp_path / "dest", trust=trusting(signer, require=True)
    )
    assert len(result.files) == 2
    for rel in ("model.pt", "sub/state.json"):
        assert (tmp_path / "dest" / rel).read_bytes() == (source / rel).read_bytes()


def test_import_of_a_tampered_signed_one_writes_nothing(
    tmp_path: Path, signed: bytes, signer: Ed25519PrivateKey
) -> None:
    head_sha, index_sha = digests(signed)
    forged = signature_block(statement(OTHER_ID, head_sha, index_sha), [signer])
    url = put(tmp_path, with_signature(signed, forged))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SignatureError):
        restorepoint.import_restore_point(url, work / "dest")  # validity: no policy needed
    assert snapshot(work) == []


# -- the gate's bounded read over S3 --------------------------------------------------------

LARGE_BYTES = 48 << 20
#: The gate with a signature policy reads the bounded prefix and one tail read, which holds the
#: footer and the signature block (at most 64 KiB + 64 bytes, well inside TAIL_READ).
GATE_WITH_SIGNATURE_MAX = GATE_PREFIX_MAX + TAIL_READ


@dataclass(frozen=True)
class OnS3:
    bucket: str
    options: dict[str, Any]
    signed_key: str
    unsigned_key: str


@pytest.fixture(scope="module")
def on_s3(
    s3_server: Any,
    s3_client: Any,
    signer: Ed25519PrivateKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OnS3]:
    bucket = f"rp-trust-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    source = tmp_path_factory.mktemp("large")
    block = os.urandom(1 << 20)
    with open(source / "weights.bin", "wb") as f:
        for _ in range(LARGE_BYTES >> 20):
            f.write(block)
    options = s3_server.storage_options()
    common: dict[str, Any] = {"position": 9000, "terms": {"cuda": "12.4"}, "level": 0}
    common["storage_options"] = options
    restorepoint.pack(source, f"s3://{bucket}/signed.rp", sign=[signer], **common)
    restorepoint.pack(source, f"s3://{bucket}/unsigned.rp", **common)
    (source / "weights.bin").unlink()
    try:
        yield OnS3(bucket, options, "signed.rp", "unsigned.rp")
    finally:
        for key in ("signed.rp", "unsigned.rp"):
            s3_client.delete_object(Bucket=bucket, Key=key)
        s3_client.delete_bucket(Bucket=bucket)


def counted(s3: OnS3, key: str) -> tuple[Any, Any]:
    # The counting filesystem of the gate's bounded-read test, reused as it is.
    from storage.test_gate_bounded_read import CountingS3FileSystem, Meter

    from restorepoint.storage import S3Location

    fs = CountingS3FileSystem(skip_instance_cache=True, **s3.options)
    fs.meter = Meter()
    return S3Location(f"s3://{s3.bucket}/{key}", fs, f"{s3.bucket}/{key}"), fs.meter


@pytest.mark.s3
def test_gate_with_a_signature_policy_reads_prefix_and_tail_only(
    on_s3: OnS3, signer: Ed25519PrivateKey, s3_client: Any
) -> None:
    size = s3_client.head_object(Bucket=on_s3.bucket, Key=on_s3.signed_key)["ContentLength"]
    assert size > LARGE_BYTES
    location, meter = counted(on_s3, on_s3.signed_key)
    result = restorepoint.check(
        location, Expectations(terms={"cuda": "12.4"}), trust=trusting(signer, require=True)
    )
    print(f"signed gate: {meter.declared} bytes returned in {meter.responses} response(s)")
    assert result.compatible
    assert meter.responses >= 2  # prefix and tail: the signature was read
    assert 0 < meter.read <= meter.declared <= GATE_WITH_SIGNATURE_MAX
    # A refusal by the expectations costs no more.
    meter.reset()
    with pytest.raises(restorepoint.IncompatibleRestorePoint):
        restorepoint.check(
            location, Expectations(terms={"cuda": "11.8"}), trust=trusting(signer, require=True)
        )
    assert 0 < meter.declared <= GATE_WITH_SIGNATURE_MAX


@pytest.mark.s3
def test_gate_with_require_refuses_an_unsigned_one_reading_little(
    on_s3: OnS3, signer: Ed25519PrivateKey, tmp_path: Path
) -> None:
    location, meter = counted(on_s3, on_s3.unsigned_key)
    with pytest.raises(SignatureError, match="unsigned"):
        restorepoint.check(
            location, Expectations(terms={"cuda": "12.4"}), trust=trusting(signer, require=True)
        )
    assert 0 < meter.declared <= GATE_WITH_SIGNATURE_MAX
    meter.reset()
    dest = tmp_path / "restore" / "DEST"
    with pytest.raises(SignatureError, match="unsigned"):
        restorepoint.import_restore_point(location, dest, trust=trusting(signer, require=True))
    assert 0 < meter.declared <= GATE_WITH_SIGNATURE_MAX
    assert list(tmp_path.iterdir()) == []
