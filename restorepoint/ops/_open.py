"""Opening a restore point for reading, with the trust policy applied in the right order.

Signatures are checked before anything the manifest says is trusted: the prefix and the tail
are read and their digests checked, the signature block is verified against those digests, and
only then are the head and the index parsed. An encrypted payload's file key is unwrapped before
any payload byte is read (and before an import writes anything)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DecryptionError, SignatureError
from ..format import (
    Head,
    Manifest,
    RangeSource,
    Tail,
    parse_head,
    parse_index,
    read_index,
    read_prefix,
    read_tail,
)
from ..trust import NO_TRUST, SignatureCheck, Trust, check_block

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from ..trust import StreamCipher

__all__ = ["NO_TRUST", "Opened", "Trust", "open_head", "open_manifest"]


@dataclass(frozen=True)
class Opened:
    head: Head
    manifest: Manifest | None
    tail: Tail | None
    signature: SignatureCheck | None
    cipher: StreamCipher | None


def _signature(tail: Tail, head_sha256: str, trust: Trust) -> SignatureCheck:
    return check_block(
        tail.signature,
        head_sha256=head_sha256,
        index_sha256=tail.index_sha256,
        trusted=trust.trusted,
        require=trust.require_signature,
    )


def _same_id(check: SignatureCheck | None, head: Head) -> None:
    if check is not None and check.rp_id is not None and check.rp_id != head.manifest.id:
        raise SignatureError(
            "the signed statement names another restore point id",
            expected=head.manifest.id,
            found=check.rp_id,
        )


def open_head(reader: RangeSource, trust: Trust = NO_TRUST) -> Opened:
    """The head, for the gate. Reads the bounded prefix; with a trust policy that checks
    signatures, also the footer and the signature block (still bounded: no index, no payload),
    and verifies them before the head is parsed."""
    prefix = read_prefix(reader)
    tail = check = None
    if trust.checks_signatures:
        tail = read_tail(reader, prefix.data_start)
        check = _signature(tail, prefix.head_sha256, trust)
    head = parse_head(prefix)
    _same_id(check, head)
    return Opened(head, None, tail, check, None)


def open_manifest(
    reader: RangeSource,
    trust: Trust = NO_TRUST,
    *,
    need_key: bool,
    gated: Opened | None = None,
) -> Opened:
    """Head and index, every signature present checked (validity always; trust as the policy
    says) before either is parsed; with ``need_key``, the payload's file key unwrapped.

    ``gated``: what ``open_head`` read for the gate. Its head is used as it is, never read
    again: on a store read by name, the object may be replaced between two reads, and a head
    read a second time is not the head the gate decided on. The index must then name that
    head (``head_sha256``, R8) and a signature sign it, so nothing of another object passes."""
    if gated is None:
        prefix = read_prefix(reader)
        data_start, head_sha256 = prefix.data_start, prefix.head_sha256
    else:
        data_start, head_sha256 = gated.head.data_start, gated.head.head_sha256
    tail = gated.tail if gated is not None and gated.tail is not None else None
    tail = tail or read_tail(reader, data_start)
    index_bytes = read_index(reader, tail)
    check = _signature(tail, head_sha256, trust)
    head = parse_head(prefix) if gated is None else gated.head
    _same_id(check, head)
    manifest = parse_index(head, tail, index_bytes)
    cipher = None
    if need_key and manifest.encryption is not None:
        cipher = cipher_for(manifest, trust.identity)
    return Opened(head, manifest, tail, check, cipher)


def cipher_for(manifest: Manifest, identity: X25519PrivateKey | None) -> StreamCipher:
    if identity is None:
        raise DecryptionError("the payload is encrypted: give the recipient's key (--identity KEY)")
    assert manifest.encryption is not None
    from ..trust import StreamCipher, open_file_key  # cryptography: only for an encrypted payload

    encryption: dict[str, Any] = dict(manifest.encryption)
    return StreamCipher(open_file_key(encryption, identity), manifest.id)
