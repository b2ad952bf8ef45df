"""Signed restore points (spec section "Signing").

The signature block lies between the index and the footer. It carries a **statement**, the
exact bytes that were signed: canonical JSON naming the format, the restore-point id, and the
sha256 of the head and of the index; the index in turn holds every payload digest and the head's
digest, so one signature covers the whole manifest. The bytes signed are DSSE's
pre-authentication encoding of the payload type and the statement, so a signature made for
anything else (another payload type, another kind of document) can never verify here.

Each signature names its key by id (a hint) and carries the raw public key, so that corruption
of a signature is detected by anyone; trust is a separate question: whether that public key is
one the verifier trusts.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import MalformedManifest, SignatureError
from ..format import canonical_dumps, strict_loads
from ..format.statement import STATEMENT_FORMAT, statement

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# cryptography (25 ms to import) is loaded where a signature is made or checked, not by a
# reader of an unsigned restore point.

__all__ = [
    "PAYLOAD_TYPE",
    "SignatureCheck",
    "check_block",
    "pae",
    "signature_block",
    "statement",
]

#: The payload type: names the document and the format version it belongs to.
PAYLOAD_TYPE = "application/vnd.restorepoint.statement+json;version=1"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def signature_block(body: bytes, signers: Iterable[Ed25519PrivateKey]) -> bytes:
    """The signature block for a statement, signed by every key in ``signers``."""
    from .keys import key_id, raw_public

    message = pae(PAYLOAD_TYPE, body)
    signatures = []
    for key in signers:
        raw = raw_public(key)
        signatures.append(
            {
                "keyid": key_id(raw),
                "public_key": base64.b64encode(raw).decode(),
                "sig": base64.b64encode(key.sign(message)).decode(),
            }
        )
    return canonical_dumps(
        {
            "payload_type": PAYLOAD_TYPE,
            "signatures": signatures,
            "statement": base64.b64encode(body).decode(),
        }
    )


@dataclass(frozen=True)
class SignatureCheck:
    """What a signature block proved: which keys signed (all valid), which of them are trusted."""

    signed_by: tuple[str, ...]
    trusted_by: tuple[str, ...]
    rp_id: str | None = None  # the id the statement names

    @property
    def signed(self) -> bool:
        return bool(self.signed_by)


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise SignatureError(f"signature block: {what} must be base64")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"signature block: {what} is not valid base64") from None
    # Padding bits must be zero (RFC 4648 3.5): otherwise two spellings decode alike, and a
    # changed byte of the block would go unnoticed (nothing else covers the block's bytes).
    if base64.b64encode(data).decode() != value:
        raise SignatureError(f"signature block: {what} is not canonical base64")
    return data


def check_block(  # noqa: PLR0912 - one branch per signature-block rule of spec section 21
    block: bytes | None,
    *,
    head_sha256: str,
    index_sha256: str,
    trusted: Iterable[bytes] = (),
    require: bool = False,
) -> SignatureCheck:
    """Check a signature block against the object it was found in, before anything else of
    the manifest is trusted. Every signature must be valid for its public key and the statement
    must name exactly this object (its head and index digests; the caller compares the id once
    the head is parsed); with ``trusted`` keys, at least one must have signed; with ``require``,
    an unsigned object is refused. Raises SignatureError (exit 1)."""
    trusted_set = set(trusted)
    if block is None:
        if require:
            raise SignatureError("a signature is required and the restore point is unsigned")
        return SignatureCheck((), (), None)
    try:
        doc = strict_loads(block, "signature block")
    except MalformedManifest as exc:
        raise SignatureError(exc.message) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("signatures"), list):
        raise SignatureError("signature block: not an object with signatures")
    if doc.get("payload_type") != PAYLOAD_TYPE:
        raise SignatureError(
            f"signature block: wrong payload type {doc.get('payload_type')!r}",
            expected=PAYLOAD_TYPE,
            found=doc.get("payload_type"),
        )
    body = _b64(doc.get("statement"), "statement")
    message = pae(PAYLOAD_TYPE, body)
    signed: list[str] = []
    trusted_by: list[str] = []
    if not doc["signatures"]:
        raise SignatureError("signature block holds no signature")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .keys import key_id

    for i, item in enumerate(doc["signatures"]):
        if not isinstance(item, dict):
            raise SignatureError(f"signature {i}: not an object")
        raw = _b64(item.get("public_key"), f"signature {i} public_key")
        sig = _b64(item.get("sig"), f"signature {i} sig")
        if len(raw) != 32:
            raise SignatureError(f"signature {i}: not an Ed25519 public key")
        # Only a hint, but one that must be right: no byte of the block may change unnoticed.
        if item.get("keyid") != key_id(raw):
            raise SignatureError(
                f"signature {i}: keyid is not that of its public key",
                expected=key_id(raw),
                found=item.get("keyid"),
            )
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(sig, message)
        except InvalidSignature:
            raise SignatureError(
                f"signature {i} (key {key_id(raw)}) does not verify", found=key_id(raw)
            ) from None
        signed.append(key_id(raw))
        if raw in trusted_set:
            trusted_by.append(key_id(raw))
    # Only now, with the signatures valid, is the statement read: it must name this object.
    try:
        stmt = strict_loads(body, "statement")
    except MalformedManifest as exc:
        raise SignatureError(exc.message) from None
    expected = {
        "format": STATEMENT_FORMAT,
        "head_sha256": head_sha256,
        "id": stmt.get("id") if isinstance(stmt, dict) else None,
        "index_sha256": index_sha256,
    }
    if stmt != expected or not isinstance(stmt.get("id"), str):
        raise SignatureError(
            "the signed statement names other content than this restore point",
            expected=expected,
            found=stmt,
        )
    if (trusted_set or require) and not trusted_by:
        raise SignatureError(
            f"not signed by a trusted key (signed by {', '.join(signed)})", found=signed
        )
    return SignatureCheck(tuple(signed), tuple(trusted_by), stmt["id"])
