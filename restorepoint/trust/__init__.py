"""Trust: signed restore points and encrypted payloads. Leans only on restorepoint.format."""

from __future__ import annotations

from .encryption import FEATURE, SCHEME, StreamCipher, open_file_key, recipients_for
from .keys import (
    PublicKey,
    generate,
    key_id,
    load_identity,
    load_private,
    load_public,
    load_signing_key,
    raw_public,
)
from .policy import NO_TRUST, Trust, trust_policy
from .signing import PAYLOAD_TYPE, SignatureCheck, check_block, pae, signature_block, statement

__all__ = [
    "FEATURE",
    "NO_TRUST",
    "PAYLOAD_TYPE",
    "SCHEME",
    "PublicKey",
    "SignatureCheck",
    "StreamCipher",
    "Trust",
    "check_block",
    "generate",
    "key_id",
    "load_identity",
    "load_private",
    "load_public",
    "load_signing_key",
    "open_file_key",
    "pae",
    "raw_public",
    "recipients_for",
    "signature_block",
    "statement",
    "trust_policy",
]
